// The stream worker's action table (job::decide): every runner outcome maps
// to one action on the job's message. Pure logic, no server.
#include <gtest/gtest.h>

#include "jobguard/job/worker.hpp"

namespace jobguard::job {
namespace {

RunResult result(Outcome o, std::string detail = {}) {
  RunResult r;
  r.outcome = o;
  r.detail = std::move(detail);
  return r;
}

TEST(WorkerDecide, EveryOutcomeHasItsAction) {
  struct Case {
    Outcome outcome;
    Action action;
  };
  const Case cases[] = {
      {Outcome::completed, Action::ack},
      {Outcome::already_done, Action::ack},
      {Outcome::failed, Action::fail},
      {Outcome::busy, Action::leave_pending},
      {Outcome::lease_lost, Action::leave_pending},
      {Outcome::timed_out, Action::leave_pending},
      {Outcome::stale, Action::leave_pending},
      {Outcome::in_doubt, Action::leave_pending},
      {Outcome::redis_unavailable, Action::retry_later},
      {Outcome::postgres_unavailable, Action::retry_later},
  };
  for (const auto& c : cases)
    EXPECT_EQ(decide(result(c.outcome)).action, c.action) << to_string(c.outcome) << " -> " << to_string(c.action);
}

TEST(WorkerDecide, TheReasonIsTheRunsDetailButAPlainAckHasNone) {
  EXPECT_EQ(decide(result(Outcome::failed, "exit status 3")).reason, "exit status 3");
  EXPECT_EQ(decide(result(Outcome::lease_lost, "lease lost: taken")).reason, "lease lost: taken");
  EXPECT_EQ(decide(result(Outcome::completed, "")).reason, "");
  EXPECT_EQ(decide(result(Outcome::already_done, "t u run r already completed")).reason,
            "t u run r already completed");
}

TEST(WorkerDecide, AnEffectThatLeftItsJobPendingWinsOverEveryOutcome) {
  for (Outcome o : {Outcome::completed, Outcome::failed, Outcome::busy, Outcome::redis_unavailable})
    EXPECT_EQ(decide(result(o), /*left_pending=*/true).action, Action::leave_pending) << to_string(o);
}

TEST(WorkerDecide, ActionsHaveNames) {
  EXPECT_EQ(to_string(Action::ack), "ack");
  EXPECT_EQ(to_string(Action::fail), "fail");
  EXPECT_EQ(to_string(Action::leave_pending), "leave_pending");
  EXPECT_EQ(to_string(Action::retry_later), "retry_later");
  EXPECT_EQ(to_string(Action::dead_letter), "dead_letter");
}

TEST(WorkerDecide, FieldEnvNamesAreUpperCasedWithOthersReplaced) {
  EXPECT_EQ(field_env_name("id"), "JOBGUARD_FIELD_ID");
  EXPECT_EQ(field_env_name("run-id.v2"), "JOBGUARD_FIELD_RUN_ID_V2");
  EXPECT_EQ(field_env_name("caf\xc3\xa9"), "JOBGUARD_FIELD_CAF__");
}

}  // namespace
}  // namespace jobguard::job
