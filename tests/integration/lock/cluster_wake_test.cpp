// Lock waiters on a real Redis Cluster are woken by sharded pub/sub:
// each waiter's channel is SSUBSCRIBEd on its slot's primary and the
// release SPUBLISHes there. 3 primaries + 3 replicas per test (ClusterRedis).
//
// How "woken by pub/sub" is told apart from "found it at its next poll": the
// waiters' fallback poll is 30 s (backoff_min = backoff_max = 30 s; a fair
// waiter refreshes its place every 15-30 s) and their wait longer still, while
// the test gives each acquire 10 s after the release. The subscriptions are
// also checked on the servers: PUBSUB SHARDNUMSUB on the channel's primary,
// and no classic subscriber anywhere.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "redis/cluster.hpp"
#include "support/cluster_redis.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using jobguard::test::eventually;

namespace {

// The second element of a [channel, count] reply (PUBSUB SHARDNUMSUB / NUMSUB) on `port`.
long long subscribers_at(std::uint16_t port, const char* command, const std::string& channel) {
  timeval tv{2, 0};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (c == nullptr || c->err) {
    if (c) redisFree(c);
    return -1;
  }
  redisSetTimeout(c, tv);
  auto* r = static_cast<redisReply*>(redisCommand(c, "PUBSUB %s %s", command, channel.c_str()));
  long long n = -1;
  if (r != nullptr && r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[1]->type == REDIS_REPLY_INTEGER)
    n = r->element[1]->integer;
  if (r) freeReplyObject(r);
  redisFree(c);
  return n;
}

// The first of `fs` to be ready within `within`, taken out of it.
std::optional<std::optional<Lock>> first_ready(std::vector<std::future<std::optional<Lock>>>& fs,
                                               std::chrono::milliseconds within) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    for (auto it = fs.begin(); it != fs.end(); ++it) {
      if (it->wait_for(5ms) != std::future_status::ready) continue;
      auto v = it->get();
      fs.erase(it);
      return v;
    }
  }
  return std::nullopt;
}

// The waiters' fallback poll: far beyond the 10 s the test gives a wakeup.
LockOptions slow_poll(LockOptions o) {
  o.backoff_min = 30s;
  o.backoff_max = 30s;
  return o;
}

class ClusterWake : public ::testing::Test {
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
  // One resource per shard: primary port -> resource.
  std::map<std::uint16_t, std::string> one_per_shard(const std::string& stem) {
    std::map<std::uint16_t, std::string> out;
    KeyBuilder keys;
    for (int i = 0; out.size() < 3 && i < 1000; ++i) {
      const std::string r = fmt::format("{}:{}", stem, i);
      out.emplace(cluster->primary_of(redis::detail::key_slot(keys.lock_key(r))), r);
    }
    return out;
  }
  bool no_classic_subscriber(const std::string& channel) {
    for (std::size_t i = 0; i < cluster->size(); ++i)
      if (subscribers_at(cluster->node(i).port(), "NUMSUB", channel) != 0) return false;
    return true;
  }
  std::unique_ptr<test::ClusterRedis> cluster;
};

}  // namespace

TEST_F(ClusterWake, WaitersOnEveryShardAreWokenByTheRelease) {
  redis::Client holder_client(options()), waiter_client(options());
  ASSERT_TRUE(holder_client.wait_connected(5s));
  ASSERT_TRUE(waiter_client.wait_connected(5s));
  trust_new_server(holder_client);
  auto holders = LockService::create(holder_client);
  auto waiters = LockService::create(waiter_client);
  const auto resources = one_per_shard("wake");
  ASSERT_EQ(resources.size(), 3u);
  KeyBuilder keys;
  for (const auto& [primary, r] : resources) {
    SCOPED_TRACE(r);
    auto held = holders->acquire(r, {.ttl = 60s, .fence = true});
    ASSERT_TRUE(held);
    // Two waiters per resource, on one service: one shared subscription.
    std::vector<std::future<std::optional<Lock>>> got;
    for (int w = 0; w < 2; ++w)
      got.push_back(std::async(std::launch::async, [&, r = r] {
        return waiters->acquire(r, slow_poll({.ttl = 5s, .wait = 60s, .fence = true}));
      }));
    ASSERT_TRUE(eventually([&] { return subscribers_at(primary, "SHARDNUMSUB", keys.channel(r)) == 1; }, 10s))
        << "no sharded subscription on the slot's primary 127.0.0.1:" << primary;
    EXPECT_TRUE(no_classic_subscriber(keys.channel(r)));
    const std::int64_t fence = *held->fence();
    ASSERT_TRUE(held->release());
    // Both get it in turn: the first on the release, the second on the
    // first's release.
    for (int w = 0; w < 2; ++w) {
      auto ready = first_ready(got, 10s);
      ASSERT_TRUE(ready) << "a waiter was not woken within 10 s of a release (its poll is 30 s)";
      auto& mine = *ready;
      ASSERT_TRUE(mine);
      EXPECT_GT(*mine->fence(), fence);
      EXPECT_TRUE(mine->release());
    }
  }
}

