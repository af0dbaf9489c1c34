#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "jobguard/error.hpp"
#include "jobguard/guard/fence_check.hpp"

using jobguard::guard::FenceCheck;
using jobguard::guard::FenceCompare;

TEST(FenceCheck, FirstTokenForAResourceIsAccepted) {
  FenceCheck f;
  EXPECT_FALSE(f.high_water("invoice:1").has_value());
  EXPECT_TRUE(f.accept("invoice:1", 7));
  EXPECT_EQ(f.high_water("invoice:1"), 7);
}

TEST(FenceCheck, OlderTokenIsRejectedAndLeavesTheMark) {
  FenceCheck f;
  ASSERT_TRUE(f.accept("r", 10));
  EXPECT_FALSE(f.accept("r", 9));
  EXPECT_EQ(f.high_water("r"), 10);
  EXPECT_EQ(f.rejected(), 1u);
}

TEST(FenceCheck, SameTokenIsAcceptedByDefaultSoAHolderCanWriteTwice) {
  FenceCheck f;
  ASSERT_TRUE(f.accept("r", 5));
  EXPECT_TRUE(f.accept("r", 5));
  EXPECT_TRUE(f.accept("r", 6));
  EXPECT_FALSE(f.accept("r", 5)) << "a superseded holder must be refused";
}

TEST(FenceCheck, NewerOnlyRejectsTheSameTokenTwice) {
  FenceCheck f(FenceCompare::newer_only);
  ASSERT_TRUE(f.accept("r", 5));
  EXPECT_FALSE(f.accept("r", 5));
  EXPECT_TRUE(f.accept("r", 6));
}

TEST(FenceCheck, ResourcesAreIndependent) {
  FenceCheck f;
  ASSERT_TRUE(f.accept("a", 100));
  EXPECT_TRUE(f.accept("b", 1));
  EXPECT_FALSE(f.accept("a", 99));
}

TEST(FenceCheck, RequireThrowsStaleFenceNamingTheResource) {
  FenceCheck f;
  f.require("invoice:48291", 3);
  try {
    f.require("invoice:48291", 2);
    FAIL() << "expected stale_fence";
  } catch (const jobguard::Error& e) {
    EXPECT_EQ(e.code(), jobguard::errc::stale_fence);
    EXPECT_EQ(e.next(), jobguard::next_step::restart_attempt);
    EXPECT_NE(std::string(e.what()).find("invoice:48291"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("stale fencing token"), std::string::npos) << e.what();
  }
}

TEST(FenceCheck, ForgetDropsTheMark) {
  FenceCheck f;
  ASSERT_TRUE(f.accept("r", 9));
  f.forget("r");
  EXPECT_TRUE(f.accept("r", 1));
}

// Many threads offer interleaved tokens; the mark must end at the maximum and
// no accepted token may be at or below a mark its thread had already seen.
TEST(FenceCheck, ConcurrentAcceptsNeverLowerTheMark) {
  FenceCheck f(FenceCompare::newer_only);
  constexpr int kThreads = 8, kPer = 5000;
  std::atomic<int> accepted{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < kPer; ++i) {
        const std::int64_t token = static_cast<std::int64_t>(i) * kThreads + t;
        const auto before = f.high_water("r").value_or(-1);
        const bool ok = f.accept("r", token);
        if (ok) {
          accepted++;
          EXPECT_GT(token, before);
        }
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(f.high_water("r"), static_cast<std::int64_t>(kPer - 1) * kThreads + kThreads - 1);
  EXPECT_EQ(static_cast<std::uint64_t>(accepted.load()) + f.rejected(), static_cast<std::uint64_t>(kThreads) * kPer);
}
