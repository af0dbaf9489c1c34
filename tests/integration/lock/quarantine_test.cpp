// The data-loss quarantine (docs/lock-safety.md, "Quarantine after lost lock
// state"): a server that lost lock state is refused grants, by every client,
// until a max TTL has passed; a lease granted before the loss is lost at once.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/multilock.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using Clock = std::chrono::steady_clock;
using jobguard::test::eventually;

namespace {

constexpr auto kMaxTtl = 700ms;

class QuarantineTest : public test::RedisTest {
 protected:
  std::shared_ptr<LockService> service(redis::Client& c, std::chrono::milliseconds max_ttl = kMaxTtl) {
    return LockService::create(c, KeyBuilder(), QuarantineOptions{.max_ttl = max_ttl});
  }
  std::string resource(const std::string& s) const {
    return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + ":" + s;
  }
  // The one-line refusal, or "" when granted.
  static std::string refusal(LockService& svc, const std::string& r, Clock::time_point* granted_at = nullptr) {
    try {
      auto l = svc.acquire(r, LockOptions{.ttl = 300ms});
      if (!l) return "busy";
      if (granted_at) *granted_at = Clock::now();
      return "";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::server_busy)) << e.what();
      return e.what();
    }
  }
};

class UntrustedServerTest : public QuarantineTest {
 protected:
  void SetUp() override {
    trust_new_server_ = false;
    QuarantineTest::SetUp();
  }
};

TEST_F(UntrustedServerTest, ANewServerWithoutTheOptOutIsQuarantinedForAMaxTtl) {
  auto c = make_client();
  auto svc = service(*c);
  const auto t0 = Clock::now();
  const std::string why = refusal(*svc, resource("a"));
  EXPECT_NE(why.find("server lost lock state (no lock-state record"), std::string::npos) << why;
  EXPECT_NE(why.find("grants refused for"), std::string::npos) << why;
  // Granted once the quarantine is over, not before.
  Clock::time_point granted{};
  ASSERT_TRUE(eventually([&] { return refusal(*svc, resource("a"), &granted).empty(); }, 10s));
  EXPECT_GE(granted - t0, kMaxTtl);
}

TEST_F(QuarantineTest, ARestartWithoutPersistenceIsQuarantinedForEveryClient) {
  auto c1 = make_client();
  auto c2 = make_client();
  // A quarantine of seconds: the second client's ask must land inside it,
  // and on a loaded host 0.7 s is not always enough.
  auto s1 = service(*c1, 3s);
  auto s2 = service(*c2, 3s);
  ASSERT_EQ(refusal(*s1, resource("a")), "");
  ASSERT_EQ(refusal(*s2, resource("b")), "");
  server->restart();
  // Back on the restarted server first (a try-once acquire on a client that
  // is reconnecting fails at once with not_connected instead).
  ASSERT_TRUE(c1->wait_connected(10s));
  ASSERT_TRUE(c2->wait_connected(10s));
  // The first client to come back starts the quarantine...
  const std::string why = refusal(*s1, resource("a"));
  EXPECT_NE(why.find("server lost lock state"), std::string::npos) << why;
  // ...and the other one, which noticed nothing itself, is refused too.
  std::string why2;
  ASSERT_TRUE(eventually([&] { return !(why2 = refusal(*s2, resource("c"))).empty(); }, 5s)) << "granted during quarantine";
  EXPECT_NE(why2.find("server lost lock state"), std::string::npos) << why2;
  ASSERT_TRUE(eventually([&] { return refusal(*s2, resource("c")).empty(); }, 10s));
}

TEST_F(QuarantineTest, AnAcquireWhoseWaitOutlastsTheQuarantineWaitsItOut) {
  auto c = make_client();
  auto svc = service(*c);
  ASSERT_EQ(refusal(*svc, resource("a")), "");
  server->restart();
  auto l = svc->acquire(resource("a"), LockOptions{.ttl = 300ms, .wait = 10s});
  EXPECT_TRUE(l);
}

