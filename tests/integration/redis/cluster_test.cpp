// The client on a real Redis Cluster: 3 primaries and 3 replicas
// started by the fixture (ClusterRedis). Commands go to their key's primary
// from the slot map (CLUSTER SHARDS); MOVED is followed after a CLUSTER
// FAILOVER and ASK during a slot migration; locks work on every shard.
// Waiters and sharded pub/sub: tests/integration/lock/cluster_wake_test.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/subscriber.hpp"
#include "redis/cluster.hpp"
#include "support/cluster_redis.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using jobguard::test::eventually;

namespace {

class ClusterClient : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster = std::make_unique<test::ClusterRedis>();
    cluster->start();
  }
  redis::ConnectionOptions options() {
    auto o = redis::parse_url(cluster->url());
    o.command_timeout = 2s;
    o.connect_timeout = 1s;
    return o;
  }
  std::string get_on_owner(const std::string& key) {
    return cluster->on(cluster->primary_of(redis::detail::key_slot(key)), "GET " + key);
  }
  std::unique_ptr<test::ClusterRedis> cluster;
};

}  // namespace

TEST_F(ClusterClient, EveryCommandReachesItsKeysPrimary) {
  redis::Client c(options());
  ASSERT_TRUE(c.wait_connected(5s));
  std::set<std::uint16_t> owners;
  constexpr int kKeys = 200;
  int ok = 0;
  for (int i = 0; i < kKeys; ++i) {
    const std::string k = fmt::format("t:k{}", i);
    if (c.exec(redis::Command{"SET", k, std::to_string(i)}).is_ok() && get_on_owner(k) == std::to_string(i)) ++ok;
    owners.insert(cluster->primary_of(redis::detail::key_slot(k)));
  }
  EXPECT_EQ(ok, kKeys);
  EXPECT_EQ(owners.size(), 3u) << "the keys did not spread over the three shards";
}

TEST_F(ClusterClient, LocksOnEveryShardAreExclusiveAndFenced) {
  redis::Client c(options());
  ASSERT_TRUE(c.wait_connected(5s));
  trust_new_server(c);
  auto svc = LockService::create(c);
  std::set<std::uint16_t> shards;
  for (int i = 0; i < 30; ++i) {
    const std::string r = fmt::format("invoice:{}", i);
    auto lock = svc->acquire(r, {.ttl = 5s, .fence = true});
    ASSERT_TRUE(lock) << r;
    EXPECT_FALSE(svc->acquire(r, {.ttl = 5s})) << "a second grant of " << r;
    EXPECT_EQ(get_on_owner(lock->key()), lock->token());
    shards.insert(cluster->primary_of(redis::detail::key_slot(lock->key())));
    EXPECT_TRUE(lock->release());
  }
  EXPECT_EQ(shards.size(), 3u);
  // Waiters are woken by the release (sharded pub/sub on the slot's primary).
  auto held = svc->acquire("shared", {.ttl = 5s});
  ASSERT_TRUE(held);
  std::optional<Lock> waited;
  std::thread t([&] { waited = svc->acquire("shared", {.ttl = 5s, .wait = 4s}); });
  std::this_thread::sleep_for(100ms);
  const auto t0 = std::chrono::steady_clock::now();
  held->release();
  t.join();
  ASSERT_TRUE(waited);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
}

