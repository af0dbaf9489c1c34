// Has the server's wall clock stepped? Redis expires keys by its wall clock,
// so a forward step expires every lock with less than the step left while
// its holder still counts its lease on its own monotonic clock. Each sample
// is the server's TIME read between a request's send and its reply: the
// offset (server time - monotonic time) lies in [T - received, T - sent].
// Two samples whose intervals are further apart than the clocks' rate drift
// allows mean the server's clock jumped (docs/lock-safety.md, "Server clock
// steps"). Sans-IO: the gate feeds it samples and acts on what it says.
#pragma once

#include <chrono>
#include <algorithm>
#include <cstdint>

namespace jobguard::detail {

class ClockWatch {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using us = std::chrono::microseconds;

  // `stale`: a baseline older than this is replaced without a verdict. A
  // step before it can no longer shorten a lease that is still alive (every
  // lease is at most max_ttl long), and a host that slept (suspend, a paused
  // VM: the monotonic clock stops, the server's does not) is not a step.
  explicit ClockWatch(std::chrono::milliseconds stale) : stale_(stale) {}

  // The step a sample reveals: > 0 forward, < 0 backward, by at least that
  // much; 0 when the sample agrees with the baseline within the tolerance
  // (kMargin plus kDriftPpm of the time since the baseline). The sample
  // becomes the baseline after a step; otherwise it narrows it.
  us observe(std::int64_t server_us, TimePoint sent, TimePoint received) {
    const std::int64_t lo = server_us - count(received), hi = server_us - count(sent);
    if (hi < lo) return us(0);  // a reply before its send: not a sample
    if (!have_ || received - at_ > stale_ || received < at_) return rebase(lo, hi, received);
    const std::int64_t elapsed = count(received) - count(at_);
    const std::int64_t drift = elapsed * kDriftPpm / 1000000;
    const std::int64_t tolerance = kMargin.count() + drift;
    if (lo > hi_ + tolerance) {
      const us step(lo - hi_);
      rebase(lo, hi, received);
      return step;
    }
    if (hi < lo_ - tolerance) {
      const us step(-(lo_ - hi));
      rebase(lo, hi, received);
      return step;
    }
    // Consistent: keep the tightest interval both samples allow, the old one
    // widened by the rate drift since it was taken.
    const std::int64_t nlo = std::max(lo, lo_ - drift), nhi = std::min(hi, hi_ + drift);
    if (nlo <= nhi) {
      lo_ = nlo;
      hi_ = nhi;
      at_ = received;
    } else {
      rebase(lo, hi, received);
    }
    return us(0);
  }

  void reset() noexcept { have_ = false; }

  // A step smaller than this is not reported: a lease's drift allowance
  // (ttl/100 + 2 ms) covers such a step for a lease of 300 ms or more.
  static constexpr us kMargin{5000};
  // Clock rate difference allowed between the server's wall clock and this
  // host's monotonic clock (NTP slews by at most 500 ppm).
  static constexpr std::int64_t kDriftPpm = 1000;

 private:
  static std::int64_t count(TimePoint t) {
    return std::chrono::duration_cast<us>(t.time_since_epoch()).count();
  }
  us rebase(std::int64_t lo, std::int64_t hi, TimePoint at) {
    lo_ = lo;
    hi_ = hi;
    at_ = at;
    have_ = true;
    return us(0);
  }

  std::chrono::steady_clock::duration stale_;
  bool have_ = false;
  std::int64_t lo_ = 0, hi_ = 0;
  TimePoint at_{};
};

}  // namespace jobguard::detail
