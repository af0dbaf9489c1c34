// job::StreamWorker: the one loop that takes jobs from a Redis Stream
// (job::StreamSource), runs each through a GuardedRunner and its effect, and
// turns the run's one outcome into one action on the job's message:
//
//   completed, already_done            -> ack
//   failed (the effect threw, CMD      -> fail: stays pending and comes back after
//     exited non-zero)                    claim_idle; dead-lettered at max_attempts
//   busy, lease_lost, timed_out,       -> leave_pending: another delivery will
//     stale, the effect left it           finish it (each delivery counts)
//   redis_unavailable,                 -> retry_later: stays pending, and this
//     postgres_unavailable                worker pauses before its next job
//   a job no run can succeed on        -> dead_letter at once
//     (no unit id, a malformed one)
//
//   auto worker = job::StreamWorker(client, {.stream = "billing"}, runner,
//       job::AsyncJobEffect(job::run_command({.argv = {"./charge.sh"}})),
//       {.concurrency = 64, .log = &log});
//   worker.run();   // until stop(), max_jobs or exit_when_idle
//
// Concurrency: up to `concurrency` jobs are in flight at once, as coroutines
// on the Redis client's event loop — no thread per job. An AsyncJobEffect
// (a supervised process is one) runs there too; a blocking JobEffect runs on
// a thread pool of the worker's (one thread per job slot), and so do stores
// without an asynchronous form (PostgreSQL). A slow job holds only its own
// slot: renewals, acks and the other jobs go on. An AsyncJobEffect's slot is
// free once the effect returns: the next job's claim goes out with this
// job's finish, so at most `concurrency` effects run at once while finishes
// and acknowledgements are still on their way. New jobs are read with a
// blocking XREADGROUP on a second connection of the worker's own, so a read
// never stalls the commands of the jobs in flight.
//
// Threads: construct and destroy off the client's event-loop thread; run()
// blocks its caller until the worker stops; stop() is safe from any thread
// (a signal handler's thread included); the on_job callback and the log run
// on the event loop. The client, the runner and the log must outlive the worker.
#pragma once

#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jobguard/job/limits.hpp"
#include "jobguard/job/runner.hpp"
#include "jobguard/job/stream_source.hpp"

namespace jobguard::redis {
class Client;
}
namespace jobguard::observe {
class EventLog;
}

namespace jobguard::job {

// What the worker does with a job's message after its run.
enum class Action {
  ack,            // XACK: the job is done
  fail,           // a failed attempt: pending until claim_idle, dead-lettered at max_attempts
  leave_pending,  // not finished here: pending until another delivery (counts as one)
  retry_later,    // a backend is down: pending, and this worker backs off before its next job
  dead_letter,    // can never succeed as it is: moved to the dead-letter stream now
};
std::string_view to_string(Action a) noexcept;

struct Decision {
  Action action = Action::fail;
  std::string reason{};  // one line; the run's detail (empty for a plain ack)
};

// The table above, as a pure function. `left_pending`: the effect asked for
// its job to be left pending (WorkItem::leave_pending), whatever the outcome.
Decision decide(const RunResult& r, bool left_pending = false);

// What the effect of one job sees: the job, the runner's context (valid only
// during the effect), and the worker's shutdown.
class WorkItem {
 public:
  const StreamJob& job() const noexcept { return *job_; }
  JobContext& context() const noexcept { return *ctx_; }
  // Requested when the worker is stopping: finish or give up quickly (a
  // supervised CMD gets SIGTERM). `hard` is requested on a second stop:
  // give up now (SIGKILL).
  std::stop_token shutdown() const noexcept { return shutdown_; }
  std::stop_token hard_shutdown() const noexcept { return hard_; }
  // Leave this job pending whatever the run's outcome — as a worker that
  // died would: no ack, no failed attempt recorded. For an effect that was
  // interrupted by the worker's own shutdown, not by the job.
  void leave_pending(std::string why) {
    left_pending_ = true;
    why_ = std::move(why);
  }
  bool left_pending() const noexcept { return left_pending_; }
  const std::string& left_pending_reason() const noexcept { return why_; }

