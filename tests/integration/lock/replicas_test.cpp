// Replica-confirmed grants: a grant, a renewal and a fence are
// confirmed with WAIT on the connection that wrote them before the holder is
// told; too few acknowledgements release the grant (fail-closed) or keep it
// with a warning. Real servers: a primary and a replica started by
// ReplicatedRedis, the replica stopped with SIGSTOP to make it miss writes.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "jobguard/admin.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "lock/quarantine.hpp"
#include "support/redis_fixture.hpp"
#include "support/replicated_redis.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using Clock = std::chrono::steady_clock;
using jobguard::test::eventually;
using jobguard::test::redis_command_at;

namespace {

class ReplicaConfirmed : public ::testing::Test {
 protected:
  void SetUp() override {
    set = std::make_unique<test::ReplicatedRedis>(1);
    set->start();
    redis::Client c(options());
    trust_new_server(c);
  }
  void TearDown() override {
    // The replica may be stopped: the fixture SIGCONTs and kills it.
    set.reset();
  }

  redis::ConnectionOptions options(int replicas = 1) {
    redis::ConnectionOptions o;
    o.host = "127.0.0.1";
    o.port = set->primary().port();
    o.command_timeout = 2s;
    o.connect_timeout = 1s;
    o.lock_replicas = replicas;
    // Generous where the replica is healthy: on a loaded host its
    // acknowledgement can take a while. Tests of refusals shorten it.
    o.lock_replicas_timeout = 1000ms;
    o.on_warning = [this](const std::string& line) {
      std::lock_guard g(mu);
      warnings.push_back(line);
    };
    return o;
  }

  std::string on_replica(const std::string& cmd) { return redis_command_at("127.0.0.1", set->replica(0).port(), cmd); }
  std::string on_primary(const std::string& cmd) { return redis_command_at("127.0.0.1", set->primary().port(), cmd); }
  std::string resource(const std::string& s) const {
    return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + ":" + s;
  }
  std::vector<std::string> warnings_seen() {
    std::lock_guard g(mu);
    return warnings;
  }

  std::unique_ptr<test::ReplicatedRedis> set;
  std::mutex mu;
  std::vector<std::string> warnings;
};

}  // namespace

