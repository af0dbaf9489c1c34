// Integration-test fixture: a private redis-server per test (0.1 s), so tests
// can kill, pause or restart it without disturbing each other and ctest can
// run them in parallel.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "jobguard/testing/embedded_redis.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/options.hpp"

namespace jobguard::test {

class RedisTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Options for a client of this test's server, with short deadlines so a
  // failing test fails fast instead of hanging.
  redis::ConnectionOptions options() const;
  // A fresh client (owns its event loop) connected to this test's server.
  std::unique_ptr<redis::Client> make_client() const;
  // A key unique to this test, e.g. "t:RedisClient.Pipelines:k".
  std::string key(const std::string& suffix) const;
  // Runs a command on a separate admin connection (hiredis sync, 2 s timeout).
  std::string admin(const std::string& command) const;

  // CLIENT PAUSE <d> ALL, proved to hold before it returns: a probe on a
  // client of its own times out. The server ends a pause by its wall clock,
  // which can move seconds at once on a VM (a CI run saw a 2.5 s pause answer
  // every call within 0.4 s), so a pause that did not hold is asked for again,
  // up to three times; false (with a test failure) if none held.
  bool pause_clients(std::chrono::milliseconds d) const;

  // Records the fresh server as having kept its lock state (jobguard's
  // explicit opt-out of the data-loss quarantine, trust_new_server), so a
  // test's first grant is not refused for a max TTL. Call it again after a
  // restart only when the test is not about the quarantine.
  void trust_server() const;

  std::unique_ptr<EmbeddedRedis> server;
  // Set to false (before SetUp) by tests of the quarantine itself.
  bool trust_new_server_ = true;
};

// Runs `command` on a fresh connection to host:port (hiredis sync, 2 s
// deadline) and returns the reply as text; throws std::runtime_error when it
// cannot connect. For servers a test runs besides its own (a replica).
std::string redis_command_at(const std::string& host, std::uint16_t port, const std::string& command);

// RedisTest::pause_clients for any server: `probe` connects to host:port
// (the caller's options, so TLS or a password carry over).
bool pause_clients_at(const redis::ConnectionOptions& probe, const std::string& host, std::uint16_t port,
                      std::chrono::milliseconds d);

// MONITOR on a connection of its own (hiredis sync): the order in which the
// server ran commands, across its connections and inside scripts. For tests
// whose claim is about what a client sent before what: that order is fixed
// by the client, while the order in which replies resume its coroutines
// races with the server's round trips.
class RedisMonitor {
 public:
  RedisMonitor(const std::string& host, std::uint16_t port);
  ~RedisMonitor();
  RedisMonitor(const RedisMonitor&) = delete;
  RedisMonitor& operator=(const RedisMonitor&) = delete;
  // The lines read so far and more, until `done` holds for a line just read
  // or a read waits `timeout` for a line that does not come (after which
  // nothing more is read: hiredis gives up a context whose read timed out).
  // Each line as MONITOR prints it, e.g.
  // `1700000000.123456 [0 127.0.0.1:4242] "XACK" "jobs" "g" "1-0"`.
  template <class Pred>
  const std::vector<std::string>& read_until(Pred done,
                                             std::chrono::milliseconds timeout = std::chrono::milliseconds(3000)) {
    while (auto line = next_line(timeout)) {
      lines_.push_back(std::move(*line));
      if (done(lines_.back())) break;
    }
    return lines_;
  }

 private:
  std::optional<std::string> next_line(std::chrono::milliseconds timeout);
  void* ctx_ = nullptr;  // redisContext*, kept out of the header
  std::vector<std::string> lines_;
};

// Waits up to `timeout` for `pred` to hold, polling every 2 ms.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

}  // namespace jobguard::test