 private:
  friend class StreamWorker;
  WorkItem(const StreamJob& job, std::stop_token shutdown, std::stop_token hard)
      : job_(&job), shutdown_(std::move(shutdown)), hard_(std::move(hard)) {}
  const StreamJob* job_;
  JobContext* ctx_ = nullptr;
  std::stop_token shutdown_, hard_;
  bool left_pending_ = false;
  std::string why_;
};

// Runs on a thread of the worker's pool: may block.
using JobEffect = std::function<std::string(WorkItem&)>;
// Runs on the event loop: must not block.
using AsyncJobEffect = std::function<boost::asio::awaitable<std::string>(WorkItem&)>;

// A supervised process per job (job::Supervisor): CMD in its own process
// group, SIGTERM then SIGKILL after `grace` when the lease is lost, the hard
// timeout passes, a plain lock's safe time runs out, or the worker stops (the
// job is then left pending). CMD's environment gets, added:
//   JOBGUARD_JOB_ID           the stream entry id
//   JOBGUARD_KEY              the Redis key of the lock (empty when fail-open)
//   JOBGUARD_IDEMPOTENCY_KEY  class/resource/run_id: pass it downstream
//   JOBGUARD_FENCE            the fencing token (fenced classes)
//   JOBGUARD_PERMITS, JOBGUARD_PERMIT_SLOT
//                             a class with permits: N (the stored count
//                             when set_permits set one), and this holder's
//                             slot in 0..N-1 (JobContext::permit_slot)
//   JOBGUARD_FIELD_<NAME>     each job field (NAME upper-cased; other than
//                             A-Z and 0-9 -> '_')
// Exit 0: the result is empty; non-zero: the attempt failed with "exit
// status N" (or how it was stopped).
struct CommandOptions {
  std::vector<std::string> argv{};   // required; argv[0] looked up on PATH
  std::chrono::milliseconds grace{10000};
};
AsyncJobEffect run_command(CommandOptions options);
// JOBGUARD_FIELD_<NAME> for a job field.
std::string field_env_name(std::string_view field);

// How one job went, for a caller's own bookkeeping (on_job).
struct JobReport {
  const StreamJob* job = nullptr;
  const Unit* unit = nullptr;  // null when the job had no usable unit
  const RunResult* run = nullptr;
  Decision decision{};
  bool dead_lettered = false;  // the action moved the job to the dead-letter stream
  // The action could not be carried out (Redis went away before the ack):
  // the job stays pending. Empty otherwise.
  std::string action_error{};
  std::chrono::milliseconds elapsed{0};
};

struct WorkerOptions {
  // The consumer name in the group. Default "<host>-<pid>".
  std::string consumer{};
  // Jobs whose claim or effect is in progress at once (a finishing job no
  // longer counts, see Concurrency above). Default 1; must be in [1, 4096].
  int concurrency = 1;
  // The job field holding the unit id (required in every job) and the one
  // holding the run id (default: the stream entry id).
  std::string id_field = "id";
  std::string run_field = "run";
  // Stop after this many jobs left the queue (acknowledged or
  // dead-lettered). Default 0: no limit.
  std::int64_t max_jobs = 0;
  // Stop after this long with no job in flight and none delivered. Default 0: never.
  std::chrono::milliseconds exit_when_idle{0};
  // retry_later's pause: from `retry_backoff`, doubling while runs keep
  // finding a backend down, up to `retry_backoff_max`. Defaults 20 ms, 1 s.
  std::chrono::milliseconds retry_backoff{20};
  std::chrono::milliseconds retry_backoff_max{1000};
  // Threads for blocking effects and stores. Default 0: `concurrency` for a
  // JobEffect, 1 otherwise (a PostgreSQL store is called there).
  int blocking_threads = 0;
  // Rate limits (limits.hpp) every job must pass before its run: a job over
  // a limit waits in its slot for its turn (never dropped, never failed); a
  // job without a limit's field is not limited by it. A job waiting for a
  // limit (this one or concurrency_per) is touched every claim_idle / 3
  // (StreamSource::async_touch), so no reclaim scan takes it over as
  // stalled; a worker with limits reads no jobs ahead of its free slots.
  std::vector<RateLimit> rates{};
  // Per-key concurrency limits (limits.hpp), one per field at most: a job
  // takes a permit of each limit whose field it has (in field order, so two
  // jobs never each hold what the other waits for) before its rate limits
  // and its run, and gives them back when its run is over. A job waiting for
  // a permit waits in its slot, first come first served across the fleet
  // (never dropped, never failed); a stop while it waits leaves it pending.
  // A permit's lease is the lock class's ttl, renewed while the job runs. A
  // permit lost while its job runs (Redis unreachable past the lease) is
  // counted and logged; the job is not stopped for it.
  std::vector<ConcurrencyLimit> concurrency_per{};
  // How often the worker frees orphaned unique locks of its stream
  // (StreamSource::reap_unique), the first time when it starts. Default 30 s;
  // 0: never.
  std::chrono::milliseconds unique_reap_interval{30000};
  // One "job" event per job (outcome, action, unit, run id, deliveries...).
  // Null: none. The runner's own phase events go to its RunnerBackends::log.
  observe::EventLog* log = nullptr;
  // Called on the event loop after each job's action.
  std::function<void(const JobReport&)> on_job{};