TEST_F(ClusterClient, MovedIsFollowedAfterAClusterFailover) {
  auto o = options();
  o.lock_max_ttl = 1s;
  o.lock_replicas = 1;
  redis::Client c(o);
  ASSERT_TRUE(c.wait_connected(5s));
  trust_new_server(c);
  auto svc = LockService::create(c);
  const std::string k = "t:{failover}";
  ASSERT_TRUE(c.exec(redis::Command{"SET", k, "before"}).is_ok());
  const auto slot = redis::detail::key_slot(k);
  cluster->wait_replicated();
  const std::uint16_t old = cluster->primary_of(slot);
  const std::uint16_t replica = cluster->replica_of(old);
  ASSERT_EQ(cluster->on(replica, "CLUSTER FAILOVER"), "OK");
  ASSERT_TRUE(eventually([&] { return cluster->on(replica, "ROLE").find("master") != std::string::npos ||
                                      cluster->on(old, "INFO replication").find("role:slave") != std::string::npos; },
                         10s));
  ASSERT_TRUE(eventually([&] { return cluster->primary_of(slot) == replica; }, 10s));
  // The old primary now replicates the new one: one replica to confirm.
  ASSERT_TRUE(eventually([&] { return cluster->on(replica, "INFO replication").find("connected_slaves:1") !=
                                      std::string::npos; }, 10s));
  // The client still maps the slot to the old primary, which now answers
  // MOVED. First a confirmed write: it and its WAIT follow the MOVED
  // together (WAIT must run on the node that wrote it), so one replica acks.
  std::promise<std::pair<std::error_code, redis::Confirmation>> confirmed;
  redis::Command first{"SET", k, "confirmed"};
  c.async_exec_confirmed(std::move(first), {.replicas = 1, .timeout = 1000ms},
                         [&](std::error_code ec, redis::Reply, redis::Confirmation cf) { confirmed.set_value({ec, cf}); });
  const auto [cec, conf] = confirmed.get_future().get();
  EXPECT_FALSE(cec) << cec.message();
  EXPECT_EQ(conf.replicas, 1);
  EXPECT_EQ(cluster->on(replica, "GET " + k), "confirmed");
  // A replica-confirmed grant in that slot.
  auto lock = svc->acquire("failover", {.ttl = 1s, .wait = 3s, .fence = true});
  ASSERT_TRUE(lock);
  EXPECT_EQ(redis::detail::key_slot(lock->key()), slot);
  EXPECT_EQ(cluster->on(replica, "GET " + lock->key()), lock->token());
  EXPECT_TRUE(lock->release());
  // Then plain commands.
  EXPECT_TRUE(c.exec(redis::Command{"SET", k, "after"}).is_ok());
  EXPECT_EQ(cluster->on(replica, "GET " + k), "after");
  EXPECT_EQ(c.exec(redis::Command{"GET", k}).str, "after");
}

TEST_F(ClusterClient, AskIsFollowedWhileASlotMigrates) {
  redis::Client c(options());
  ASSERT_TRUE(c.wait_connected(5s));
  const std::string tag = "{migrating}";
  const std::string k1 = "t:" + tag + ":1", k2 = "t:" + tag + ":2";
  const auto slot = redis::detail::key_slot(k1);
  ASSERT_TRUE(c.exec(redis::Command{"SET", k1, "one"}).is_ok());
  const std::uint16_t from = cluster->primary_of(slot);
  std::uint16_t to = 0;
  for (std::size_t i = 0; i < cluster->size(); ++i) {
    const auto p = cluster->node(i).port();
    if (p != from && cluster->on(p, "INFO replication").find("role:master") != std::string::npos) to = p;
  }
  ASSERT_NE(to, 0);
  const std::string from_id = cluster->on(from, "CLUSTER MYID"), to_id = cluster->on(to, "CLUSTER MYID");
  ASSERT_EQ(cluster->on(to, fmt::format("CLUSTER SETSLOT {} IMPORTING {}", slot, from_id)), "OK");
  ASSERT_EQ(cluster->on(from, fmt::format("CLUSTER SETSLOT {} MIGRATING {}", slot, to_id)), "OK");
  ASSERT_EQ(cluster->on(from, fmt::format("MIGRATE 127.0.0.1 {} {} 0 5000", to, k1)), "OK");
  // k1 has moved, the slot has not: the old owner answers ASK.
  EXPECT_EQ(c.exec(redis::Command{"GET", k1}).str, "one");
  // A new key of the migrating slot is created on the importing node.
  EXPECT_TRUE(c.exec(redis::Command{"SET", k2, "two"}).is_ok());
  // The migration ends: every node says the slot is `to`'s, the old owner
  // answers MOVED.
  for (std::size_t i = 0; i < cluster->size(); ++i) {
    const auto p = cluster->node(i).port();
    if (cluster->on(p, "INFO replication").find("role:master") != std::string::npos) {
      EXPECT_EQ(cluster->on(p, fmt::format("CLUSTER SETSLOT {} NODE {}", slot, to_id)), "OK");
    }
  }
  EXPECT_EQ(cluster->on(to, "GET " + k2), "two") << "k2 was not created on the importing node";
  EXPECT_EQ(c.exec(redis::Command{"GET", k2}).str, "two");
  EXPECT_EQ(c.exec(redis::Command{"GET", k1}).str, "one");
  EXPECT_EQ(cluster->primary_of(slot), to);
}

