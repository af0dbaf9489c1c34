// Small helpers shared by the Redis integration tests.
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/options.hpp"

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

// Collects the client's warning lines (recycled connections, limits hit,
// refused subscriptions); they arrive on the event loop thread.
struct Warnings {
  std::mutex mu;
  std::vector<std::string> lines;
  void attach(redis::ConnectionOptions& o) {
    o.on_warning = [this](const std::string& l) {
      std::lock_guard g(mu);
      lines.push_back(l);
    };
  }
  bool any_contains(const std::string& s) {
    std::lock_guard g(mu);
    for (auto& l : lines)
      if (l.find(s) != std::string::npos) return true;
    return false;
  }
};

}  // namespace jobguard::test