// A fair release hands the lock straight to the head of the queue: the
// grant channel shares the resource's hash tag, SPUBLISH counts the head's
// subscription on the slot's primary, and the lock holds the head's token
// when the release returns.
TEST_F(ClusterWake, FairHandoffOnEveryShardInQueueOrder) {
  redis::Client holder_client(options()), waiter_client(options());
  ASSERT_TRUE(holder_client.wait_connected(5s));
  ASSERT_TRUE(waiter_client.wait_connected(5s));
  trust_new_server(holder_client);
  auto holders = LockService::create(holder_client);
  auto waiters = LockService::create(waiter_client);
  const auto resources = one_per_shard("fair");
  ASSERT_EQ(resources.size(), 3u);
  KeyBuilder keys;
  for (const auto& [primary, r] : resources) {
    SCOPED_TRACE(r);
    auto held = holders->acquire(r, {.ttl = 60s, .fence = true, .fair = true});
    ASSERT_TRUE(held);
    const auto llen = [&, r = r] { return cluster->on(primary, "LLEN " + keys.queue_key(r)); };
    auto first = std::async(std::launch::async, [&, r = r] {
      return waiters->acquire(r, slow_poll({.ttl = 5s, .wait = 60s, .fence = true, .fair = true}));
    });
    ASSERT_TRUE(eventually([&] { return llen() == "1"; }, 10s));
    auto second = std::async(std::launch::async, [&, r = r] {
      return waiters->acquire(r, slow_poll({.ttl = 5s, .wait = 60s, .fence = true, .fair = true}));
    });
    ASSERT_TRUE(eventually([&] { return llen() == "2"; }, 10s));
    // The service's grant channel for this resource, on its primary.
    const std::string pattern = fmt::format("jobguard:grant:{{{}}}:*", r);
    ASSERT_TRUE(eventually([&] { return cluster->on(primary, "PUBSUB SHARDCHANNELS " + pattern) == "(array of 1)"; },
                           10s))
        << "no sharded grant channel on the slot's primary 127.0.0.1:" << primary;
    const std::int64_t fence = *held->fence();
    ASSERT_TRUE(held->release());
    // Handed over inside the release: the lock is the head's already.
    const std::string after = cluster->on(primary, "GET " + keys.lock_key(r));
    EXPECT_NE(after, "(nil)") << "the release left the lock free instead of handing it to the head";
    ASSERT_EQ(first.wait_for(10s), std::future_status::ready) << "the head was not told of its grant within 10 s";
    auto a = first.get();
    ASSERT_TRUE(a);
    EXPECT_EQ(a->token(), after);
    EXPECT_GT(*a->fence(), fence);
    // The second waiter was queued behind: it gets the lock from the first.
    EXPECT_NE(second.wait_for(200ms), std::future_status::ready);
    ASSERT_TRUE(a->release());
    const std::string after2 = cluster->on(primary, "GET " + keys.lock_key(r));
    ASSERT_EQ(second.wait_for(10s), std::future_status::ready);
    auto b = second.get();
    ASSERT_TRUE(b);
    EXPECT_EQ(b->token(), after2);
    EXPECT_GT(*b->fence(), *a->fence());
    EXPECT_TRUE(b->release());
  }
}