// Redis 7.0+: the slot map comes from CLUSTER SHARDS, and says what CLUSTER
// SLOTS says.
TEST_F(ClusterClient, TheSlotMapComesFromClusterShards) {
  // Calls of CLUSTER SLOTS / SHARDS the seed has served so far.
  const auto calls = [&](const std::string& sub) {
    const std::string stats = cluster->on(cluster->node(0).port(), "INFO commandstats");
    const std::string head = "cmdstat_cluster|" + sub + ":calls=";
    const auto at = stats.find(head);
    return at == std::string::npos ? 0 : std::stoi(stats.substr(at + head.size()));
  };
  const int slots_before = calls("slots"), shards_before = calls("shards");
  redis::Client c(options());
  ASSERT_TRUE(c.wait_connected(5s));
  const auto shards = c.exec(redis::Command{"CLUSTER", "SHARDS"});
  const auto slots = c.exec(redis::Command{"CLUSTER", "SLOTS"});
  auto a = redis::detail::parse_cluster_shards(shards, "127.0.0.1", false);
  auto b = redis::detail::parse_cluster_slots(slots, "127.0.0.1");
  const auto by_first = [](const auto& x, const auto& y) { return x.first < y.first; };
  std::sort(a.begin(), a.end(), by_first);
  std::sort(b.begin(), b.end(), by_first);
  ASSERT_EQ(a.size(), 3u) << redis::to_debug_string(shards);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].last, b[i].last);
    EXPECT_EQ(a[i].host, b[i].host);
    EXPECT_EQ(a[i].port, b[i].port);
  }
  redis::detail::SlotMapSource src;
  EXPECT_EQ(src.parse({}, shards, "127.0.0.1", false).size(), 3u);
  EXPECT_TRUE(src.shards) << "a 7.0 server's reply turned CLUSTER SHARDS off";
  // The client asked the seed for its map with CLUSTER SHARDS, never with
  // CLUSTER SLOTS (the one call of each is the test's own, above).
  EXPECT_GE(calls("shards") - shards_before, 2);
  EXPECT_EQ(calls("slots") - slots_before, 1);
}

// A subscriber's connection to a node none of its channels live on any more
// (the waiters left, a failover or a slot's move took them elsewhere) is
// closed at the second heartbeat without one, not dialled and pinged for the
// process's life; a node that still holds a channel keeps its connection and
// delivers.
TEST_F(ClusterClient, ASubscriberClosesTheConnectionOfANodeItNoLongerUses) {
  auto o = options();
  o.client_name = "sub-idle-test";
  o.subscriber_ping_interval = 100ms;
  redis::Client client(o);
  ASSERT_TRUE(client.wait_connected(5s));
  // Two channels, on two different primaries.
  std::map<std::uint16_t, std::string> by_primary;
  for (int i = 0; by_primary.size() < 2 && i < 1000; ++i) {
    const auto ch = fmt::format("chan:{{idle{}}}", i);
    by_primary.emplace(cluster->primary_of(redis::detail::key_slot(ch)), ch);
  }
  ASSERT_EQ(by_primary.size(), 2u);
  const auto [gone_port, gone_ch] = *by_primary.begin();
  const auto [kept_port, kept_ch] = *std::next(by_primary.begin());
  auto ours_on = [&](std::uint16_t port) {
    const auto list = cluster->on(port, "CLIENT LIST");
    std::size_t n = 0;
    for (auto at = list.find("name=sub-idle-test"); at != std::string::npos; at = list.find("name=sub-idle-test", at + 1))
      ++n;
    return n;
  };
  redis::Subscriber sub(client);
  std::promise<void> ready_gone, ready_kept;
  std::mutex mu;
  std::vector<std::string> got;
  const auto id_gone = sub.subscribe(gone_ch, [](const std::string&, const std::string&) {},
                                     [&] { ready_gone.set_value(); });
  sub.subscribe(
      kept_ch,
      [&](const std::string&, const std::string& m) {
        std::lock_guard<std::mutex> g(mu);
        got.push_back(m);
      },
      [&] { ready_kept.set_value(); });
  ASSERT_EQ(ready_gone.get_future().wait_for(10s), std::future_status::ready);
  ASSERT_EQ(ready_kept.get_future().wait_for(10s), std::future_status::ready);
  const auto with_channel = ours_on(gone_port);
  ASSERT_GE(with_channel, 2u) << "the client's own connection and the subscriber's";
  sub.unsubscribe(id_gone);
  EXPECT_TRUE(eventually([&] { return ours_on(gone_port) == with_channel - 1; }, 10s))
      << ours_on(gone_port) << " connections named sub-idle-test on the node left";
  // Several heartbeats later the node in use still has its connection and delivers.
  std::this_thread::sleep_for(400ms);
  EXPECT_GE(ours_on(kept_port), 2u);
  cluster->on(kept_port, "SPUBLISH " + kept_ch + " hello");
  EXPECT_TRUE(eventually(
      [&] {
        std::lock_guard<std::mutex> g(mu);
        return got.size() == 1 && got[0] == "hello";
      },
      5s));
}
