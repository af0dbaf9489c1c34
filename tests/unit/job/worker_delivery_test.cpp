// The stream worker's decide step for a whole delivery (job::delivery):
// what a job's fields say before its run, the verdict on what happened to
// it (malformed, held back by a limit, refused, run), and how the verdict
// once applied counts, is named in the log, frees a unique lock and paces
// the next read. Pure logic, no server.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "job/worker_decide.hpp"
#include "jobguard/job/unique.hpp"

namespace jobguard::job {
namespace {

using delivery::Applied;
using delivery::Facts;
using delivery::Landed;
using delivery::Plan;
using delivery::Verdict;
using std::chrono::milliseconds;

StreamJob job(std::vector<std::pair<std::string, std::string>> fields, std::string id = "1-0") {
  StreamJob j;
  j.id = std::move(id);
  j.fields = std::move(fields);
  return j;
}

Plan plan(const StreamJob& j) { return delivery::plan(j, "id", "run"); }

StreamJob unique_job(UniqueStrategy s, UniqueConflict c = UniqueConflict::reject) {
  return job({{"id", "u1"},
              {std::string(kUniqueStrategyField), std::string(to_string(s))},
              {std::string(kUniqueKeyField), "jobguard:unique:u1"},
              {std::string(kUniqueConflictField), std::string(to_string(c))}});
}

Facts ran(Outcome o, std::string detail = {}) {
  Facts f;
  f.ran = true;
  f.run.outcome = o;
  f.run.detail = std::move(detail);
  return f;
}

TEST(WorkerDelivery, ThePlanTakesTheUnitFromTheJobsFields) {
  const Plan p = plan(job({{"id", "acct-7"}, {"run", "2026-11"}}, "5-1"));
  EXPECT_TRUE(p.runnable());
  EXPECT_EQ(p.unit.id, "acct-7");
  EXPECT_EQ(p.unit.run_id, "2026-11");
  EXPECT_EQ(p.unit.job_id, "5-1");
  // Without a run field, each entry is its own run.
  EXPECT_EQ(plan(job({{"id", "acct-7"}}, "5-2")).unit.run_id, "5-2");
}

TEST(WorkerDelivery, AJobWithoutAUsableIdIsDeadLetteredUnrun) {
  const Plan none = plan(job({{"other", "x"}}));
  EXPECT_FALSE(none.runnable());
  Verdict v = delivery::judge(none, Facts{});
  EXPECT_EQ(v.decision.action, Action::dead_letter);
  EXPECT_EQ(v.decision.reason, "job has no field \"id\"");

  const Plan empty = plan(job({{"id", ""}}));
  EXPECT_FALSE(empty.runnable());
  v = delivery::judge(empty, Facts{});
  EXPECT_EQ(v.decision.action, Action::dead_letter);
  EXPECT_EQ(v.decision.reason, "job field \"id\" is empty");
}

TEST(WorkerDelivery, UniqueStrategiesSayWhenTheirLockGoes) {
  const Plan a = plan(unique_job(UniqueStrategy::until_and_while_executing));
  EXPECT_TRUE(a.release_at_start);
  EXPECT_TRUE(a.release_at_end);
  EXPECT_EQ(a.unique_lock, "jobguard:unique:u1");
  const Plan b = plan(unique_job(UniqueStrategy::until_executed));
  EXPECT_FALSE(b.release_at_start);
  EXPECT_TRUE(b.release_at_end);
  const Plan c = plan(unique_job(UniqueStrategy::until_expired));
  EXPECT_FALSE(c.release_at_start);
  EXPECT_FALSE(c.release_at_end);
  const Plan d = plan(unique_job(UniqueStrategy::while_executing));
  EXPECT_TRUE(d.while_executing);
  EXPECT_FALSE(plan(job({{"id", "u1"}})).release_at_end);
}

TEST(WorkerDelivery, AJobHeldBackByALimitIsRetriedUnlessTheWorkerStopsOrLostIt) {
  const Plan p = plan(job({{"id", "u1"}}));
  Facts f;
  f.limited = "rate limit r: over";
  Verdict v = delivery::judge(p, f);
  EXPECT_EQ(v.decision.action, Action::retry_later);
  EXPECT_EQ(v.decision.reason, "rate limit r: over");
  f.stopping = true;
  EXPECT_EQ(delivery::judge(p, f).decision.action, Action::leave_pending);
  f.stopping = false;
  f.taken_over = true;
  EXPECT_EQ(delivery::judge(p, f).decision.action, Action::leave_pending);
}

TEST(WorkerDelivery, AUnitTheRunnerRefusesIsDeadLettered) {
  Facts f;
  f.refused = "unit id \"a/b\" does not fit the key pattern";
  const Verdict v = delivery::judge(plan(job({{"id", "a/b"}})), f);
  EXPECT_EQ(v.decision.action, Action::dead_letter);
  EXPECT_EQ(v.decision.reason, *f.refused);
}

TEST(WorkerDelivery, ABusyOrTimedOutRunIsDeferredOthersLeftPendingAreNot) {
  const Plan p = plan(job({{"id", "u1"}}));
  for (Outcome o : {Outcome::busy, Outcome::timed_out}) {
    const Verdict v = delivery::judge(p, ran(o, "held"));
    EXPECT_EQ(v.decision.action, Action::leave_pending) << to_string(o);
    EXPECT_TRUE(v.defer) << to_string(o);
  }
  for (Outcome o : {Outcome::lease_lost, Outcome::stale, Outcome::in_doubt, Outcome::completed, Outcome::failed,
                    Outcome::redis_unavailable})
    EXPECT_FALSE(delivery::judge(p, ran(o)).defer) << to_string(o);
}

TEST(WorkerDelivery, AnEffectThatLeftItsJobPendingGivesItsOwnReasonAndIsNotDeferred) {
  Facts f = ran(Outcome::busy, "busy: held by w2");
  f.left_pending = true;
  f.left_pending_reason = "interrupted by the worker's shutdown: killed by signal 15";
  // While-executing too: a left-pending job is no conflict.
  const Verdict v = delivery::judge(plan(unique_job(UniqueStrategy::while_executing)), f);
  EXPECT_EQ(v.decision.action, Action::leave_pending);
  EXPECT_EQ(v.decision.reason, f.left_pending_reason);
  EXPECT_FALSE(v.defer);
  EXPECT_FALSE(v.unique_conflict);
}

TEST(WorkerDelivery, AWhileExecutingCopyThatFindsItsUnitBusyIsAConflict) {
  Verdict v = delivery::judge(plan(unique_job(UniqueStrategy::while_executing)), ran(Outcome::busy));
  EXPECT_TRUE(v.unique_conflict);
  EXPECT_EQ(v.decision.action, Action::dead_letter);
  EXPECT_EQ(v.decision.reason, "unique (while-executing): unit \"u1\" was running in another job");
  v = delivery::judge(plan(unique_job(UniqueStrategy::while_executing, UniqueConflict::log)), ran(Outcome::busy));
  EXPECT_TRUE(v.unique_conflict);
  EXPECT_EQ(v.decision.action, Action::ack);
  // Any other outcome, or another strategy, is judged as usual.
  v = delivery::judge(plan(unique_job(UniqueStrategy::while_executing)), ran(Outcome::completed));
  EXPECT_FALSE(v.unique_conflict);
  EXPECT_EQ(v.decision.action, Action::ack);
  v = delivery::judge(plan(unique_job(UniqueStrategy::until_executed)), ran(Outcome::busy));
  EXPECT_FALSE(v.unique_conflict);
  EXPECT_EQ(v.decision.action, Action::leave_pending);
}

TEST(WorkerDelivery, TheUniqueLockGoesOnlyWhenTheJobLeftTheQueue) {
  const Plan p = plan(unique_job(UniqueStrategy::until_executed));
  EXPECT_TRUE(delivery::release_unique_after(p, Applied{Landed::acked, {}}));
  EXPECT_TRUE(delivery::release_unique_after(p, Applied{Landed::dead_lettered, {}}));
  EXPECT_FALSE(delivery::release_unique_after(p, Applied{Landed::left_pending, {}}));
  EXPECT_FALSE(delivery::release_unique_after(p, Applied{Landed::left_pending, "connection lost"}));
  EXPECT_FALSE(
      delivery::release_unique_after(plan(unique_job(UniqueStrategy::until_expired)), Applied{Landed::acked, {}}));
}

TEST(WorkerDelivery, RetryLaterDoublesThePauseWithinItsBoundsAndAnythingAppliedResetsIt) {
  const milliseconds first{20}, max{1000};
  milliseconds pause{0};
  pause = delivery::pause_after_verdict(pause, Action::retry_later, first, max);
  EXPECT_EQ(pause, first);
  pause = delivery::pause_after_verdict(pause, Action::retry_later, first, max);
  EXPECT_EQ(pause, milliseconds(40));
  EXPECT_EQ(delivery::pause_after_verdict(milliseconds(800), Action::retry_later, first, max), max);
  EXPECT_EQ(delivery::pause_after_verdict(pause, Action::ack, first, max), pause);
  // A retry_later keeps it; so does an action that could not be carried out.
  EXPECT_EQ(delivery::pause_after_applied(pause, Action::retry_later, Applied{}), pause);
  EXPECT_EQ(delivery::pause_after_applied(pause, Action::ack, Applied{Landed::left_pending, "gone"}), pause);
  EXPECT_EQ(delivery::pause_after_applied(pause, Action::ack, Applied{Landed::acked, {}}), milliseconds(0));
  EXPECT_EQ(delivery::pause_after_applied(pause, Action::leave_pending, Applied{}), milliseconds(0));
}

struct Counted {
  std::string outcome;
  WorkerStats st;
};

Counted count(const Facts& f, const Verdict& v, const Applied& a) {
  Counted c;
  delivery::tally(c.st, f, v, a);
  c.outcome = std::string(delivery::outcome_name(f, v, a));
  return c;
}

TEST(WorkerDelivery, EachLandingCountsOnceAndIsNamed) {
  const Plan p = plan(job({{"id", "u1"}}));
  auto judged = [&](const Facts& f) { return delivery::judge(p, f); };

  Counted c = count(ran(Outcome::completed), judged(ran(Outcome::completed)), Applied{Landed::acked, {}});
  EXPECT_EQ(c.st.completed, 1);
  EXPECT_EQ(c.outcome, "completed");

  c = count(ran(Outcome::already_done), judged(ran(Outcome::already_done)), Applied{Landed::acked, {}});
  EXPECT_EQ(c.st.skipped, 1);
  EXPECT_EQ(c.st.completed, 0);
  EXPECT_EQ(c.outcome, "skipped");

  c = count(ran(Outcome::failed), judged(ran(Outcome::failed)), Applied{Landed::left_pending, {}});
  EXPECT_EQ(c.st.failed, 1);
  EXPECT_EQ(c.st.dead_lettered, 0);
  EXPECT_EQ(c.outcome, "failed");

  c = count(ran(Outcome::failed), judged(ran(Outcome::failed)), Applied{Landed::dead_lettered, {}});
  EXPECT_EQ(c.st.failed, 1);
  EXPECT_EQ(c.st.dead_lettered, 1);
  EXPECT_EQ(c.outcome, "dead_lettered");

  c = count(ran(Outcome::lease_lost), judged(ran(Outcome::lease_lost)), Applied{Landed::left_pending, {}});
  EXPECT_EQ(c.st.left_pending, 1);
  EXPECT_EQ(c.outcome, "lease_lost");

  c = count(ran(Outcome::redis_unavailable), judged(ran(Outcome::redis_unavailable)),
            Applied{Landed::left_pending, {}});
  EXPECT_EQ(c.st.left_pending, 1);
  EXPECT_EQ(c.outcome, "redis_unavailable");

  // An ack that Redis did not take: pending, whatever the run did.
  c = count(ran(Outcome::completed), judged(ran(Outcome::completed)), Applied{Landed::left_pending, "EOF"});
  EXPECT_EQ(c.st.left_pending, 1);
  EXPECT_EQ(c.st.completed, 0);
  EXPECT_EQ(c.outcome, "action_failed");

  Facts left = ran(Outcome::failed);
  left.left_pending = true;
  c = count(left, judged(left), Applied{Landed::left_pending, {}});
  EXPECT_EQ(c.st.left_pending, 1);
  EXPECT_EQ(c.st.failed, 0);
  EXPECT_EQ(c.outcome, "interrupted");
}

TEST(WorkerDelivery, AConflictCountsAsASkipOrAFailureAndAsAConflict) {
  const Facts busy = ran(Outcome::busy);
  Verdict v = delivery::judge(plan(unique_job(UniqueStrategy::while_executing, UniqueConflict::log)), busy);
  Counted c = count(busy, v, Applied{Landed::acked, {}});
  EXPECT_EQ(c.st.skipped, 1);
  EXPECT_EQ(c.st.unique_conflicts, 1);

  v = delivery::judge(plan(unique_job(UniqueStrategy::while_executing)), busy);
  c = count(busy, v, Applied{Landed::dead_lettered, {}});
  EXPECT_EQ(c.st.failed, 1);
  EXPECT_EQ(c.st.dead_lettered, 1);
  EXPECT_EQ(c.st.unique_conflicts, 1);
  EXPECT_EQ(c.outcome, "dead_lettered");
}

TEST(WorkerDelivery, LandingsHaveNames) {
  EXPECT_EQ(delivery::to_string(Landed::acked), "acked");
  EXPECT_EQ(delivery::to_string(Landed::dead_lettered), "dead_lettered");
  EXPECT_EQ(delivery::to_string(Landed::left_pending), "left_pending");
}

}  // namespace
}  // namespace jobguard::job
