// Time as a dependency: the monotonic clock the library reads its deadlines,
// TTL starts and safe times from, behind an interface a test can replace, so a
// test crosses a TTL by moving a clock instead of sleeping.
//
// Who takes one: LockServiceOptions::clock, LeaseSchedulerOptions::clock (and,
// with the same types, the job runner). Default everywhere: MonotonicClock::steady().
// Time points stay std::chrono::steady_clock::time_point, so a Lock's
// acquired_at() and a Lease's deadline() keep their types; a replacement clock
// only chooses which instant "now" is. Timers still run on the host's steady
// clock: the library arms them for (deadline - clock.now()) from now.
//
// Threads: now() may be called from any thread at any time; an implementation
// must be safe for that. The clock must outlive everything it was given to.
#pragma once

#include <atomic>
#include <chrono>

namespace jobguard {

class MonotonicClock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;
  virtual ~MonotonicClock() = default;
  // Never goes backwards.
  virtual time_point now() const noexcept = 0;

  // std::chrono::steady_clock, the default wherever a clock is optional. A
  // member, not a free jobguard::steady_clock(): that name would hide
  // std::chrono::steady_clock from code in namespace jobguard that has
  // `using namespace std::chrono`.
  static const MonotonicClock& steady() noexcept;
};

// A clock that moves only when told to, for tests. Starts at `start` (default:
// an instant far from steady_clock's epoch, so "before the start" is
// representable). Threads: any; advance() and now() are atomic.
class ManualClock final : public MonotonicClock {
 public:
  explicit ManualClock(time_point start = time_point(std::chrono::hours(24 * 365))) noexcept
      : ns_(start.time_since_epoch().count()) {}
  time_point now() const noexcept override { return time_point(duration(ns_.load(std::memory_order_acquire))); }
  // Moves the clock forward by `d` (a negative `d` is ignored: monotonic).
  void advance(duration d) noexcept {
    if (d.count() > 0) ns_.fetch_add(d.count(), std::memory_order_acq_rel);
  }

 private:
  std::atomic<duration::rep> ns_;
};

}  // namespace jobguard
