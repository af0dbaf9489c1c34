#include "job/worker_decide.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "jobguard/job/unique.hpp"

namespace jobguard::job {

std::string_view to_string(Action a) noexcept {
  switch (a) {
    case Action::ack: return "ack";
    case Action::fail: return "fail";
    case Action::leave_pending: return "leave_pending";
    case Action::retry_later: return "retry_later";
    case Action::dead_letter: return "dead_letter";
  }
  return "?";
}

Decision decide(const RunResult& r, bool left_pending) {
  if (left_pending) return {Action::leave_pending, r.detail};
  switch (r.outcome) {
    case Outcome::completed:
    case Outcome::already_done:
      return {Action::ack, r.outcome == Outcome::already_done ? r.detail : std::string()};
    case Outcome::failed:
      // The effect threw, or its records could not be written: an attempt
      // that counts toward max_attempts.
      return {Action::fail, r.detail};
    case Outcome::in_doubt:
      // Committed or not, the record decides: the next delivery reads it
      // (already_done, or a clean run). Not an attempt of the effect's.
    case Outcome::busy:
    case Outcome::lease_lost:
    case Outcome::timed_out:
    case Outcome::stale:
      // Nothing was recorded; a later delivery (here or elsewhere) finishes it.
      return {Action::leave_pending, r.detail};
    case Outcome::redis_unavailable:
    case Outcome::postgres_unavailable:
      // The job is fine, a backend is not: taking the next job at once would
      // only meet the same wall.
      return {Action::retry_later, r.detail};
  }
  return {Action::fail, r.detail};
}

namespace delivery {

using std::chrono::milliseconds;

Plan plan(const StreamJob& job, std::string_view id_field, std::string_view run_field) {
  Plan p;
  const bool has_id =
      std::any_of(job.fields.begin(), job.fields.end(), [&](const auto& f) { return f.first == id_field; });
  p.unit.id = job.field(id_field);
  p.unit.run_id = job.field(run_field);
  if (p.unit.run_id.empty()) p.unit.run_id = job.id;
  p.unit.job_id = job.id;
  if (!has_id) p.malformed = fmt::format("job has no field \"{}\"", id_field);
  else if (p.unit.id.empty()) p.malformed = fmt::format("job field \"{}\" is empty", id_field);
  const std::string strategy = job.field(kUniqueStrategyField);
  p.unique_lock = job.field(kUniqueKeyField);
  p.release_at_start =
      !p.unique_lock.empty() && strategy == to_string(UniqueStrategy::until_and_while_executing);
  p.release_at_end = !p.unique_lock.empty() && strategy != to_string(UniqueStrategy::until_expired);
  p.while_executing = strategy == to_string(UniqueStrategy::while_executing);
  p.drop_conflict = job.field(kUniqueConflictField) == to_string(UniqueConflict::log);
  return p;
}

Verdict judge(const Plan& plan, const Facts& f) {
  if (!plan.runnable()) return {{Action::dead_letter, plan.malformed}};
  // Not run: a job held back by a limit is never dropped or failed.
  if (f.limited) return {{f.stopping || f.taken_over ? Action::leave_pending : Action::retry_later, *f.limited}};
  // No delivery can succeed on a unit the runner refuses.
  if (f.refused || !f.ran) return {{Action::dead_letter, f.refused.value_or(std::string())}};
  Verdict v{decide(f.run, f.left_pending)};
  if (f.left_pending) {
    v.decision.reason = f.left_pending_reason;
    return v;
  }
  if (plan.while_executing && f.run.outcome == Outcome::busy)
    return {{plan.drop_conflict ? Action::ack : Action::dead_letter,
             fmt::format("unique (while-executing): unit \"{}\" was running in another job", plan.unit.id)},
            true};
  v.defer = v.decision.action == Action::leave_pending &&
            (f.run.outcome == Outcome::busy || f.run.outcome == Outcome::timed_out);
  return v;
}

std::string_view to_string(Landed l) noexcept {
  switch (l) {
    case Landed::acked: return "acked";
    case Landed::dead_lettered: return "dead_lettered";
    case Landed::left_pending: return "left_pending";
  }
  return "?";
}

bool release_unique_after(const Plan& plan, const Applied& a) {
  return plan.release_at_end && a.error.empty() && (a.landed == Landed::acked || a.dead());
}

milliseconds pause_after_verdict(milliseconds pause, Action a, milliseconds first, milliseconds max) {
  return a == Action::retry_later ? std::clamp(pause * 2, first, max) : pause;
}

milliseconds pause_after_applied(milliseconds pause, Action a, const Applied& applied) {
  return a != Action::retry_later && applied.error.empty() ? milliseconds(0) : pause;
}

void tally(WorkerStats& st, const Facts& f, const Verdict& v, const Applied& a) {
  const Action action = v.decision.action;
  if (!a.error.empty() || action == Action::leave_pending || action == Action::retry_later) {
    ++st.left_pending;
  } else if (action == Action::ack) {
    ++(f.run.outcome == Outcome::already_done || v.unique_conflict ? st.skipped : st.completed);
  } else {
    ++st.failed;
    if (a.dead()) ++st.dead_lettered;
  }
  if (v.unique_conflict) ++st.unique_conflicts;
}

std::string_view outcome_name(const Facts& f, const Verdict& v, const Applied& a) {
  const Action action = v.decision.action;
  if (!a.error.empty()) return "action_failed";
  if (action == Action::ack) return f.run.outcome == Outcome::already_done ? "skipped" : "completed";
  if (action == Action::fail || action == Action::dead_letter) return a.dead() ? "dead_lettered" : "failed";
  if (f.left_pending) return "interrupted";
  return to_string(f.run.outcome);
}

}  // namespace delivery
}  // namespace jobguard::job
