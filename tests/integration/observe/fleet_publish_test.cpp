// FleetPublisher and FleetReader against a real redis-server: what one or
// several "processes" (private Registries) publish is what the reader merges,
// per window, on a fake wall clock near the real one (buckets get real
// EXPIREATs, so the clock must not be far in the past).
#include <gtest/gtest.h>

#include <chrono>

#include "jobguard/lock.hpp"
#include "jobguard/observe/fleet.hpp"
#include "jobguard/redis/client.hpp"
#include "support/redis_fixture.hpp"

namespace jobguard::observe {
namespace {

using namespace std::chrono_literals;
using test::RedisTest;

class FleetPublish : public RedisTest {
 protected:
  void SetUp() override {
    RedisTest::SetUp();
    client = make_client();
    // 30 s into the current minute.
    const auto real = std::chrono::duration_cast<std::chrono::seconds>(WallClock::now().time_since_epoch()).count();
    base = (real / 60) * 60 + 30;
    now = WallClock::time_point(std::chrono::seconds(base));
  }

  FleetPublisherOptions pub_opts(Registry& r) {
    FleetPublisherOptions o;
    o.interval = 0ms;  // batches only on flush() and destruction
    o.registry = &r;
    o.now = [this] { return now; };
    return o;
  }
  FleetSnapshot read(std::chrono::minutes w) {
    FleetReaderOptions o;
    o.now = [this] { return now; };
    return FleetReader(*client, o).read(w);
  }

