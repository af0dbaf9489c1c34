// Private to src/job: the stream worker's decide step. What to do with one
// delivery is a pure function of what its fields say and what happened to it
// (no server, no clock, no I/O), so every path can be walked by a unit test.
// The worker gathers the facts (worker.cpp), applies the verdict against
// Redis (worker_apply.cpp) and reports it (worker_report.cpp); the functions
// here are the only place those three agree on what a delivery came to.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "jobguard/job/runner.hpp"
#include "jobguard/job/stream_source.hpp"
#include "jobguard/job/worker.hpp"

namespace jobguard::job::delivery {

// What the job's fields say, before anything runs.
struct Plan {
  Unit unit{};
  // Why no run can succeed on the job as it is (no id field, an empty id):
  // it is dead-lettered without a run. Empty when it can run.
  std::string malformed{};
  // A unique job (unique.hpp): the unique lock it carries, or empty.
  std::string unique_lock{};
  bool release_at_start = false;  // until-and-while-executing: given up once the run is granted
  bool release_at_end = false;    // all but until-expired: given up when the job leaves the queue
  bool while_executing = false;   // a busy run is a conflict with the copy that runs
  bool drop_conflict = false;     // ... acknowledged (conflict "log"), not dead-lettered

  bool runnable() const noexcept { return malformed.empty(); }
};
Plan plan(const StreamJob& job, std::string_view id_field, std::string_view run_field);

// What happened to the delivery after its plan: held back by a limit, refused
// by the runner, or run (at most one of the three).
struct Facts {
  // A rate or concurrency limit held it back: why.
  std::optional<std::string> limited{};
  bool stopping = false;    // the worker was stopping when the limit let go
  bool taken_over = false;  // another consumer took it over while it waited
  // The runner refused the unit (an id its key pattern cannot take): why.
  std::optional<std::string> refused{};
  bool ran = false;
  RunResult run{};
  // The effect asked for the job to be left pending (WorkItem::leave_pending).
  bool left_pending = false;
  std::string left_pending_reason{};
};

struct Verdict {
  Decision decision{};
  // A while-executing copy delivered while its unit ran elsewhere.
  bool unique_conflict = false;
  // Left pending after a busy or timed-out run: handed back to come again
  // soon (StreamSource::async_defer), not held until claim_idle.
  bool defer = false;
};
Verdict judge(const Plan& plan, const Facts& facts);

// Where applying a verdict left the job's message.
enum class Landed { acked, dead_lettered, left_pending };
std::string_view to_string(Landed l) noexcept;

struct Applied {
  Landed landed = Landed::left_pending;
  // The action could not be carried out (Redis went away): the job stays
  // pending. Empty otherwise.
  std::string error{};
  bool dead() const noexcept { return landed == Landed::dead_lettered; }
};

// The unique lock goes once the job has left the queue for good, and only
// then: a job still pending comes back and is still the lock's holder.
bool release_unique_after(const Plan& plan, const Applied& applied);

// The pause before the worker's next read. A retry_later doubles it, from
// `first` up to `max` (taking the next job at once would only meet the same
// wall); any other decision carried out resets it.
std::chrono::milliseconds pause_after_verdict(std::chrono::milliseconds pause, Action a,
                                              std::chrono::milliseconds first, std::chrono::milliseconds max);
std::chrono::milliseconds pause_after_applied(std::chrono::milliseconds pause, Action a, const Applied& applied);

// The delivery's share of the stats (WorkerStats' comments say what counts where).
void tally(WorkerStats& st, const Facts& facts, const Verdict& verdict, const Applied& applied);

// The outcome of the delivery's "job" event.
std::string_view outcome_name(const Facts& facts, const Verdict& verdict, const Applied& applied);

}  // namespace jobguard::job::delivery
