// run_locked: a command run under a Redis lock, as `jobguard run` does it —
// acquire (fail-closed), an optional completion record that makes the run
// happen once, the renewing lease, CMD under job::Supervisor, the record
// written before the release, the release. The CLI only parses flags and maps
// the result to an exit status.
//
// Threads: call from any thread that is not the Redis client's loop; blocks
// until CMD has ended and the lock is released. It runs its own io_context on
// the calling thread for CMD; events are emitted on the calling thread.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jobguard/guard/completion.hpp"
#include "jobguard/job/supervisor.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/event_log.hpp"

namespace jobguard::redis {
class Client;
}

namespace jobguard::job {

struct LockedRunOptions {
  std::string resource;  // the business object; validated by LockService
  // More resources to hold with `resource`, all or none (<jobguard/multilock.hpp>):
  // one lease renews them all and losing any stops CMD. CMD then gets
  // JOBGUARD_RESOURCES, JOBGUARD_KEYS, JOBGUARD_TOKENS (and JOBGUARD_FENCES
  // with a fence): space-separated, one word per resource in canonical order,
  // instead of JOBGUARD_KEY / JOBGUARD_TOKEN / JOBGUARD_FENCE. Not with permits,
  // fair or once (Error(invalid_argument)).
  std::vector<std::string> more_resources;
  LockOptions lock;      // ttl, wait, fence, fair, job_id, lock_class
  // CMD and how it is supervised. JOBGUARD_KEY, JOBGUARD_TOKEN (and
  // JOBGUARD_FENCE with a fence; JOBGUARD_PERMITS and JOBGUARD_PERMIT_SLOT for
  // a semaphore permit; JOBGUARD_LOCK_MODE for a read-write lock) are added
  // to `env`; `lease` is set here.
  SupervisorOptions cmd;
  // Run once per (resource, run_id): checked before and under the lock,
  // recorded (kind "run") when CMD exits 0 on its own. Null: no record.
  guard::CompletionStore* once = nullptr;
  std::string run_id;
};

// One log event (the names are the documented `jobguard run` events:
// acquired, busy, renewed, lost, timeout, stopped, continued, signal,
// released, skipped, error). `problem` marks the ones worth showing by default.
struct RunEvent {
  std::string_view event;
  std::string_view outcome;
  std::optional<double> elapsed_ms;  // see `jobguard run --help`
  bool problem = false;
  std::string message;  // one line for a human
  std::vector<std::pair<std::string, observe::FieldValue>> extra;
};

struct LockedRunResult {
  enum class Status { ran, busy, skipped } status = Status::ran;
  CmdOutcome outcome;    // ran: how CMD ended
  bool lost = false;  // ran: the lease was lost (or its safe time ran out) while CMD ran
  // ran: CMD exited 0 but its completion record could not be written (a rerun repeats it),
  // or, with record_error in_doubt, the write's outcome is unknown.
  bool record_failed = false;
  Error record_error{};  // record_failed: why

};

// Throws jobguard::Error: redis_unavailable when Redis fails before CMD runs
// (CMD not run: fail-closed), the store's errors while reading a record, and
// invalid_argument for a bad resource.
LockedRunResult run_locked(redis::Client& client, const KeyBuilder& keys, LockedRunOptions opts,
                           const std::function<void(RunEvent)>& on_event);

}  // namespace jobguard::job
