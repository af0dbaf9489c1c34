#include <gtest/gtest.h>

#include "jobguard/lock.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;

class FenceTest : public jobguard::test::RedisTest {};

TEST_F(FenceTest, TokensIncreaseStrictlyWithEveryGrant) {
  auto c = make_client();
  auto svc = LockService::create(*c);
  std::int64_t last = 0;
  for (int i = 0; i < 200; ++i) {
    auto l = svc->acquire("fence:a", LockOptions{.ttl = 5s, .fence = true});
    ASSERT_TRUE(l && l->fence());
    EXPECT_GT(*l->fence(), last);
    last = *l->fence();
    l->release();
  }
}

TEST_F(FenceTest, TokensNeverGoBackwardsAfterARestartWithoutPersistence) {
  std::int64_t last = 0;
  for (int round = 0; round < 3; ++round) {
    auto c = make_client();
    auto svc = LockService::create(*c);
    for (int i = 0; i < 20; ++i) {
      auto l = svc->acquire("fence:restart", LockOptions{.ttl = 5s, .fence = true});
      ASSERT_TRUE(l && l->fence());
      EXPECT_GT(*l->fence(), last) << "fencing token regressed after restart " << round;
      last = *l->fence();
      l->release();
    }
    c.reset();
    server->restart();  // no persistence: the counter is gone
    ASSERT_EQ(admin("EXISTS jobguard:fence:{fence:restart}"), "0");
    // The fencing floor is under test, not the quarantine (QuarantineTest):
    // without this the restarted server is refused grants for a max TTL.
    trust_server();
  }
}

TEST_F(FenceTest, AFenceKeyDamagedToAHugeValueStillOnlyGrowsAndFairWorksWithFence) {
  auto c = make_client();
  auto svc = LockService::create(*c);
  admin("SET jobguard:fence:{fence:big} 9000000000000000");
  auto l = svc->acquire("fence:big", LockOptions{.ttl = 5s, .fence = true, .fair = true});
  ASSERT_TRUE(l && l->fence());
  EXPECT_EQ(*l->fence(), 9000000000000001);
}
