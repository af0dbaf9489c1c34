#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/lease.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using Clock = std::chrono::steady_clock;
using jobguard::test::eventually;

#include "fixtures.hpp"

TEST_F(LeaseTest, RenewalKeepsTheLockFarPastItsTtl) {
  auto lease = sched->acquire(resource("long"), LockOptions{.ttl = 300ms});
  ASSERT_TRUE(lease);
  std::this_thread::sleep_for(1500ms);  // five TTLs
  EXPECT_FALSE(lease->lost()) << lease->reason();
  EXPECT_EQ(admin("GET " + lease->key()), lease->token());
  EXPECT_GE(lease->renewals(), 8u);
  EXPECT_GT(lease->safe_time_left(), 0ms);
  EXPECT_LE(lease->safe_time_left(), 300ms);
  EXPECT_NO_THROW(lease->ensure(50ms));
  EXPECT_THROW(lease->ensure(10s), Error) << "cannot promise more than a TTL";
  EXPECT_TRUE(lease->release());
  EXPECT_EQ(admin("EXISTS " + lease->key()), "0");
}

TEST_F(LeaseTest, DeletedKeyIsReportedLostThroughStopTokenAndCallback) {
  auto lease = sched->acquire(resource("del"), LockOptions{.ttl = 600ms});
  ASSERT_TRUE(lease);
  std::atomic<int> calls{0};
  std::atomic<LeaseState> seen{LeaseState::active};
  lease->on_lost([&](LeaseState s, const std::string&) {
    seen = s;
    calls++;
  });
  auto stop = lease->stop_token();
  admin("DEL " + lease->key());
  const auto t0 = Clock::now();
  ASSERT_TRUE(eventually([&] { return stop.stop_requested(); }, 3s));
  EXPECT_LT(Clock::now() - t0, 1s) << "loss must be noticed at the next renewal (ttl/3)";
  EXPECT_TRUE(eventually([&] { return calls.load() == 1; }, 1s));
  EXPECT_EQ(seen.load(), LeaseState::token_gone);
  EXPECT_TRUE(lease->lost());
  EXPECT_THROW(lease->ensure(0ms), Error);
  try {
    lease->ensure(1ms);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::lease_lost);
  }
  EXPECT_FALSE(lease->release()) << "a lost lease must not delete anything";
}

TEST_F(LeaseTest, ALeaseTakenOverBySomeoneElseIsLost) {
  auto lease = sched->acquire(resource("steal"), LockOptions{.ttl = 600ms});
  ASSERT_TRUE(lease);
  admin("SET " + lease->key() + " intruder PX 10000");
  ASSERT_TRUE(eventually([&] { return lease->lost(); }, 3s));
  EXPECT_EQ(lease->state(), LeaseState::token_gone);
  lease->release();
  EXPECT_EQ(admin("GET " + lease->key()), "intruder") << "release of a lost lease deleted another owner's lock";
}

TEST_F(LeaseTest, RedisPausedPastTheTtlLosesTheLease) {
  auto lease = sched->acquire(resource("pause"), LockOptions{.ttl = 500ms});
  ASSERT_TRUE(lease);
  admin("CLIENT PAUSE 1500 ALL");
  ASSERT_TRUE(eventually([&] { return lease->lost(); }, 3s));
  EXPECT_EQ(lease->state(), LeaseState::expired) << lease->reason();
}

TEST_F(LeaseTest, HardTimeoutStopsTheJob) {
  auto lease = sched->acquire(resource("hard"), LockOptions{.ttl = 5s}, LeaseOptions{.hard_timeout = 300ms});
  ASSERT_TRUE(lease);
  auto stop = lease->stop_token();
  ASSERT_TRUE(eventually([&] { return stop.stop_requested(); }, 3s));
  EXPECT_EQ(lease->state(), LeaseState::timed_out);
}


// The hard timeout leaves the key ours: the scheduler deletes it at once, so
// the next holder need not wait out the TTL (30 s here, far longer than the
// test's wait, so a key gone by expiry cannot pass for one deleted).
TEST_F(LeaseTest, ALeaseEndedByTheHardTimeoutDeletesItsKey) {
  auto lease = sched->acquire(resource("hard-del"), LockOptions{.ttl = 30s}, LeaseOptions{.hard_timeout = 200ms});
  ASSERT_TRUE(lease);
  ASSERT_EQ(admin("GET " + lease->key()), lease->token());
  ASSERT_TRUE(eventually([&] { return lease->stop_token().stop_requested(); }, 10s));
  EXPECT_EQ(lease->state(), LeaseState::timed_out);
  ASSERT_TRUE(eventually([&] { return admin("EXISTS " + lease->key()) == "0"; }, 10s))
      << "PTTL " << admin("PTTL " + lease->key());
  // The resource is free for a try-once acquire, and the lost lease's release
  // leaves the new holder's key alone.
  auto next = svc->acquire(lease->resource(), LockOptions{.ttl = 30s});
  ASSERT_TRUE(next);
  EXPECT_FALSE(lease->release());
  EXPECT_EQ(admin("GET " + next->key()), next->token());
  EXPECT_TRUE(next->release());
}
