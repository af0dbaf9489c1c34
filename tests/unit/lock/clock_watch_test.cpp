#include "lock/clock_watch.hpp"

#include <gtest/gtest.h>

namespace jobguard::detail {
namespace {

using namespace std::chrono_literals;
using TP = std::chrono::steady_clock::time_point;

// A server whose wall clock reads `offset` µs ahead of our monotonic clock;
// a request sent at `at` is answered `rtt` later, the server's TIME read
// `server_delay` after the send.
struct Server {
  std::int64_t offset_us = 1'700'000'000'000'000;
  ClockWatch::us sample(ClockWatch& w, TP at, std::chrono::microseconds rtt = 200us,
                        std::chrono::microseconds server_delay = 100us) const {
    const auto mono = std::chrono::duration_cast<std::chrono::microseconds>((at + server_delay).time_since_epoch());
    return w.observe(mono.count() + offset_us, at, at + rtt);
  }
};

TP t0() { return TP(std::chrono::hours(1)); }

TEST(ClockWatch, ASteadyServerClockIsNoStepWhateverTheRoundTrip) {
  ClockWatch w(60s);
  Server s;
  EXPECT_EQ(s.sample(w, t0()).count(), 0);
  // Replies that take 40 ms, the server's read anywhere inside them.
  for (int i = 1; i <= 100; ++i)
    EXPECT_EQ(s.sample(w, t0() + i * 200ms, 40ms, std::chrono::microseconds(i * 397 % 40000)).count(), 0) << i;
}

TEST(ClockWatch, AForwardStepIsReportedOnceWithItsSize) {
  ClockWatch w(60s);
  Server s;
  s.sample(w, t0());
  s.sample(w, t0() + 200ms);
  s.offset_us += 3'000'000;
  const auto step = s.sample(w, t0() + 400ms);
  EXPECT_GE(step.count(), 2'999'000);
  EXPECT_LE(step.count(), 3'000'000);
  // The new clock is the baseline now.
  EXPECT_EQ(s.sample(w, t0() + 600ms).count(), 0);
}

TEST(ClockWatch, ABackwardStepIsReportedNegative) {
  ClockWatch w(60s);
  Server s;
  s.sample(w, t0());
  s.offset_us -= 2'000'000;
  EXPECT_LE(s.sample(w, t0() + 200ms).count(), -1'999'000);
}

TEST(ClockWatch, AStepWithinTheMarginIsNotReported) {
  ClockWatch w(60s);
  Server s;
  s.sample(w, t0());
  s.offset_us += 3'000;  // 3 ms: inside kMargin
  EXPECT_EQ(s.sample(w, t0() + 200ms).count(), 0);
  s.offset_us += 10'000;
  EXPECT_GT(s.sample(w, t0() + 400ms).count(), 0);
}

TEST(ClockWatch, RateDriftWithinTheAllowanceIsNoStep) {
  ClockWatch w(600s);
  Server s;
  s.sample(w, t0());
  // 500 ppm fast (NTP's largest slew) over 100 s: 50 ms, in 1 s samples.
  for (int i = 1; i <= 100; ++i) {
    s.offset_us += 500;
    EXPECT_EQ(s.sample(w, t0() + i * 1s).count(), 0) << i;
  }
}

TEST(ClockWatch, AStaleBaselineIsReplacedWithoutAVerdict) {
  ClockWatch w(2s);
  Server s;
  s.sample(w, t0());
  s.offset_us += 30'000'000;  // a host asleep for 30 s looks the same
  EXPECT_EQ(s.sample(w, t0() + 3s).count(), 0);
  s.offset_us += 1'000'000;
  EXPECT_GT(s.sample(w, t0() + 3200ms).count(), 0);
}

TEST(ClockWatch, AResetForgetsTheBaseline) {
  ClockWatch w(60s);
  Server s;
  s.sample(w, t0());
  w.reset();
  s.offset_us += 5'000'000;  // another server after a reconnect
  EXPECT_EQ(s.sample(w, t0() + 200ms).count(), 0);
}

}  // namespace
}  // namespace jobguard::detail
