// Fixtures shared by the lock and lease integration tests.
#pragma once

#include <gtest/gtest.h>

#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "support/redis_fixture.hpp"

namespace jobguard {

class LockTest : public test::RedisTest {
 protected:
  void SetUp() override {
    RedisTest::SetUp();
    client = make_client();
    svc = LockService::create(*client);
  }
  void TearDown() override {
    svc.reset();
    client.reset();
    RedisTest::TearDown();
  }
  std::string resource(const std::string& s) const {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return std::string(info->name()) + ":" + s;
  }
  // The grant channel in a fair queue entry "<ttl> <fence> <channel> <token>".
  static std::string entry_channel(const std::string& entry) {
    const auto last = entry.rfind(' ');
    const auto before = last == std::string::npos ? last : entry.rfind(' ', last - 1);
    return before == std::string::npos ? std::string() : entry.substr(before + 1, last - before - 1);
  }
  // Until `n` fair waiters are queued on `r` and each one's grant channel has
  // a subscriber, so a release can hand the lock over directly.
  bool fair_queue_ready(const std::string& r, int n) const {
    return test::eventually(
        [&] {
          auto q = client->exec(redis::Command{"LRANGE", svc->keys().queue_key(r), "0", "-1"});
          if (!q.is_array() || q.elements.size() != static_cast<std::size_t>(n)) return false;
          for (const auto& e : q.elements) {
            auto c = client->exec(redis::Command{"PUBSUB", "NUMSUB", entry_channel(e.str)});
            if (!c.is_array() || c.elements.size() != 2 || c.elements[1].integer < 1) return false;
          }
          return true;
        },
        std::chrono::seconds(5));
  }
  std::unique_ptr<redis::Client> client;
  std::shared_ptr<LockService> svc;
};

class LeaseTest : public test::RedisTest {
 protected:
  void SetUp() override {
    RedisTest::SetUp();
    client = make_client();
    svc = LockService::create(*client);
    sched = LeaseScheduler::create(svc);
  }
  void TearDown() override {
    sched.reset();
    svc.reset();
    client.reset();
    RedisTest::TearDown();
  }
  std::string resource(const std::string& s) const {
    return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + ":" + s;
  }
  std::unique_ptr<redis::Client> client;
  std::shared_ptr<LockService> svc;
  std::shared_ptr<LeaseScheduler> sched;
};


}  // namespace jobguard