// The waiter's slot moves to another primary while it waits: the old owner
// unsubscribes it (a `sunsubscribe` push), the subscriber asks for the slot
// map and subscribes on the new owner, where the release is published.
TEST_F(ClusterWake, AWaiterFollowsItsSlotToAnotherPrimary) {
  redis::Client holder_client(options()), waiter_client(options());
  ASSERT_TRUE(holder_client.wait_connected(5s));
  ASSERT_TRUE(waiter_client.wait_connected(5s));
  trust_new_server(holder_client);
  auto holders = LockService::create(holder_client);
  auto waiters = LockService::create(waiter_client);
  KeyBuilder keys;
  const std::string r = "moving";
  const auto slot = redis::detail::key_slot(keys.lock_key(r));
  auto held = holders->acquire(r, {.ttl = 60s});
  ASSERT_TRUE(held);
  auto got = std::async(std::launch::async, [&] { return waiters->acquire(r, slow_poll({.ttl = 5s, .wait = 60s})); });
  const std::uint16_t from = cluster->primary_of(slot);
  ASSERT_TRUE(eventually([&] { return subscribers_at(from, "SHARDNUMSUB", keys.channel(r)) == 1; }, 10s));
  std::uint16_t to = 0;
  for (std::size_t i = 0; i < cluster->size(); ++i) {
    const auto p = cluster->node(i).port();
    if (p != from && cluster->on(p, "INFO replication").find("role:master") != std::string::npos) to = p;
  }
  ASSERT_NE(to, 0);
  const std::string from_id = cluster->on(from, "CLUSTER MYID"), to_id = cluster->on(to, "CLUSTER MYID");
  ASSERT_EQ(cluster->on(to, fmt::format("CLUSTER SETSLOT {} IMPORTING {}", slot, from_id)), "OK");
  ASSERT_EQ(cluster->on(from, fmt::format("CLUSTER SETSLOT {} MIGRATING {}", slot, to_id)), "OK");
  ASSERT_EQ(cluster->on(from, fmt::format("MIGRATE 127.0.0.1 {} {} 0 5000", to, keys.lock_key(r))), "OK");
  // The waiter's place in the default-mode line is a key of the same slot;
  // a slot can only be given away without keys.
  const auto line = cluster->on(from, fmt::format("MIGRATE 127.0.0.1 {} {} 0 5000", to, keys.waiters_key(r)));
  ASSERT_TRUE(line == "OK" || line == "NOKEY") << line;
  ASSERT_EQ(cluster->on(from, fmt::format("CLUSTER COUNTKEYSINSLOT {}", slot)), "0");
  for (std::size_t i = 0; i < cluster->size(); ++i) {
    const auto p = cluster->node(i).port();
    if (cluster->on(p, "INFO replication").find("role:master") != std::string::npos) {
      ASSERT_EQ(cluster->on(p, fmt::format("CLUSTER SETSLOT {} NODE {}", slot, to_id)), "OK");
    }
  }
  ASSERT_TRUE(eventually([&] { return subscribers_at(to, "SHARDNUMSUB", keys.channel(r)) == 1; }, 10s))
      << "the waiter's subscription did not follow its slot to 127.0.0.1:" << to;
  EXPECT_EQ(subscribers_at(from, "SHARDNUMSUB", keys.channel(r)), 0);
  ASSERT_TRUE(held->release());
  ASSERT_EQ(got.wait_for(10s), std::future_status::ready) << "not woken within 10 s of the release (poll 30 s)";
  auto mine = got.get();
  ASSERT_TRUE(mine);
  EXPECT_TRUE(mine->release());
}

