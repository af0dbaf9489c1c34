// The billing demo at a small size against a real redis-server, including the
// Redis restart fault: the guarded run charges every subscription exactly once
// and its faults really happened (stale writes rejected); the naive run
// double-charges under the same faults.
#include "billing/demo.hpp"

#include <gtest/gtest.h>

#include <string>

#include "jobguard/testing/embedded_redis.hpp"
#include "jobguard/error.hpp"
#ifndef JOBGUARD_TESTS_WITHOUT_POSTGRES
#include "jobguard/guard/completion.hpp"
#include "jobguard/guard/postgres.hpp"
#include "support/postgres_fixture.hpp"
#endif

namespace {

TEST(BillingDemo, GuardedRunChargesEveryoneOnceNaiveRunDoubleCharges) {
  jobguard::EmbeddedRedis redis;
  redis.start();
  jobguard::job::BillingDemoOptions o;
  o.redis_url = redis.url();
  o.restartable = &redis;
  o.subscriptions = 2000;
  o.workers = 4;
  o.lock_class = "billing-test";
  auto r = jobguard::job::run_billing_demo(o);
  EXPECT_TRUE(r.redis_restarted);
  EXPECT_EQ(r.guarded.double_charges, 0);
  EXPECT_EQ(r.guarded.missing, 0);
  EXPECT_GT(r.guarded.stale_writes_rejected, 0);
  EXPECT_GT(r.guarded.idempotent_replays, 0);
  EXPECT_GT(r.naive.double_charges, 0);
  EXPECT_GT(r.acquisitions, 0u);
}

#ifndef JOBGUARD_TESTS_WITHOUT_POSTGRES
TEST(BillingDemo, WithPostgresTheGuardedRunsCompletionRecordsAreDurableRows) {
  jobguard::EmbeddedRedis redis;
  redis.start();
  jobguard::guard::PgOptions pg;
  pg.url = jobguard::test::shared_postgres().url();
  jobguard::guard::pg_migrate(pg);
  jobguard::guard::PgCompletionStore store(pg);
  jobguard::job::BillingDemoOptions o;
  o.redis_url = redis.url();
  o.restartable = &redis;
  o.completions = &store;
  o.subscriptions = 1000;
  o.workers = 4;
  o.lock_class = "billing-pg-test";
  jobguard::guard::PgConnection c(pg);
  auto count = [&] {
    auto rows = c.exec("SELECT count(*) FROM jobguard_completions WHERE job_kind = 'billing-pg-test'");
    return std::stoi(rows.rows.at(0).at(0).value_or("-1"));
  };
  const int before = count();
  auto r = jobguard::job::run_billing_demo(o);
  EXPECT_EQ(r.guarded.double_charges, 0);
  EXPECT_EQ(r.guarded.missing, 0);
  EXPECT_GT(r.naive.double_charges, 0);
  // One row per chunk of 100, written by the runner, surviving the Redis restart.
  EXPECT_EQ(count() - before, 10);
}
#endif

TEST(BillingDemo, BadOptionsAreRejectedWithTheirName) {
  jobguard::job::BillingDemoOptions o;
  o.redis_url = "redis://127.0.0.1:1/0";
  o.scale = 0;
  try {
    jobguard::job::run_billing_demo(o);
    FAIL() << "accepted scale 0";
  } catch (const jobguard::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--scale"), std::string::npos) << e.what();
  }
}

}  // namespace