  std::unique_ptr<redis::Client> client;
  std::int64_t base = 0;
  WallClock::time_point now;
};

TEST_F(FleetPublish, TwoProcessesOnOneClassAreMergedByTheReader) {
  Registry a, b;
  FleetPublisher pa(*client, pub_opts(a)), pb(*client, pub_opts(b));
  a.lock_class("billing").acquisitions_total.inc(3);
  a.lock_class("billing").hold_seconds.observe(2ms);
  b.lock_class("billing").acquisitions_total.inc(2);
  b.lock_class("billing").busy_total.inc(5);
  b.lock_class("billing").leases_lost_total.inc();
  b.lock_class("billing").hold_seconds.observe(3s);
  b.lock_class("inventory").acquisitions_total.inc();
  ASSERT_TRUE(pa.flush());
  ASSERT_TRUE(pb.flush());

  const auto s = read(1min);
  ASSERT_EQ(s.classes.size(), 2u);
  const auto* bill = s.find("billing");
  ASSERT_NE(bill, nullptr);
  EXPECT_EQ(bill->counts.acquisitions, 5u);
  EXPECT_EQ(bill->counts.busy, 5u);
  EXPECT_EQ(bill->counts.expired(), 1u);
  EXPECT_EQ(bill->counts.hold_count(), 2u);
  EXPECT_GT(*bill->hold_quantile_seconds(0.99), 2.0);
  EXPECT_DOUBLE_EQ(s.span_seconds, 90);  // one whole minute + 30 s of this one
  EXPECT_EQ(s.find("inventory")->counts.acquisitions, 1u);
}

TEST_F(FleetPublish, ABatchSendsOnlyWhatChangedSinceTheLastOne) {
  Registry r;
  FleetPublisher p(*client, pub_opts(r));
  r.lock_class("billing").acquisitions_total.inc(3);
  ASSERT_TRUE(p.flush());
  ASSERT_TRUE(p.flush());  // nothing new: no double counting, no command
  r.lock_class("billing").acquisitions_total.inc(1);
  ASSERT_TRUE(p.flush());
  EXPECT_EQ(read(1min).find("billing")->counts.acquisitions, 4u);
  EXPECT_EQ(p.stats().batches, 2u);
}

TEST_F(FleetPublish, WindowsSelectTheirMinuteBuckets) {
  Registry r;
  FleetPublisher p(*client, pub_opts(r));
  r.lock_class("billing").acquisitions_total.inc(10);
  ASSERT_TRUE(p.flush());
  now += 3min;
  r.lock_class("billing").acquisitions_total.inc(1);
  ASSERT_TRUE(p.flush());
  EXPECT_EQ(read(1min).find("billing")->counts.acquisitions, 1u);
  EXPECT_EQ(read(5min).find("billing")->counts.acquisitions, 11u);
  const auto series = FleetReader(*client, [this] {
                        FleetReaderOptions o;
                        o.now = [this] { return now; };
                        return o;
                      }()).series(5min);
  ASSERT_EQ(series.minutes.size(), 6u);
  const auto& v = series.classes.at("billing");
  EXPECT_EQ(v[2].acquisitions, 10u);  // three minutes before the last
  EXPECT_EQ(v[5].acquisitions, 1u);
  EXPECT_TRUE(v[3].empty());
}

TEST_F(FleetPublish, EachOfTheFourWindowsAddsTheMinutesInsideIt) {
  // Batches sent 70, 40, 10, 3 minutes before now and now, each a different
  // power of ten, so every window's sum says exactly which minutes it read.
  Registry r;
  FleetPublisher p(*client, pub_opts(r));
  const auto at = now;
  for (auto [ago, n] : {std::pair{70min, 10000}, {40min, 1000}, {10min, 100}, {3min, 10}, {0min, 1}}) {
    now = at - ago;
    r.lock_class("billing").acquisitions_total.inc(static_cast<std::uint64_t>(n));
    ASSERT_TRUE(p.flush());
  }
  now = at;
  const std::pair<std::chrono::minutes, std::uint64_t> want[] = {{1min, 1}, {5min, 11}, {15min, 111}, {60min, 1111}};
  for (const auto& [window, acquisitions] : want) {
    const auto snap = read(window);
    const auto* c = snap.find("billing");
    ASSERT_NE(c, nullptr) << window.count();
    EXPECT_EQ(c->counts.acquisitions, acquisitions) << window.count() << " min";
    // The divisor: the window's whole minutes plus 30 s of the current one.
    EXPECT_DOUBLE_EQ(snap.span_seconds, static_cast<double>(window.count()) * 60 + 30);
    EXPECT_DOUBLE_EQ(c->acquisitions_per_second(), static_cast<double>(acquisitions) / snap.span_seconds);
  }
  // The batch 70 minutes back is past the retention: its bucket is gone from
  // Redis, not merely outside the windows.
  EXPECT_EQ(admin("EXISTS {jobguard:fleet}:m:" + std::to_string(base / 60 - 70) + ":billing"), "0");
}

TEST_F(FleetPublish, APublisherSendsAtMostTheRegistrysClassCap) {
  // A caller passing lock keys as classes: 200 names into a registry capped
  // at 8. The batch (and the fleet index in Redis) holds 8 classes plus the
  // overflow class, however many names were used.
  Registry r(RegistryOptions{.max_classes = 8});
  FleetPublisher p(*client, pub_opts(r));
  for (int i = 0; i < 200; ++i) r.lock_class("invoice:" + std::to_string(i)).acquisitions_total.inc();
  ASSERT_TRUE(p.flush());
  EXPECT_EQ(p.stats().classes_sent, 9u);
  EXPECT_EQ(admin("ZCARD {jobguard:fleet}:classes"), "9");
  const auto snap = read(1min);
  const auto* overflow = snap.find(kOverflowClass);
  ASSERT_NE(overflow, nullptr);
  EXPECT_EQ(overflow->counts.acquisitions, 192u);
}

TEST_F(FleetPublish, BucketsExpireAfterTheRetentionAndIdleClassesLeaveTheIndex) {
  Registry r;
  FleetPublisher p(*client, pub_opts(r));
  r.lock_class("billing").acquisitions_total.inc();
  ASSERT_TRUE(p.flush());
  const std::int64_t m = base / 60;
  const auto ttl = std::stoll(admin("TTL {jobguard:fleet}:m:" + std::to_string(m) + ":billing"));
  // End of the minute (30 s away) + 65 minutes, measured against the real clock.
  EXPECT_GT(ttl, 60 * 65 - 120);
  EXPECT_LE(ttl, 60 * 66 + 60);
  // 70 minutes later another class publishes: billing leaves the index.
  now += 70min;
  r.lock_class("inventory").acquisitions_total.inc();
  ASSERT_TRUE(p.flush());
  EXPECT_EQ(admin("ZCARD {jobguard:fleet}:classes"), "1");
  EXPECT_EQ(read(60min).find("billing"), nullptr);
}

TEST_F(FleetPublish, DestroyingThePublisherSendsTheLastBatch) {
  Registry r;
  {
    auto o = pub_opts(r);
    o.interval = 1h;  // the timer never fires in this test
    FleetPublisher p(*client, o);
    r.lock_class("run").acquisitions_total.inc(2);
    r.lock_class("run").releases_total.inc(2);
  }
  const auto snap = read(1min);  // find() points into it
  const auto* c = snap.find("run");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->counts.acquisitions, 2u);
  EXPECT_EQ(c->counts.releases, 2u);
}

TEST_F(FleetPublish, TheTimerPublishesWithoutAnyCall) {
  Registry r;
  auto o = pub_opts(r);
  o.interval = 20ms;
  FleetPublisher p(*client, o);
  r.lock_class("run").acquisitions_total.inc(7);
  EXPECT_TRUE(test::eventually([&] {
    const auto snap = read(1min);
    const auto* c = snap.find("run");
    return c && c->counts.acquisitions == 7;
  }));
}

TEST_F(FleetPublish, AFailedBatchIsCarriedByTheNextOne) {
  Registry r;
  auto o = pub_opts(r);
  o.timeout = 300ms;
  FleetPublisher p(*client, o);
  r.lock_class("billing").acquisitions_total.inc(4);
  server->stop();
  EXPECT_FALSE(p.flush());
  EXPECT_EQ(p.stats().failures, 1u);
  server->start();
  ASSERT_TRUE(client->wait_connected(5s));
  r.lock_class("billing").acquisitions_total.inc(1);
  EXPECT_TRUE(test::eventually([&] { return p.flush(); }));
  EXPECT_EQ(read(1min).find("billing")->counts.acquisitions, 5u);
}

TEST_F(FleetPublish, RealLocksMoveTheNumbers) {
  // The library path: a LockService on the global registry, a publisher on
  // its default (global) registry, a class unique to this test.
  const std::string cls = "it-fleet-real-locks";
  auto svc = LockService::create(*client);
  LockOptions lo;
  lo.lock_class = cls;
  lo.ttl = 10s;
  FleetPublisherOptions po;
  po.interval = 0ms;
  FleetPublisher p(*client, po);
  {
    auto held = svc->acquire(key("r"), lo);
    ASSERT_TRUE(held);
    EXPECT_FALSE(svc->acquire(key("r"), lo));  // busy
    admin("DEL " + held->key());              // taken from under the holder
    EXPECT_FALSE(held->release());            // release finds the key gone
  }
  ASSERT_TRUE(p.flush());
  const auto s = FleetReader(*client).read(1min);
  const auto* c = s.find(cls);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->counts.attempts, 2u);
  EXPECT_EQ(c->counts.acquisitions, 1u);
  EXPECT_EQ(c->counts.busy, 1u);
  EXPECT_EQ(c->counts.contended, 1u);
  EXPECT_EQ(c->counts.released_not_owner, 1u);
  EXPECT_EQ(c->counts.expired(), 1u);
  EXPECT_EQ(c->counts.hold_count(), 1u);
  EXPECT_DOUBLE_EQ(*c->contention_ratio(), 0.5);
}

}  // namespace
}  // namespace jobguard::observe
