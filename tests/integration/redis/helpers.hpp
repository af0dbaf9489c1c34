// Small helpers shared by the Redis integration tests.
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <string>

#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::test {

using Ms = std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

inline Ms since(SteadyClock::time_point t0) {
  return std::chrono::duration_cast<Ms>(SteadyClock::now() - t0);
}

// Runs `f` expecting a jobguard::Error; returns it (or a default-coded one,
// with a message saying nothing was thrown, so assertions on it fail).
template <class F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return Error(std::error_code{}, "no exception thrown");
}

}  // namespace jobguard::test
