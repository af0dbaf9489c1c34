#include <gtest/gtest.h>

#include <chrono>

#include "jobguard/observe/metrics.hpp"

using jobguard::observe::Histogram;
using jobguard::observe::kSecondsBuckets;
using jobguard::observe::Registry;
using jobguard::observe::RegistryOptions;
using namespace std::chrono_literals;

TEST(Histogram, BucketsAreLogSpacedFrom100usTo60s) {
  EXPECT_DOUBLE_EQ(kSecondsBuckets.front(), 0.0001);
  EXPECT_DOUBLE_EQ(kSecondsBuckets.back(), 60.0);
  for (std::size_t i = 1; i < kSecondsBuckets.size(); ++i) {
    const double ratio = kSecondsBuckets[i] / kSecondsBuckets[i - 1];
    EXPECT_GE(ratio, 1.9) << i;
    EXPECT_LE(ratio, 3.1) << i;
  }
}

TEST(Histogram, BoundIsInclusiveLikePrometheusLe) {
  EXPECT_EQ(Histogram::bucket_index(0.0), 0u);
  EXPECT_EQ(Histogram::bucket_index(0.0001), 0u);
  EXPECT_EQ(Histogram::bucket_index(0.00011), 1u);
  EXPECT_EQ(Histogram::bucket_index(0.005), 5u);
  EXPECT_EQ(Histogram::bucket_index(60.0), kSecondsBuckets.size() - 1);
  EXPECT_EQ(Histogram::bucket_index(60.001), kSecondsBuckets.size());
  EXPECT_EQ(Histogram::bucket_index(-1.0), 0u);
}

TEST(Histogram, SnapshotIsCumulativeWithSumAndCount) {
  Histogram h;
  h.observe(3ms);        // (0.0025, 0.005]
  h.observe(3ms);
  h.observe_seconds(2);  // (1, 2.5]
  h.observe(90s);        // +Inf
  const auto s = h.snapshot();
  EXPECT_EQ(s.count, 4u);
  EXPECT_NEAR(s.sum_seconds, 0.006 + 2 + 90, 1e-9);
  EXPECT_EQ(s.cumulative[4], 0u);   // le 0.0025
  EXPECT_EQ(s.cumulative[5], 2u);   // le 0.005
  EXPECT_EQ(s.cumulative[12], 2u);  // le 1
  EXPECT_EQ(s.cumulative[13], 3u);  // le 2.5
  EXPECT_EQ(s.cumulative[17], 3u);  // le 60
  EXPECT_EQ(s.cumulative[18], 4u);  // +Inf
}

TEST(Histogram, NegativeDurationCountsAsZeroNotAsHugeSum) {
  Histogram h;
  h.observe(-5ms);
  const auto s = h.snapshot();
  EXPECT_EQ(s.count, 1u);
  EXPECT_EQ(s.cumulative[0], 1u);
  EXPECT_EQ(s.sum_seconds, 0.0);
}

TEST(Histogram, QuantileOfEmptyHistogramIsUnknown) {
  Histogram h;
  EXPECT_FALSE(h.snapshot().quantile(0.5).has_value());
  EXPECT_FALSE(h.snapshot().quantile(0.99).has_value());
}

TEST(Histogram, QuantileInterpolatesInsideTheBucket) {
  Histogram h;
  for (int i = 0; i < 100; ++i) h.observe(3ms);  // all in (0.0025, 0.005]
  const auto s = h.snapshot();
  EXPECT_NEAR(*s.quantile(0.5), 0.0025 + 0.0025 * 0.5, 1e-12);
  EXPECT_NEAR(*s.quantile(0.99), 0.0025 + 0.0025 * 0.99, 1e-12);
  EXPECT_NEAR(*s.quantile(1.0), 0.005, 1e-12);
}

TEST(Histogram, P99SeesTheSlowTailThatP50Hides) {
  Histogram h;
  for (int i = 0; i < 98; ++i) h.observe(800us);  // (0.0005, 0.001]
  h.observe(8s);                                   // (5, 10]
  h.observe(8s);
  const auto s = h.snapshot();
  EXPECT_NEAR(*s.quantile(0.5), 0.0005 + 0.0005 * (50.0 / 98.0), 1e-12);
  // rank 99 is the first of the two 8 s observations: halfway through (5, 10].
  EXPECT_NEAR(*s.quantile(0.99), 5.0 + 5.0 * 0.5, 1e-9);
}

TEST(Histogram, QuantileInInfBucketReportsLargestFiniteBound) {
  Histogram h;
  h.observe(120s);
  EXPECT_DOUBLE_EQ(*h.snapshot().quantile(0.99), 60.0);
}

TEST(Registry, SameNameGivesSameStableReference) {
  Registry r;
  auto& a = r.lock_class("billing");
  for (int i = 0; i < 100; ++i) r.lock_class("class-" + std::to_string(i));
  auto& b = r.lock_class("billing");
  EXPECT_EQ(&a, &b);
  a.acquisitions_total.inc(2);
  EXPECT_EQ(r.snapshot("billing")->acquisitions_total, 2u);
  EXPECT_FALSE(r.snapshot("never-used").has_value());
}

TEST(Registry, SnapshotIsSortedByClassName) {
  Registry r;
  r.lock_class("zeta");
  r.lock_class("alpha");
  r.lock_class("mid");
  const auto s = r.snapshot();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].lock_class, "alpha");
  EXPECT_EQ(s[1].lock_class, "mid");
  EXPECT_EQ(s[2].lock_class, "zeta");
}

TEST(Registry, KeysPassedAsClassesOverflowIntoOneSeriesInsteadOfGrowingForever) {
  Registry r(RegistryOptions{.max_classes = 2});
  auto& a = r.lock_class("billing");
  auto& b = r.lock_class("inventory");
  auto& c = r.lock_class("invoice:1");
  auto& d = r.lock_class("invoice:2");
  EXPECT_NE(&a, &b);
  EXPECT_EQ(&c, &d);
  EXPECT_EQ(&c, &r.lock_class(jobguard::observe::kOverflowClass));
  c.acquisitions_total.inc();
  d.acquisitions_total.inc();
  const auto s = r.snapshot();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(r.snapshot(jobguard::observe::kOverflowClass)->acquisitions_total, 2u);
  EXPECT_EQ(&a, &r.lock_class("billing"));  // existing classes still resolve
}

TEST(Registry, GlobalIsOneInstance) { EXPECT_EQ(&Registry::global(), &Registry::global()); }
