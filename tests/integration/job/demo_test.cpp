// The billing demo at a small size against a real redis-server, including the
// Redis restart fault: the guarded run charges every subscription exactly once
// and its faults really happened (stale writes rejected); the naive run
// double-charges under the same faults.
#include "jobguard/job/demo.hpp"

#include <gtest/gtest.h>

#include <string>

#include "jobguard/embedded_redis.hpp"
#include "jobguard/error.hpp"

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
