// Fixtures shared by the lock and lease integration tests.
#pragma once

#include <gtest/gtest.h>

#include <boost/asio/post.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

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
  // Script calls the server has run (EVALSHA, and EVAL after a NOSCRIPT).
  std::int64_t script_calls() const {
    const std::string stats = client->exec(redis::Command{"INFO", "commandstats"}).str;
    std::int64_t n = 0;
    for (const char* cmd : {"cmdstat_evalsha:calls=", "cmdstat_eval:calls="}) {
      const auto at = stats.find(cmd);
      if (at != std::string::npos) n += std::stoll(stats.substr(at + std::strlen(cmd)));
    }
    return n;
  }
  // Attempts started in one turn of the client's loop, so the service can
  // coalesce them; each answer in its attempt's place.
  std::vector<std::optional<Lock>> acquire_in_one_turn(const std::string& r, const std::vector<LockOptions>& opts) {
    auto turn = std::make_shared<Turn<std::optional<Lock>>>(opts.size(), opts.size());
    boost::asio::post(client->get_executor(), [turn, svc = svc, r, opts] {
      for (std::size_t i = 0; i < opts.size(); ++i)
        svc->async_acquire(r, opts[i], [turn, i](const Error& e, std::optional<Lock> l) {
          EXPECT_FALSE(e) << e.what();
          turn->answer(i, std::move(l));
        });
    });
    return turn->wait();
  }
  // Releases of every lock held in `locks` in one turn of the client's loop:
  // 1 ours, 0 not ours (any more), -1 where no lock was held.
  std::vector<int> release_in_one_turn(const std::vector<std::optional<Lock>>& locks) {
    std::vector<const Lock*> held;
    for (const auto& l : locks) held.push_back(l ? &*l : nullptr);
    return release_in_one_turn(held);
  }
  std::vector<int> release_in_one_turn(const std::vector<const Lock*>& locks) {
    std::size_t held = 0;
    for (const auto* l : locks) held += l ? 1 : 0;
    auto turn = std::make_shared<Turn<int>>(locks.size(), held);
    for (std::size_t i = 0; i < locks.size(); ++i)
      if (!locks[i]) turn->got[i] = -1;
    if (held == 0) return turn->wait();
    boost::asio::post(client->get_executor(), [turn, svc = svc, locks] {
      for (std::size_t i = 0; i < locks.size(); ++i) {
        if (!locks[i]) continue;
        svc->async_release_held(*locks[i], [turn, i](const Error& e, bool ok) {
          EXPECT_FALSE(e) << e.what();
          turn->answer(i, ok ? 1 : 0);
        });
      }
    });
    return turn->wait();
  }
  // The answers of one turn's calls; shared with their handlers, which may
  // outlive a wait that gave up.
  template <class T>
  struct Turn {
    Turn(std::size_t n, std::size_t expected) : got(n), left(expected) {
      if (left == 0) all.set_value();
    }
    void answer(std::size_t i, T v) {
      std::lock_guard g(mu);
      got[i] = std::move(v);
      if (--left == 0) all.set_value();
    }
    std::vector<T> wait() {
      EXPECT_EQ(all.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
      std::lock_guard g(mu);
      return std::move(got);
    }
    std::mutex mu;
    std::vector<T> got;
    std::size_t left;
    std::promise<void> all;
  };
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