// A server that turns into a replica (a failover under way) is refused by
// the gate, naming its role; a waiting acquire asks again within its wait
// instead of failing at once, and is granted once the server is a primary
// again (REPLICAOF NO ONE: the same process, its record intact).
TEST_F(QuarantineTest, AWaitingAcquireWaitsForTheServerToBeAPrimaryAgain) {
  auto c = make_client();
  auto svc = LockService::create(*c, KeyBuilder(), QuarantineOptions{.max_ttl = kMaxTtl, .recheck = 50ms});
  ASSERT_EQ(refusal(*svc, resource("a")), "");
  // A replica of nothing: it keeps its data, answers, and takes no writes.
  admin("REPLICAOF 127.0.0.1 1");
  std::string why;
  ASSERT_TRUE(eventually(
      [&] {
        try {
          if (auto l = svc->acquire(resource("b"), LockOptions{.ttl = 300ms})) return false;
        } catch (const Error& e) {
          why = e.what();  // READONLY first, if the script got there before the check
        }
        return why.find("not a primary") != std::string::npos;
      },
      5s))
      << why;
  auto waiting = std::async(std::launch::async, [&] {
    return svc->acquire(resource("b"), LockOptions{.ttl = 300ms, .wait = 10s});
  });
  EXPECT_EQ(waiting.wait_for(500ms), std::future_status::timeout) << "the waiting acquire gave up at once";
  admin("REPLICAOF NO ONE");
  ASSERT_EQ(waiting.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(waiting.get()) << "not granted once the server was a primary again";
}

TEST_F(QuarantineTest, ATtlAboveTheMaxTtlIsRefused) {
  auto c = make_client();
  auto svc = service(*c);
  try {
    svc->acquire(resource("a"), LockOptions{.ttl = 5s});
    FAIL() << "granted a lease that would outlive the quarantine";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::invalid_argument));
    EXPECT_NE(std::string(e.what()).find("max TTL"), std::string::npos) << e.what();
  }
}

TEST_F(QuarantineTest, AFlushedServerIsQuarantinedAtTheNextRecheck) {
  auto c = make_client();
  auto svc = LockService::create(*c, KeyBuilder(), QuarantineOptions{.max_ttl = kMaxTtl, .recheck = 50ms});
  ASSERT_EQ(refusal(*svc, resource("a")), "");
  admin("FLUSHALL");
  std::string why;
  ASSERT_TRUE(eventually([&] { return !(why = refusal(*svc, resource("a"))).empty(); }, 5s));
  EXPECT_NE(why.find("no lock-state record"), std::string::npos) << why;
}

// Another client found the loss first and wrote the quarantine after this
// client's check, which is still current (no reconnect, recheck far off): a
// script grant (a fenced lock, a semaphore's permit, a writer, an all-or-none
// lock) compares the record's epoch in its script and is refused, where the
// ticket alone would have granted it beside the holder whose key the flush
// took. A try-once
// unfenced SET NX carries no such comparison and waits for the next check
// (docs/lock-safety.md, "Quarantine after lost lock state").
TEST_F(QuarantineTest, AQuarantineAnotherClientWroteAfterThisClientsCheckRefusesItsScriptGrant) {
  const std::vector<LockOptions> kinds = {LockOptions{.ttl = 2s, .fence = true},
                                          LockOptions{.ttl = 2s, .permits = 1},
                                          LockOptions{.ttl = 2s, .mode = LockMode::exclusive}};
  std::vector<std::unique_ptr<redis::Client>> clients;
  std::vector<std::shared_ptr<LockService>> services;
  std::vector<Lock> held;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    clients.push_back(make_client());
    services.push_back(LockService::create(*clients.back(), KeyBuilder(),
                                           QuarantineOptions{.max_ttl = 3s, .recheck = 60s}));
    auto l = services.back()->acquire(resource(std::to_string(i)), kinds[i]);
    ASSERT_TRUE(l) << "kind " << i;
    held.push_back(std::move(*l));
  }
  // And an all-or-none lock of two.
  auto multi_client = make_client();
  auto multi_svc = LockService::create(*multi_client, KeyBuilder(), QuarantineOptions{.max_ttl = 3s, .recheck = 60s});
  const std::vector<std::string> pair = {resource("m1"), resource("m2")};
  auto both = acquire_all(*multi_svc, pair, LockOptions{.ttl = 2s});
  ASSERT_TRUE(both);
  admin("FLUSHALL");
  auto c2 = make_client();
  auto s2 = service(*c2, 3s);
  const std::string found = refusal(*s2, resource("other"));
  ASSERT_NE(found.find("no lock-state record"), std::string::npos) << found;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    auto o = kinds[i];
    o.ttl = 300ms;
    try {
      auto second = services[i]->acquire(resource(std::to_string(i)), o);
      ADD_FAILURE() << "kind " << i << " granted (" << (second ? "held" : "busy")
                    << ") under a check the record no longer matches";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::server_busy)) << "kind " << i << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("no lock-state record"), std::string::npos) << e.what();
    }
  }
  try {
    auto again = acquire_all(*multi_svc, pair, LockOptions{.ttl = 300ms});
    ADD_FAILURE() << "all-or-none granted (" << (again ? "held" : "busy")
                  << ") under a check the record no longer matches";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::server_busy)) << e.what();
    EXPECT_NE(std::string(e.what()).find("no lock-state record"), std::string::npos) << e.what();
  }
}

