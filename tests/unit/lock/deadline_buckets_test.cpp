// The lease scheduler's deadline queue on made-up time points.
#include "lock/deadline_buckets.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace std::chrono_literals;
using jobguard::detail::DeadlineBuckets;
using T = DeadlineBuckets<int>::time_point;

namespace {
const T t0 = T(std::chrono::hours(1000));

std::vector<int> take(DeadlineBuckets<int>& q, T until) {
  std::vector<int> got;
  q.take_until(until, [&](auto& e) {
    got.push_back(e.item);
    return true;
  });
  return got;
}
}  // namespace

TEST(DeadlineBuckets, HandsOutEarliestBucketFirstAndWakesAtTheEndOfIt) {
  DeadlineBuckets<int> q(1ms);
  EXPECT_EQ(q.next(), T::max());
  q.push(t0 + 5ms + 300us, 2, 1);
  q.push(t0 + 1ms + 900us, 1, 1);
  q.push(t0 + 5ms, 3, 1);
  EXPECT_EQ(q.size(), 3u);
  // Never early: every entry of the first bucket is due by its end.
  EXPECT_EQ(q.next(), t0 + 2ms);
  EXPECT_EQ(take(q, t0 + 2ms), (std::vector<int>{1}));
  EXPECT_EQ(q.next(), t0 + 6ms);
  // A bucket that begins at or before `until` is handed out whole, in push order.
  EXPECT_EQ(take(q, t0 + 5ms), (std::vector<int>{2, 3}));
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.next(), T::max());
}

TEST(DeadlineBuckets, AnEntryKeptIsStillThereForTheNextTake) {
  DeadlineBuckets<int> q(1ms);
  q.push(t0 + 1ms, 1, 7);
  q.push(t0 + 1ms + 500us, 2, 8);
  std::vector<std::pair<int, std::uint64_t>> seen;
  q.take_until(t0 + 1ms, [&](auto& e) {
    seen.emplace_back(e.item, e.gen);
    return e.item == 1;
  });
  EXPECT_EQ(seen, (std::vector<std::pair<int, std::uint64_t>>{{1, 7}, {2, 8}}));
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(q.next(), t0 + 2ms);
  EXPECT_EQ(take(q, t0 + 10ms), (std::vector<int>{2}));
}

TEST(DeadlineBuckets, TimePointsBeforeTheEpochLandInTheBucketHoldingThem) {
  DeadlineBuckets<int> q(1ms);
  const T before = T(-1500us);  // in [-2 ms, -1 ms)
  q.push(before, 1, 1);
  EXPECT_EQ(q.next(), T(-1ms));
  EXPECT_TRUE(take(q, T(-2ms) - 1ns).empty());
  EXPECT_EQ(take(q, T(-2ms)), (std::vector<int>{1}));
}

TEST(DeadlineBuckets, ClearDropsEveryEntryAndForEachSeesThemAll) {
  DeadlineBuckets<std::string> q(10ms);
  q.push(t0 + 1ms, "a", 1);
  q.push(t0 + 25ms, "b", 2);
  q.push(t0 + 9ms, "c", 3);
  std::string all;
  q.for_each([&](const auto& e) { all += e.item; });
  EXPECT_EQ(all, "acb");
  q.clear();
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.next(), DeadlineBuckets<std::string>::time_point::max());
}