// CLUSTER FAILOVER of the waiter's shard. The promoted replica is a new
// server process to the shard's lock-state record, so grants pause for
// max_ttl (5 s here) after it: the waiter, refused meanwhile, takes the lock
// the holder released during the pause once it is over. The release may be
// published while the demoted primary, where the waiter listens, is in no
// shard yet (the wake is lost there): the subscriber's look at the slot map
// at its next heartbeat (5 s) moves the channel and the waiter tries again.
// Then on the
// promoted replica a waiter's subscription is placed there and a release
// there wakes it (the poll is 30 s: only the wake can be that fast).
TEST_F(ClusterWake, AWaiterIsWokenAfterItsShardFailsOver) {
  cluster->wait_replicated();
  auto o = options();
  o.lock_max_ttl = 5s;
  redis::Client holder_client(o), waiter_client(o);
  ASSERT_TRUE(holder_client.wait_connected(5s));
  ASSERT_TRUE(waiter_client.wait_connected(5s));
  trust_new_server(holder_client);
  auto holders = LockService::create(holder_client);
  auto waiters = LockService::create(waiter_client);
  KeyBuilder keys;
  const std::string r = "failing:0";
  const auto slot = redis::detail::key_slot(keys.lock_key(r));
  auto held = holders->acquire(r, {.ttl = 5s, .replicas = 1});
  ASSERT_TRUE(held);
  auto got = std::async(std::launch::async, [&] { return waiters->acquire(r, slow_poll({.ttl = 5s, .wait = 60s})); });
  const std::uint16_t old = cluster->primary_of(slot);
  ASSERT_TRUE(eventually([&] { return subscribers_at(old, "SHARDNUMSUB", keys.channel(r)) == 1; }, 10s));
  const std::uint16_t replica = cluster->replica_of(old);
  ASSERT_EQ(cluster->on(replica, "CLUSTER FAILOVER"), "OK");
  ASSERT_TRUE(eventually([&] { return cluster->primary_of(slot) == replica; }, 10s));
  held->release();  // the grant was confirmed on the replica; released there, or expired by now
  ASSERT_EQ(got.wait_for(20s), std::future_status::ready) << "not granted within a heartbeat, the pause and 10 s more";
  auto mine = got.get();
  ASSERT_TRUE(mine);

  // On the promoted replica: the next waiter listens there and is woken by the release.
  auto next = std::async(std::launch::async, [&] { return waiters->acquire(r, slow_poll({.ttl = 5s, .wait = 60s})); });
  ASSERT_TRUE(eventually([&] { return subscribers_at(replica, "SHARDNUMSUB", keys.channel(r)) == 1; }, 10s))
      << "the waiter's subscription is not on the promoted replica 127.0.0.1:" << replica;
  ASSERT_TRUE(mine->release());
  ASSERT_EQ(next.wait_for(10s), std::future_status::ready) << "not woken within 10 s of the release (poll 30 s)";
  auto theirs = next.get();
  ASSERT_TRUE(theirs);
  EXPECT_TRUE(theirs->release());
}