  // Throws Error(invalid_argument) naming the first field out of range; what
  // the StreamWorker constructor checks, callable before any connection.
  void validate() const;
};

struct WorkerStats {
  std::int64_t jobs = 0;           // runs started (deliveries taken)
  std::int64_t completed = 0;      // acked after the effect ran
  std::int64_t skipped = 0;        // acked: already done
  std::int64_t failed = 0;         // failed attempts (fail and dead_letter actions)
  std::int64_t dead_lettered = 0;  // moved to the dead-letter stream
  std::int64_t left_pending = 0;   // leave_pending and retry_later, and actions that could not be carried out
  std::int64_t read_errors = 0;    // reads that failed (Redis down): retried with backoff
  std::int64_t unique_released = 0;   // unique locks released by their jobs (unique.hpp)
  std::int64_t unique_conflicts = 0;  // while-executing copies delivered while their unit ran
  std::int64_t unique_reaped = 0;     // orphaned unique locks freed by this worker's reaper
  std::int64_t rate_limited = 0;      // jobs that waited for a rate limit before their run
  std::int64_t rate_wait_ms = 0;      // the time they waited, in all
  std::int64_t concurrency_limited = 0;  // jobs that waited for a concurrency permit before their run
  std::int64_t concurrency_wait_ms = 0;  // the time they waited, in all
  std::int64_t concurrency_lost = 0;     // permits whose lease was lost while their job ran
  std::int64_t finished() const noexcept { return completed + skipped + dead_lettered; }
};

class StreamWorker {
 public:
  // Throws Error(invalid_argument) naming a bad option. `client` is the one
  // the runner's LeaseScheduler uses (the jobs run on its event loop).
  StreamWorker(redis::Client& client, StreamOptions stream, GuardedRunner& runner, AsyncJobEffect effect,
               WorkerOptions options = {});
  StreamWorker(redis::Client& client, StreamOptions stream, GuardedRunner& runner, JobEffect effect,
               WorkerOptions options = {});
  ~StreamWorker();
  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  // Works until stop(), max_jobs or exit_when_idle; jobs in flight finish
  // first. Throws Error for what retrying cannot mend (the stream key holds
  // another type, NOPERM); a Redis that is down is waited out, with backoff.
  void run();
  // The same as a coroutine on the client's event loop.
  boost::asio::awaitable<void> async_run();

  // No new jobs; the effects in flight see shutdown() (a second call:
  // hard_shutdown()). Safe from any thread, before or during run().
  void stop();
  bool stopping() const noexcept;

  WorkerStats stats() const;
  const std::string& consumer() const noexcept;
  StreamSource& source() noexcept;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace jobguard::job