// A server that kept the lock key (a snapshot) but is another process: the
// holder's renewals still find its token, yet the lease is lost at once.
TEST(QuarantinePersistence, AHolderWhoseServerRestartedFromASnapshotLosesItsLease) {
  EmbeddedRedis server(EmbeddedRedisOptions{.persistence = true});
  server.start();
  redis::ConnectionOptions o;
  o.host = server.host();
  o.port = server.port();
  o.command_timeout = 1s;
  o.connect_timeout = 1s;
  redis::Client c(o);
  ASSERT_TRUE(c.wait_connected(5s));
  trust_new_server(c);
  auto svc = LockService::create(c, KeyBuilder(), QuarantineOptions{.max_ttl = 2s});
  auto sched = LeaseScheduler::create(svc);
  auto lease = sched->acquire("snap:1", LockOptions{.ttl = 2s});
  ASSERT_TRUE(lease);
  ASSERT_EQ(c.exec(redis::Command{"SAVE"}).str, "OK");
  server.restart();
  ASSERT_TRUE(eventually([&] { return lease->lost(); }, 5s)) << "renewals after the restart kept the lease";
  EXPECT_NE(lease->reason().find("lost lock state"), std::string::npos) << lease->reason();
  // The key itself came back from the snapshot: only the epoch told.
  redis::Client admin(o);
  ASSERT_TRUE(admin.wait_connected(5s));
  EXPECT_EQ(admin.exec(redis::Command{"GET", lease->key()}).str, lease->token());
}

TEST(QuarantineEviction, AnEvictingServerIsQuarantinedAfterAnEviction) {
  EmbeddedRedis server(EmbeddedRedisOptions{.extra_args = {"--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"}});
  server.start();
  redis::ConnectionOptions o;
  o.host = server.host();
  o.port = server.port();
  redis::Client c(o);
  ASSERT_TRUE(c.wait_connected(5s));
  trust_new_server(c);
  auto svc = LockService::create(c, KeyBuilder(), QuarantineOptions{.max_ttl = 700ms, .recheck = 60s});
  ASSERT_TRUE(svc->acquire("ev:1", LockOptions{.ttl = 300ms}));
  // Fill past maxmemory: the server evicts.
  const std::string blob(64 * 1024, 'x');
  for (int i = 0; i < 200; ++i) c.exec(redis::Command{"SET", "filler:" + std::to_string(i), blob});
  ASSERT_EQ(c.exec(redis::Command{"INFO", "stats"}).str.find("evicted_keys:0\r"), std::string::npos)
      << "nothing was evicted";
  // The recheck is far off: the grant itself (acquire.lua) notices. Under
  // allkeys-lru the record may be evicted too; either way it is a loss.
  try {
    svc->acquire("ev:2", LockOptions{.ttl = 300ms});
    FAIL() << "granted after an eviction";
  } catch (const Error& e) {
    const std::string why = e.what();
    EXPECT_TRUE(why.find("keys evicted") != std::string::npos || why.find("record evicted") != std::string::npos)
        << why;
  }
}

// A server that did not evict at the gate's check and starts to between two
// checks (an operator's CONFIG SET maxmemory under memory pressure): the
// holder's key is evicted, and a script grant (fenced here) compares the
// eviction count of the check, so it is refused and the check that follows
// quarantines the server, instead of a grant beside the holder.
TEST(QuarantineEviction, AServerThatStartsEvictingBetweenChecksRefusesTheScriptGrant) {
  EmbeddedRedis server;
  server.start();
  redis::ConnectionOptions o;
  o.host = server.host();
  o.port = server.port();
  redis::Client c(o);
  ASSERT_TRUE(c.wait_connected(5s));
  trust_new_server(c);
  auto svc = LockService::create(c, KeyBuilder(), QuarantineOptions{.max_ttl = 700ms, .recheck = 60s});
  auto held = svc->acquire("ev:held", LockOptions{.ttl = 600ms, .fence = true});
  ASSERT_TRUE(held);
  // Memory pressure first (keys without a TTL), then the policy: the keys
  // with a TTL, the holder's lock, are evicted, and the limit lifted again
  // (writes would fail while it stays below what the server holds).
  const std::string blob(64 * 1024, 'x');
  for (int i = 0; i < 100; ++i) c.exec(redis::Command{"SET", "filler:" + std::to_string(i), blob});
  c.exec(redis::Command{"CONFIG", "SET", "maxmemory-policy", "volatile-lru"});
  c.exec(redis::Command{"CONFIG", "SET", "maxmemory", "2mb"});
  c.exec(redis::Command{"PING"});
  c.exec(redis::Command{"CONFIG", "SET", "maxmemory", "0"});
  ASSERT_EQ(c.exec(redis::Command{"EXISTS", "jobguard:lock:{ev:held}"}).integer, 0) << "the holder's key was not evicted";
  try {
    svc->acquire("ev:held", LockOptions{.ttl = 300ms, .fence = true});
    FAIL() << "granted beside a holder whose key was evicted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::server_busy)) << e.what();
    EXPECT_NE(std::string(e.what()).find("keys evicted"), std::string::npos) << e.what();
  }
}

}  // namespace