// An ACL user without sharded pub/sub rights: the refused SSUBSCRIBE is
// reported (one line, the server's NOPERM), and the waiter still gets the
// lock by polling.
TEST_F(ClusterWake, ARefusedSsubscribeIsReportedAndTheWaiterPolls) {
  for (std::size_t i = 0; i < cluster->size(); ++i)
    ASSERT_EQ(cluster->on(cluster->node(i).port(), "ACL SETUSER nosub on >pw ~* &* +@all -ssubscribe"), "OK");
  redis::Client admin_client(options());
  ASSERT_TRUE(admin_client.wait_connected(5s));
  trust_new_server(admin_client);
  auto o = options();
  o.user = "nosub";
  o.password = "pw";
  std::vector<std::string> warnings;
  std::mutex mu;
  o.on_warning = [&](const std::string& line) {
    std::lock_guard g(mu);
    warnings.push_back(line);
  };
  redis::Client c(o);
  ASSERT_TRUE(c.wait_connected(5s));
  auto svc = LockService::create(c);
  auto holder = svc->acquire("nosub", {.ttl = 30s});
  ASSERT_TRUE(holder);
  std::thread releaser([&] {
    // Released once the waiter has said it cannot listen.
    eventually([&] { return static_cast<bool>(svc->subscriber_error()); }, 10s);
    holder->release();
  });
  auto got = svc->acquire("nosub", {.ttl = 5s, .wait = 20s, .backoff_max = 50ms});
  releaser.join();
  EXPECT_TRUE(got.has_value()) << "polling must still find the released lock";
  const Error e = svc->subscriber_error();
  EXPECT_EQ(e.code(), errc::permission_denied) << e.what();
  EXPECT_NE(std::string(e.what()).find("NOPERM"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("SSUBSCRIBE"), std::string::npos) << e.what();
  std::lock_guard g(mu);
  bool said = false;
  for (const auto& w : warnings) said = said || w.find("fall back to polling") != std::string::npos;
  EXPECT_TRUE(said) << "the refusal is logged through on_warning";
}

// The subscriber's slot map is stale (a slot moved while none of its
// channels were in it): the SSUBSCRIBE sent to the old owner is answered
// -MOVED, followed to the new owner, and the release there wakes the waiter.
TEST_F(ClusterWake, AStaleSlotMapIsCorrectedByMoved) {
  redis::Client holder_client(options()), waiter_client(options());
  ASSERT_TRUE(holder_client.wait_connected(5s));
  ASSERT_TRUE(waiter_client.wait_connected(5s));
  trust_new_server(holder_client);
  auto holders = LockService::create(holder_client);
  auto waiters = LockService::create(waiter_client);
  KeyBuilder keys;
  // One wait first, so the waiters' subscriber has its map.
  {
    auto held = holders->acquire("first", {.ttl = 30s});
    ASSERT_TRUE(held);
    auto got = std::async(std::launch::async, [&] { return waiters->acquire("first", slow_poll({.ttl = 5s, .wait = 60s})); });
    const auto p = cluster->primary_of(redis::detail::key_slot(keys.lock_key("first")));
    ASSERT_TRUE(eventually([&] { return subscribers_at(p, "SHARDNUMSUB", keys.channel("first")) == 1; }, 10s));
    ASSERT_TRUE(held->release());
    ASSERT_EQ(got.wait_for(10s), std::future_status::ready);
    auto l = got.get();
    ASSERT_TRUE(l);
    EXPECT_TRUE(l->release());
  }
  // Now move the (empty) slot of another resource to another primary.
  const std::string r = "stale";
  const auto slot = redis::detail::key_slot(keys.lock_key(r));
  const std::uint16_t from = cluster->primary_of(slot);
  std::uint16_t to = 0;
  for (std::size_t i = 0; i < cluster->size(); ++i) {
    const auto p = cluster->node(i).port();
    if (p != from && cluster->on(p, "INFO replication").find("role:master") != std::string::npos) to = p;
  }
  ASSERT_NE(to, 0);
  const std::string to_id = cluster->on(to, "CLUSTER MYID");
  for (std::size_t i = 0; i < cluster->size(); ++i) {
    const auto p = cluster->node(i).port();
    if (cluster->on(p, "INFO replication").find("role:master") != std::string::npos) {
      ASSERT_EQ(cluster->on(p, fmt::format("CLUSTER SETSLOT {} NODE {}", slot, to_id)), "OK");
    }
  }
  ASSERT_TRUE(eventually([&] { return cluster->primary_of(slot) == to; }, 10s));
  auto held = holders->acquire(r, {.ttl = 30s});
  ASSERT_TRUE(held);
  EXPECT_EQ(cluster->on(to, "GET " + keys.lock_key(r)), held->token());
  auto got = std::async(std::launch::async, [&] { return waiters->acquire(r, slow_poll({.ttl = 5s, .wait = 60s})); });
  ASSERT_TRUE(eventually([&] { return subscribers_at(to, "SHARDNUMSUB", keys.channel(r)) == 1; }, 10s))
      << "the SSUBSCRIBE did not follow the MOVED to 127.0.0.1:" << to;
  // It went to the old owner first, which refused it (a redirect is a
  // rejected call).
  const std::string stats = cluster->on(from, "INFO commandstats");
  const auto at = stats.find("cmdstat_ssubscribe:");
  ASSERT_NE(at, std::string::npos) << stats;
  const std::string line = stats.substr(at, stats.find('\r', at) - at);
  EXPECT_NE(line.find("rejected_calls="), std::string::npos) << line;
  EXPECT_EQ(line.find("rejected_calls=0,"), std::string::npos) << line;
  ASSERT_TRUE(held->release());
  ASSERT_EQ(got.wait_for(10s), std::future_status::ready) << "not woken within 10 s of the release (poll 30 s)";
  auto mine = got.get();
  ASSERT_TRUE(mine);
  EXPECT_TRUE(mine->release());
}
