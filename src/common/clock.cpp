#include "jobguard/clock.hpp"

namespace jobguard {

namespace {
class Steady final : public MonotonicClock {
 public:
  time_point now() const noexcept override { return std::chrono::steady_clock::now(); }
};
}  // namespace

const MonotonicClock& MonotonicClock::steady() noexcept {
  // Never destroyed: a lock released by a static's destructor or a loop
  // thread still running at exit must still find it.
  static const Steady* const s = new Steady;
  return *s;
}

}  // namespace jobguard
