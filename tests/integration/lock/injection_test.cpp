// LockService and LeaseScheduler take their clock and metrics registry from
// the caller (LockServiceOptions, LeaseSchedulerOptions): a test crosses a TTL
// by moving a ManualClock, and counts land in the registry it was given.
#include <gtest/gtest.h>

#include "jobguard/clock.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/observe/metrics.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using jobguard::test::eventually;

#include "fixtures.hpp"

namespace {
class InjectionTest : public LockTest {
 protected:
  void SetUp() override {
    LockTest::SetUp();
    manual = LockService::create(*client, LockServiceOptions{.clock = &clock, .metrics = &registry});
  }
  void TearDown() override {
    manual.reset();
    LockTest::TearDown();
  }
  // Per test: the global registry is shared by the whole binary.
  std::string lock_class() const { return "inj-" + resource("c"); }
  ManualClock clock;
  observe::Registry registry;
  // A scheduler's own registry: the client's loop counts into it, so it
  // lives until TearDown has stopped that loop.
  observe::Registry leases;
  std::shared_ptr<LockService> manual;
};
}  // namespace

TEST_F(InjectionTest, DefaultsAreTheSteadyClockAndTheGlobalRegistry) {
  EXPECT_EQ(&svc->clock(), &MonotonicClock::steady());
  EXPECT_EQ(&svc->metrics_registry(), &observe::Registry::global());
  EXPECT_EQ(&manual->clock(), &clock);
  EXPECT_EQ(&manual->metrics_registry(), &registry);
}

TEST_F(InjectionTest, ALocksTtlStartIsReadOnTheServicesClock) {
  auto l = manual->acquire(resource("r"));
  ASSERT_TRUE(l);
  // The manual clock has not moved: the send time is exactly its now.
  EXPECT_EQ(l->acquired_at(), clock.now());
}

TEST_F(InjectionTest, LockMetricsGoToTheRegistryTheServiceWasGiven) {
  const std::string cls = lock_class();
  auto l = manual->acquire(resource("r"), LockOptions{.lock_class = cls});
  ASSERT_TRUE(l);
  EXPECT_FALSE(manual->acquire(resource("r"), LockOptions{.lock_class = cls}));
  EXPECT_TRUE(l->release());
  const auto mine = registry.snapshot(cls);
  ASSERT_TRUE(mine);
  EXPECT_EQ(mine->acquisitions_total, 1u);
  EXPECT_EQ(mine->busy_total, 1u);
  EXPECT_EQ(mine->releases_total, 1u);
  EXPECT_FALSE(observe::Registry::global().snapshot(cls)) << "counted in the global registry too";
}

TEST_F(InjectionTest, ALeaseRunsOutOfSafeTimeWhenTheClockCrossesItsTtlWithoutSleeping) {
  auto sched = LeaseScheduler::create(manual);
  auto lease = sched->acquire(resource("r"), LockOptions{.ttl = 30s});
  ASSERT_TRUE(lease);
  // ttl - drift (30 s / 100 + 2 ms), counted from the send on a clock that stands still.
  EXPECT_EQ(lease->safe_time_left(), 30s - 302ms);
  clock.advance(30s);
  EXPECT_EQ(lease->safe_time_left(), 0ms);
  EXPECT_THROW(lease->ensure(1ms), Error);
}

TEST_F(InjectionTest, LeaseMetricsGoToTheSchedulersRegistry) {
  auto sched = LeaseScheduler::create(manual, LeaseSchedulerOptions{.metrics = &leases});
  const std::string cls = lock_class();
  auto l = manual->acquire(resource("r"), LockOptions{.ttl = 30s, .lock_class = cls});
  ASSERT_TRUE(l);
  // A lock adopted after its safe time is lost at once, by the clock.
  clock.advance(31s);
  auto lease = sched->adopt(std::move(*l));
  ASSERT_TRUE(eventually([&] { return lease.lost(); }));
  EXPECT_EQ(lease.state(), LeaseState::expired);
  // Counted before lost() says so: no waiting for the counts.
  const auto mine = leases.snapshot(cls);
  ASSERT_TRUE(mine);
  EXPECT_EQ(mine->leases_lost_total, 1u);
  const auto service = registry.snapshot(cls);
  ASSERT_TRUE(service);
  EXPECT_EQ(service->leases_lost_total, 0u);
  EXPECT_EQ(service->acquisitions_total, 1u);
}

TEST_F(InjectionTest, ASchedulerRefusesAClockOtherThanItsServices) {
  ManualClock other;
  EXPECT_THROW(LeaseScheduler::create(manual, LeaseSchedulerOptions{.clock = &other}), Error);
  EXPECT_NO_THROW(LeaseScheduler::create(manual, LeaseSchedulerOptions{.clock = &clock}));
}