// WAIT must leave on the connection that wrote the grant: on another one it
// would cover nothing of ours and return at once. Four connections, so a
// WAIT sent elsewhere would show up as a grant the replica does not have yet.
TEST_F(ReplicaConfirmed, EveryGrantIsOnTheReplicaWhenAcquireReturns) {
  auto o = options();
  o.connections = 4;
  redis::Client client(o);
  auto svc = LockService::create(client);
  constexpr int kGrants = 60;
  std::atomic<int> on_replica_count{0}, fences_on_replica{0}, granted{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 3; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kGrants / 3; ++i) {
        const bool fence = i % 2 == 0;
        auto lock = svc->acquire(resource(std::to_string(t) + "-" + std::to_string(i)), {.ttl = 5s, .fence = fence});
        if (!lock) continue;
        ++granted;
        // Read on the replica right after the grant returned: no waiting.
        if (on_replica("GET " + lock->key()) == lock->token()) ++on_replica_count;
        if (fence && on_replica("GET " + svc->keys().fence_key(lock->resource())) == std::to_string(*lock->fence()))
          ++fences_on_replica;
        lock->release();
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(granted.load(), kGrants);
  EXPECT_EQ(on_replica_count.load(), kGrants) << "a grant was reported before the replica had it";
  EXPECT_EQ(fences_on_replica.load(), kGrants / 2) << "a fence was reported before the replica had it";
  EXPECT_TRUE(warnings_seen().empty());
}

TEST_F(ReplicaConfirmed, AGrantWhileTheReplicaIsStoppedIsRefusedAndReleased) {
  // The client's 1 s for the grants the healthy replica confirms; the
  // refused ones ask for 200 ms per lock (LockOptions::replicas_timeout).
  redis::Client client(options());
  auto svc = LockService::create(client);
  ASSERT_TRUE(svc->acquire(resource("warm"), {.ttl = 5s}));  // the gate's check is done
  set->replica(0).pause();
  for (const bool fence : {false, true}) {  // SET NX PX, and acquire.lua
    const std::string r = resource(fence ? "fenced" : "plain");
    const auto t0 = Clock::now();
    try {
      auto lock = svc->acquire(r, {.ttl = 5s, .fence = fence, .replicas_timeout = 200ms});
      FAIL() << "granted without the replica: " << (lock ? lock->token() : "busy");
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.code(), errc::server_busy) << msg;
      EXPECT_EQ(e.source(), error_source::redis);
      EXPECT_NE(msg.find("not confirmed by replicas: 0 of 1 replicas acknowledged within 200 ms (WAIT 1 200)"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find(client.address()), std::string::npos) << msg;
      EXPECT_NE(msg.find(svc->keys().lock_key(r)), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
    EXPECT_GE(Clock::now() - t0, 190ms) << "WAIT did not wait";
    EXPECT_LT(Clock::now() - t0, 1500ms);
    // Released, not left to expire: nobody holds an unconfirmed grant.
    EXPECT_TRUE(eventually([&] { return on_primary("EXISTS " + svc->keys().lock_key(r)) == "0"; }, 2s));
  }
  set->replica(0).resume();
  auto lock = svc->acquire(resource("after"), {.ttl = 5s, .fence = true});
  ASSERT_TRUE(lock) << "the replica is back: grants resume";
  EXPECT_EQ(on_replica("GET " + lock->key()), lock->token());
}

TEST_F(ReplicaConfirmed, WarnKeepsAnUnconfirmedGrantAndSaysSo) {
  // The client's 1 s for the grants the healthy replica confirms; the
  // refused ones ask for 200 ms per lock (LockOptions::replicas_timeout).
  redis::Client client(options());
  auto svc = LockService::create(client);
  ASSERT_TRUE(svc->acquire(resource("warm"), {.ttl = 5s}));
  set->replica(0).pause();
  auto lock = svc->acquire(resource("kept"), {.ttl = 5s,
                                               .lock_class = "reports",
                                               .replicas_timeout = 200ms,
                                               .on_unconfirmed = Unconfirmed::warn});
  ASSERT_TRUE(lock);
  EXPECT_EQ(on_primary("GET " + lock->key()), lock->token());
  const auto w = warnings_seen();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("grant of " + lock->key()), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("kept although not confirmed: 0 of 1 replicas acknowledged"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("lock class 'reports'"), std::string::npos) << w[0];
  set->replica(0).resume();
}

TEST_F(ReplicaConfirmed, MoreReplicasThanTheServerHasIsNeverConfirmed) {
  redis::Client client(options(2));
  auto svc = LockService::create(client);
  try {
    (void)svc->acquire(resource("two"), {.ttl = 5s, .replicas_timeout = 200ms});
    FAIL() << "granted with one replica of the two asked for";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 of 2 replicas acknowledged"), std::string::npos) << e.what();
  }
  // Per lock: replicas = 1 overrides the URL's 2.
  EXPECT_TRUE(svc->acquire(resource("one"), {.ttl = 5s, .replicas = 1}));
  // And 0 turns it off.
  EXPECT_TRUE(svc->acquire(resource("zero"), {.ttl = 5s, .replicas = 0}));
}

// A renewal the replica does not acknowledge does not count: the lease's
// safe time runs out and the lease is lost, as if Redis had not answered.
TEST_F(ReplicaConfirmed, ALeaseWhoseRenewalsAreNotConfirmedIsLostWithinItsTtl) {
  redis::Client client(options());
  auto svc = LockService::create(client);
  auto sched = LeaseScheduler::create(svc);
  auto healthy = sched->acquire(resource("healthy"), LockOptions{.ttl = 600ms});
  ASSERT_TRUE(healthy);
  // Two TTLs at least, and three confirmed renewals however slow the build
  // is to send them: the count is asserted, not a rate.
  std::this_thread::sleep_for(1200ms);
  EXPECT_TRUE(eventually([&] { return healthy->renewals() >= 3u || healthy->lost(); }, 10s)) << healthy->renewals();
  EXPECT_FALSE(healthy->lost()) << healthy->reason();
  // Released first: its renewals' WAIT (the client's 1 s) would hold the
  // shared connection past the other lease's safe time once the replica
  // stops, and that lease would be lost whatever its renewals' replies said.
  healthy->release();

  // A WAIT shorter than the TTL, so renewals come back unconfirmed while the
  // safe time still runs and the fail-closed policy is what refuses them.
  // The grant's own WAIT is as short, and a loaded host's healthy replica can
  // miss it (refused, fail-closed, and released): asked again until granted.
  std::optional<Lease> lease;
  ASSERT_TRUE(eventually(
      [&] {
        try {
          lease = sched->acquire(resource("stopped"), LockOptions{.ttl = 600ms, .replicas_timeout = 100ms});
        } catch (const Error& e) {
          if (e.code() != errc::server_busy) throw;
          return false;
        }
        return lease.has_value();
      },
      10s));
  set->replica(0).pause();
  const auto t0 = Clock::now();
  const auto renewals_at_pause = lease->renewals();
  // How soon is the timeline's arithmetic (LeaseTimeline unit tests, on a
  // fake clock); here the wiring: no renewal the replica did not acknowledge
  // counts, and the safe time runs out (often while one still waits in WAIT,
  // so the reason need not name the replica).
  ASSERT_TRUE(eventually([&] { return lease->lost(); }, 10s)) << "renewals kept counting without the replica";
  std::fprintf(stderr, "[replicas] lost %lld ms after the replica stopped (ttl 600 ms)\n",
               static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()));
  EXPECT_EQ(lease->state(), LeaseState::expired) << lease->reason();
  // One renewal may have been confirmed just before the replica stopped.
  EXPECT_LE(lease->renewals(), renewals_at_pause + 1) << "an unconfirmed renewal was counted";
  set->replica(0).resume();
}

// A fair handoff is written by the releaser's connection; the head confirms
// it from its own (a compare-and-pexpire and WAIT) before it is told.
TEST_F(ReplicaConfirmed, AFairHandoffIsConfirmedByTheHeadBeforeItIsTold) {
  redis::Client client(options());
  auto svc = LockService::create(client);
  const std::string r = resource("fair");
  const LockOptions fair{.ttl = 5s, .wait = 5s, .fence = true, .fair = true};
  for (const bool stopped : {false, true}) {
    auto holder = svc->acquire(r, fair);
    ASSERT_TRUE(holder);
    std::optional<Lock> got;
    Error err;
    std::atomic<bool> done{false};
    std::thread head([&] {
      try {
        got = svc->acquire(r, fair);
      } catch (const Error& e) {
        err = e;
      }
      done = true;
    });
    ASSERT_TRUE(eventually([&] { return on_primary("LLEN " + svc->keys().queue_key(r)) == "1"; }, 3s));
    std::this_thread::sleep_for(50ms);  // its grant channel is subscribed
    if (stopped) set->replica(0).pause();
    holder->release();
    head.join();
    if (!stopped) {
      ASSERT_TRUE(got) << err.what();
      EXPECT_EQ(on_replica("GET " + got->key()), got->token());
      EXPECT_GT(*got->fence(), *holder->fence());
      got->release();
    } else {
      EXPECT_FALSE(got) << "the head was told it holds a handoff the replica never saw";
      EXPECT_EQ(err.code(), errc::server_busy) << err.what();
      EXPECT_NE(std::string(err.what()).find("not confirmed by replicas"), std::string::npos) << err.what();
      EXPECT_TRUE(eventually([&] { return on_primary("EXISTS " + svc->keys().lock_key(r)) == "0"; }, 2s));
      set->replica(0).resume();
    }
  }
}

TEST_F(ReplicaConfirmed, AForceReleaseSaysWhenItsFenceAdvanceIsUnconfirmed) {
  redis::Client client(options());
  auto svc = LockService::create(client);
  auto lock = svc->acquire(resource("stuck"), {.ttl = 5s, .fence = true});
  ASSERT_TRUE(lock);
  lock->detach();
  auto ok = admin::force_release(*svc, lock->resource(), {.reason = "test"});
  EXPECT_EQ(ok.outcome, admin::ForceReleaseResult::Outcome::released);
  EXPECT_TRUE(ok.unconfirmed.empty()) << ok.unconfirmed;
  EXPECT_EQ(on_replica("GET " + svc->keys().fence_key(lock->resource())), std::to_string(ok.new_fence));

  auto again = svc->acquire(resource("stuck"), {.ttl = 5s, .fence = true});
  ASSERT_TRUE(again);
  again->detach();
  set->replica(0).pause();
  auto r = admin::force_release(*svc, again->resource(), {.reason = "test"});
  EXPECT_EQ(r.outcome, admin::ForceReleaseResult::Outcome::released);
  EXPECT_NE(r.unconfirmed.find("0 of 1 replicas acknowledged"), std::string::npos) << r.unconfirmed;
  EXPECT_NE(admin::format_release(again->resource(), r, "").find("warning: not confirmed by replicas"),
            std::string::npos);
  set->replica(0).resume();
}

// This machine's redis-server is 7.0: WAITAOF (7.2+) must be detected as
// absent, even with appendonly on, and WAIT used.
TEST_F(ReplicaConfirmed, WaitaofIsDetectedAbsentOnRedis70) {
  on_primary("CONFIG SET appendonly yes");
  redis::Client client(options());
  auto svc = LockService::create(client);
  auto lock = svc->acquire(resource("v"), {.ttl = 5s});
  ASSERT_TRUE(lock);
  const auto& gate = *std::static_pointer_cast<detail::StateGate>(svc->gate());
  const std::string version = test::info_field(on_primary("INFO server"), "redis_version");
  EXPECT_EQ(gate.server_version(), version);
  EXPECT_TRUE(eventually([&] { return on_primary("INFO persistence").find("aof_enabled:1") != std::string::npos; }));
  EXPECT_EQ(gate.waitaof(), detail::version_at_least(version, 7, 2)) << version;
  if (!detail::version_at_least(version, 7, 2)) {
    EXPECT_FALSE(gate.waitaof());
    EXPECT_EQ(on_replica("GET " + lock->key()), lock->token()) << "confirmed with WAIT";
  }
}

TEST(ServerVersion, SevenTwoAndLaterHaveWaitaof) {
  EXPECT_FALSE(detail::version_at_least("7.0.15", 7, 2));
  EXPECT_FALSE(detail::version_at_least("6.2.14", 7, 2));
  EXPECT_TRUE(detail::version_at_least("7.2.0", 7, 2));
  EXPECT_TRUE(detail::version_at_least("7.10.1", 7, 2));
  EXPECT_TRUE(detail::version_at_least("8.0.1", 7, 2));
  EXPECT_FALSE(detail::version_at_least("", 7, 2));
  EXPECT_FALSE(detail::version_at_least("?", 7, 2));
  EXPECT_FALSE(detail::version_at_least("7", 7, 2));
}

// The client-level primitive: WAIT pipelined behind a write on its connection.
TEST_F(ReplicaConfirmed, TheClientReportsWhatTheReplicasAcknowledged) {
  redis::Client client(options());
  ASSERT_TRUE(client.wait_connected(2s));
  auto confirmed = [&](const std::string& value, std::chrono::milliseconds wait) {
    std::promise<std::pair<std::error_code, redis::Confirmation>> p;
    redis::Command cmd{"SET", "t:confirmed", value};
    client.async_exec_confirmed(std::move(cmd), {.replicas = 1, .timeout = wait},
                                [&p](std::error_code ec, redis::Reply, redis::Confirmation c) { p.set_value({ec, c}); });
    return p.get_future().get();
  };
  auto [ec, c] = confirmed("a", 1000ms);
  EXPECT_FALSE(ec);
  EXPECT_EQ(c.replicas, 1);
  EXPECT_TRUE(c.met({.replicas = 1}));
  set->replica(0).pause();
  const auto t0 = Clock::now();
  auto [ec2, c2] = confirmed("b", 150ms);
  EXPECT_FALSE(ec2);
  EXPECT_EQ(c2.replicas, 0);
  EXPECT_FALSE(c2.met({.replicas = 1}));
  EXPECT_GE(Clock::now() - t0, 140ms);
  set->replica(0).resume();
  // A failed write reports the write's error, and no confirmation.
  std::promise<std::pair<std::error_code, redis::Confirmation>> p;
  redis::Command bad{"INCR", "t:confirmed"};
  client.async_exec_confirmed(std::move(bad), {.replicas = 1, .timeout = 150ms},
                              [&p](std::error_code e, redis::Reply, redis::Confirmation cf) { p.set_value({e, cf}); });
  auto [ec3, c3] = p.get_future().get();
  EXPECT_EQ(ec3, errc::server_error);
  EXPECT_EQ(c3.replicas, -1);
}
