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
  // Until `n` fair waiters are queued on `r` and a grant channel is confirmed
  // by the server, so a release can hand the lock over directly.
  bool fair_queue_ready(const std::string& r, int n) const {
    return test::eventually(
        [&] {
          return admin("LLEN " + svc->keys().queue_key(r)) == std::to_string(n) &&
                 admin("PUBSUB CHANNELS " + svc->keys().prefix() + ":grant:*") != "(array of 0)";
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
