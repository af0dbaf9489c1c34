// The fleet numbers' pure parts: deltas between registry snapshots, the hash
// fields a bucket stores, window math on a fake clock, merging buckets of
// several processes, the four numbers, and the monotonic accumulator serve
// exports (its Prometheus text: tests/unit/ops/fleet_exporter_test.cpp). No
// server.
#include <gtest/gtest.h>

#include <chrono>

#include "jobguard/error.hpp"
#include "jobguard/observe/fleet.hpp"

namespace jobguard::observe {
namespace {

using namespace std::chrono_literals;

// 2026-12-01 12:34:30 UTC as a fake wall clock.
WallClock::time_point at(std::int64_t unix_seconds) { return WallClock::time_point(std::chrono::seconds(unix_seconds)); }
constexpr std::int64_t kNoon = 1796128470;  // ...:30 into a minute

TEST(FleetWindow, UnixMinuteFloorsAlsoBeforeTheEpoch) {
  EXPECT_EQ(unix_minute(at(0)), 0);
  EXPECT_EQ(unix_minute(at(59)), 0);
  EXPECT_EQ(unix_minute(at(60)), 1);
  EXPECT_EQ(unix_minute(at(-1)), -1);
  EXPECT_EQ(unix_minute(at(-60)), -1);
  EXPECT_EQ(unix_minute(at(-61)), -2);
}

TEST(FleetWindow, FiveMinutesReadFiveWholeMinutesAndTheCurrentOne) {
  ASSERT_EQ(kNoon % 60, 30);
  const auto p = plan_window(at(kNoon), 5min);
  const std::int64_t m = kNoon / 60;
  ASSERT_EQ(p.minutes.size(), 6u);
  EXPECT_EQ(p.minutes.front(), m - 5);
  EXPECT_EQ(p.minutes.back(), m);
  EXPECT_DOUBLE_EQ(p.span_seconds, 5 * 60 + 30);
}

TEST(FleetWindow, AtTheTopOfAMinuteTheSpanIsExactlyTheWindow) {
  const std::int64_t t = (kNoon / 60) * 60;
  EXPECT_DOUBLE_EQ(plan_window(at(t), 1min).span_seconds, 60);
  EXPECT_EQ(plan_window(at(t), 60min).minutes.size(), 61u);
}

TEST(FleetWindow, ParseWindowAcceptsTheFourWindowsAndNamesTheBadOne) {
  EXPECT_EQ(parse_window("1m"), 1min);
  EXPECT_EQ(parse_window("5m"), 5min);
  EXPECT_EQ(parse_window("15m"), 15min);
  EXPECT_EQ(parse_window("60m"), 60min);
  EXPECT_EQ(parse_window("1h"), 60min);
  try {
    parse_window("7m");
    FAIL() << "7m accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::invalid_argument));
    EXPECT_NE(std::string(e.what()).find("\"7m\""), std::string::npos) << e.what();
  }
}

TEST(FleetKeysTest, EveryKeyCarriesTheSameHashTag) {
  FleetKeys k("app");
  EXPECT_EQ(k.classes(), "{app:fleet}:classes");
  EXPECT_EQ(k.bucket(29935474, "billing"), "{app:fleet}:m:29935474:billing");
  // A class name with braces cannot move the key to another slot: Redis
  // hashes the first {...}.
  EXPECT_EQ(k.bucket(1, "we{ird}").rfind("{app:fleet}", 0), 0u);
  EXPECT_THROW(FleetKeys("a{b"), Error);
  EXPECT_THROW(FleetKeys(""), Error);
}

LockClassSnapshot snap_of(Registry& r, const char* name) { return *r.snapshot(name); }

TEST(FleetDelta, CountsBetweenTwoSnapshotsAreWhatHappenedInBetween) {
  Registry r;
  auto& m = r.lock_class("billing");
  m.acquisitions_total.inc(2);
  m.hold_seconds.observe(3ms);
  m.wait_seconds.observe(1ms);
  const auto first = snap_of(r, "billing");
  const FleetCounts d0 = counts_between(first, nullptr);
  EXPECT_EQ(d0.acquisitions, 2u);
  EXPECT_EQ(d0.hold_count(), 1u);
  EXPECT_EQ(d0.attempts, 1u);  // the wait histogram counts acquire calls

  m.acquisitions_total.inc();
  m.busy_total.inc(4);
  m.contended_total.inc();
  m.leases_lost_total.inc();
  m.released_not_owner_total.inc(2);
  m.hold_seconds.observe(2s);
  m.hold_seconds.observe(2s);
  m.rate_limited_total.inc(2);
  m.rate_limit_wait_ms_total.inc(300);
  m.concurrency_limited_total.inc();
  m.concurrency_limit_wait_ms_total.inc(70);
  const auto second = snap_of(r, "billing");
  const FleetCounts d = counts_between(second, &first);
  EXPECT_EQ(d.acquisitions, 1u);
  EXPECT_EQ(d.busy, 4u);
  EXPECT_EQ(d.contended, 1u);
  EXPECT_EQ(d.attempts, 0u);
  EXPECT_EQ(d.expired(), 3u);
  EXPECT_EQ(d.hold_count(), 2u);
  EXPECT_EQ(d.hold_buckets[Histogram::bucket_index(2.0)], 2u);
  EXPECT_EQ(d.hold_buckets[Histogram::bucket_index(0.003)], 0u);
  EXPECT_EQ(d.hold_sum_ns, 4'000'000'000u);
  EXPECT_EQ(d.rate_limited, 2u);
  EXPECT_EQ(d.rate_limit_wait_ms, 300u);
  EXPECT_EQ(d.concurrency_limited, 1u);
  EXPECT_EQ(d.concurrency_limit_wait_ms, 70u);
  EXPECT_TRUE(counts_between(second, &second).empty());
}

TEST(FleetFields, RoundTripKeepsEveryCountAndSkipsZeros) {
  FleetCounts c;
  c.attempts = 7;
  c.acquisitions = 5;
  c.busy = 2;
  c.leases_lost = 1;
  c.hold_buckets[3] = 4;
  c.hold_buckets[kSecondsBuckets.size()] = 1;  // +Inf
  c.wait_buckets[0] = 9;
  c.hold_sum_ns = 123456789;
  c.rate_limited = 3;
  c.rate_limit_wait_ms = 4500;
  c.concurrency_limited = 6;
  c.concurrency_limit_wait_ms = 80;
  const auto fields = c.to_fields();
  for (const auto& [name, v] : fields) EXPECT_NE(v, 0u) << name;
  std::vector<std::pair<std::string, std::string>> text;
  for (const auto& [name, v] : fields) text.emplace_back(name, std::to_string(v));
  text.emplace_back("from_a_newer_version", "5");
  text.emplace_back("h999", "5");
  text.emplace_back("acq_garbage", "x");
  const FleetCounts back = FleetCounts::from_fields(text);
  EXPECT_EQ(back.attempts, 7u);
  EXPECT_EQ(back.acquisitions, 5u);
  EXPECT_EQ(back.busy, 2u);
  EXPECT_EQ(back.leases_lost, 1u);
  EXPECT_EQ(back.hold_buckets, c.hold_buckets);
  EXPECT_EQ(back.wait_buckets, c.wait_buckets);
  EXPECT_EQ(back.hold_sum_ns, 123456789u);
  EXPECT_EQ(back.rate_limited, 3u);
  EXPECT_EQ(back.rate_limit_wait_ms, 4500u);
  EXPECT_EQ(back.concurrency_limited, 6u);
  EXPECT_EQ(back.concurrency_limit_wait_ms, 80u);
  EXPECT_TRUE(counts_minus(back, c).empty());
}

TEST(FleetMerge, BucketsOfSeveralProcessesMergeIntoOneHistogram) {
  // Process A holds for ~1 ms, process B for ~1 s: the merged p99 is B's,
  // the merged p50 is A's, and the average weighs both.
  FleetCounts a, b;
  a.hold_buckets[Histogram::bucket_index(0.001)] = 99;
  a.hold_sum_ns = 99 * 1'000'000ull;
  b.hold_buckets[Histogram::bucket_index(1.0)] = 1;
  b.hold_sum_ns = 1'000'000'000ull;
  FleetClassStats s;
  s.counts += a;
  s.counts += b;
  s.span_seconds = 60;
  EXPECT_EQ(s.counts.hold_count(), 100u);
  EXPECT_LE(*s.hold_quantile_seconds(0.5), 0.001);
  EXPECT_GT(*s.hold_quantile_seconds(0.995), 0.5);
  EXPECT_NEAR(*s.hold_avg_seconds(), (0.099 + 1.0) / 100, 1e-9);
}

TEST(FleetFourNumbers, RatesAreCountsOverTheSpan) {
  FleetClassStats s;
  s.span_seconds = 120;
  s.counts.acquisitions = 240;
  s.counts.attempts = 300;
  s.counts.contended = 75;
  s.counts.busy = 400;  // waiters poll: busy answers exceed contended calls
  s.counts.leases_lost = 3;
  s.counts.released_not_owner = 1;
  EXPECT_DOUBLE_EQ(s.acquisitions_per_second(), 2.0);
  EXPECT_DOUBLE_EQ(*s.contention_ratio(), 0.25);
  EXPECT_DOUBLE_EQ(s.expired_per_minute(), 2.0);
  FleetClassStats idle;
  idle.span_seconds = 60;
  EXPECT_FALSE(idle.contention_ratio());
  EXPECT_FALSE(idle.hold_avg_seconds());
  EXPECT_FALSE(idle.hold_quantile_seconds(0.99));
}

FleetSeries series_of(std::vector<std::int64_t> minutes, const std::string& cls, std::vector<std::uint64_t> acq) {
  FleetSeries s;
  s.minutes = std::move(minutes);
  auto& v = s.classes[cls];
  for (auto a : acq) {
    FleetCounts c;
    c.acquisitions = a;
    v.push_back(c);
  }
  return s;
}

TEST(FleetAccumulatorTest, ReReadingABucketAddsOnlyWhatItGained) {
  FleetAccumulator acc;
  acc.add(series_of({10, 11, 12}, "run", {5, 3, 1}));
  EXPECT_EQ(acc.totals().at("run").acquisitions, 9u);
  // Minute 12 gained 2, a late batch added 1 to minute 11, minute 13 begins.
  acc.add(series_of({11, 12, 13}, "run", {4, 3, 6}));
  EXPECT_EQ(acc.totals().at("run").acquisitions, 18u);
  // Nothing new: nothing added.
  acc.add(series_of({11, 12, 13}, "run", {4, 3, 6}));
  EXPECT_EQ(acc.totals().at("run").acquisitions, 18u);
}

TEST(FleetAccumulatorTest, ABucketThatShrankAddsNothingSoTheCounterNeverGoesDown) {
  FleetAccumulator acc;
  acc.add(series_of({10, 11}, "run", {5, 5}));
  acc.add(series_of({10, 11}, "run", {0, 0}));  // Redis restarted empty
  EXPECT_EQ(acc.totals().at("run").acquisitions, 10u);
  acc.add(series_of({10, 11}, "run", {0, 2}));
  EXPECT_EQ(acc.totals().at("run").acquisitions, 12u);
}

TEST(FleetAccumulatorTest, ForgottenMinutesAreNotCountedAgainByALongerRead) {
  FleetAccumulator acc;
  acc.add(series_of({10, 11, 12}, "run", {5, 3, 1}));
  acc.add(series_of({12, 13}, "run", {1, 1}));  // 10 and 11 are forgotten now
  EXPECT_EQ(acc.totals().at("run").acquisitions, 10u);
  // After an outage the exporter reads further back, reaching 10 and 11 again.
  acc.add(series_of({10, 11, 12, 13, 14}, "run", {5, 3, 1, 1, 2}));
  EXPECT_EQ(acc.totals().at("run").acquisitions, 12u);
}

TEST(FleetAccumulatorTest, MemoryStaysOneWindowPerClassHoweverLongItRuns) {
  // A day of serve's reads, one per minute, each the last 61 minutes: the
  // remembered buckets never exceed one window per class, and the totals
  // count every minute exactly once.
  FleetAccumulator acc;
  std::uint64_t published = 0;
  for (std::int64_t now = 1000; now < 1000 + 24 * 60; ++now) {
    std::vector<std::int64_t> minutes;
    std::vector<std::uint64_t> counts;
    for (std::int64_t m = now - 60; m <= now; ++m) {
      minutes.push_back(m);
      counts.push_back(m % 3 + 1);  // each minute's bucket, the same on every read
    }
    published += static_cast<std::uint64_t>(now % 3 + 1);
    auto s = series_of(minutes, "run", counts);
    s.classes["other"] = s.classes["run"];
    acc.add(s);
    ASSERT_LE(acc.tracked_buckets(), 2u * 61u) << "at minute " << now;
  }
  // The first read also brought in the 60 minutes before it.
  std::uint64_t before = 0;
  for (std::int64_t m = 1000 - 60; m < 1000; ++m) before += static_cast<std::uint64_t>(m % 3 + 1);
  EXPECT_EQ(acc.totals().at("run").acquisitions, published + before);
  EXPECT_EQ(acc.totals().at("other").acquisitions, published + before);
}

}  // namespace
}  // namespace jobguard::observe
