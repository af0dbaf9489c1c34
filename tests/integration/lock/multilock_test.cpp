// All-or-none locks (docs/multilock.md) on a real server and on a real Redis
// Cluster whose keys span slots: every key or none, a contender that finds
// one key held leaves none of the others held (looked up in Redis right after
// its busy answer), per-key fences, no deadlock between opposite orders, one
// lease renewing every key and lost when any key is.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/use_future.hpp>
#include <map>
#include <thread>

#include "fixtures.hpp"
#include "jobguard/async.hpp"
#include "jobguard/error.hpp"
#include "jobguard/multilock.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/redis/client.hpp"
#include "redis/cluster.hpp"
#include "support/cluster_redis.hpp"

using namespace std::chrono_literals;
using jobguard::test::eventually;

namespace jobguard {
namespace {

LockOptions opts(std::chrono::milliseconds ttl = 10s, std::chrono::milliseconds wait = 0ms) {
  LockOptions o;
  o.ttl = ttl;
  o.wait = wait;
  o.fence = true;
  return o;
}

class MultiLockTest : public LockTest {
 protected:
  std::int64_t exists(const std::string& r) const {
    return client->exec(redis::Command{"EXISTS", svc->keys().lock_key(r)}).integer;
  }
  std::string value(const std::string& r) const {
    auto v = client->exec(redis::Command{"GET", svc->keys().lock_key(r)});
    return v.is_nil() ? std::string() : v.str;
  }
};

TEST_F(MultiLockTest, TakesEveryKeyInCanonicalOrderEachWithItsOwnFence) {
  const auto a = resource("a"), b = resource("b"), c = resource("c");
  auto m = acquire_all(*svc, {c, a, b}, opts());
  ASSERT_TRUE(m);
  ASSERT_EQ(m->locks().size(), 3u);
  EXPECT_EQ(m->locks()[0].resource(), a);
  EXPECT_EQ(m->locks()[1].resource(), b);
  EXPECT_EQ(m->locks()[2].resource(), c);
  EXPECT_TRUE(m->held());
  for (const auto& l : m->locks()) {
    EXPECT_EQ(value(l.resource()), l.token());
    ASSERT_TRUE(l.fence());
    // Each key's fence comes from that key's own counter.
    EXPECT_EQ(std::stoll(client->exec(redis::Command{"GET", svc->keys().fence_key(l.resource())}).str), *l.fence());
    EXPECT_EQ(m->fence(l.resource()), l.fence());
  }
  EXPECT_FALSE(m->fence("not-in-the-set"));
  EXPECT_TRUE(m->release());
  for (const auto& r : {a, b, c}) EXPECT_EQ(exists(r), 0) << r;
  EXPECT_FALSE(m->release());
}

TEST_F(MultiLockTest, AContenderThatFindsOneKeyHeldLeavesNoneOfTheOthersHeld) {
  const auto a = resource("a"), m = resource("m"), z = resource("z");
  auto held = svc->acquire(m, opts());
  ASSERT_TRUE(held);
  auto c2 = make_client();
  auto svc2 = LockService::create(*c2);
  // "a" is taken before "m" is found busy, "z" never: after the busy answer
  // neither may be held, and "m" is still its holder's.
  for (int i = 0; i < 20; ++i) {
    EXPECT_FALSE(acquire_all(*svc2, {z, m, a}, opts()));
    EXPECT_EQ(exists(a), 0);
    EXPECT_EQ(exists(z), 0);
    EXPECT_EQ(value(m), held->token());
  }
  // And after a wait that ran out.
  EXPECT_FALSE(acquire_all(*svc2, {a, m, z}, opts(10s, 150ms)));
  EXPECT_EQ(exists(a), 0);
  EXPECT_EQ(exists(z), 0);
  EXPECT_TRUE(held->release());
  auto all = acquire_all(*svc2, {a, m, z}, opts());
  ASSERT_TRUE(all);
  EXPECT_EQ(value(m), all->find(m)->token());
}

TEST_F(MultiLockTest, OnOneServerOneScriptGrantsAllOrWritesNothing) {
  const auto a = resource("a"), m = resource("m");
  auto held = svc->acquire(m, opts());
  ASSERT_TRUE(held);
  auto c2 = make_client();
  auto svc2 = LockService::create(*c2);
  admin("CONFIG RESETSTAT");
  EXPECT_FALSE(acquire_all(*svc2, {a, m}, opts()));
  auto m2 = acquire_all(*svc2, {a, resource("z")}, opts());
  ASSERT_TRUE(m2);
  // What was written (commands a script runs count too): the busy attempt
  // wrote nothing and nothing was rolled back (no DEL); the grant wrote two
  // locks and two fences. Key by key, the busy attempt would have taken "a"
  // (a SET, a fence SET) and deleted it again.
  const auto stats = admin("INFO commandstats");
  EXPECT_NE(stats.find("cmdstat_set:calls=4,"), std::string::npos) << stats;
  EXPECT_EQ(stats.find("cmdstat_del:"), std::string::npos) << stats;
  EXPECT_EQ(value(a), m2->find(a)->token());
}

TEST_F(MultiLockTest, AWaiterGetsEveryKeyOnceTheBusyOneIsReleased) {
  const auto a = resource("a"), b = resource("b");
  auto held = svc->acquire(b, opts());
  ASSERT_TRUE(held);
  // Before the client: a Lock's scope-exit release counts into it from the
  // client's loop after the Lock is gone.
  observe::Registry registry;
  auto c2 = make_client();
  auto svc2 = LockService::create(*c2, LockServiceOptions{.metrics = &registry});
  auto f = async_acquire_all(*svc2, {a, b}, opts(10s, 20s), boost::asio::use_future);
  // It keeps retrying while b is held (busy answers counted), holding nothing.
  ASSERT_TRUE(eventually([&] { return registry.lock_class("default").busy_total.value() >= 2; }));
  EXPECT_EQ(exists(a), 0);
  EXPECT_TRUE(held->release());
  auto m = f.get();
  ASSERT_TRUE(m);
  EXPECT_EQ(value(a), m->find(a)->token());
  EXPECT_EQ(value(b), m->find(b)->token());
}

// The four numbers per class (docs/observability.md): each key of a set
// counts as a mutex's acquire call, grant, hold and release would; a lost
// lease of the set once. The awaitable release answers for every key.
TEST_F(MultiLockTest, TheClassNumbersCountEveryKeyOfTheSet) {
  const auto a = resource("a"), b = resource("b"), c = resource("c");
  observe::Registry registry;  // before the client: scope-exit releases count into it from the loop
  auto c2 = make_client();
  auto svc2 = LockService::create(*c2, LockServiceOptions{.metrics = &registry});
  auto sched2 = LeaseScheduler::create(svc2);
  LockOptions o = opts(1s);
  o.lock_class = "transfer";
  auto& m = registry.lock_class("transfer");
  auto both = acquire_all(*svc2, {a, b}, o);
  ASSERT_TRUE(both);
  EXPECT_EQ(m.acquisitions_total.value(), 2u);
  EXPECT_EQ(m.wait_seconds.snapshot().count, 2u);
  EXPECT_EQ(m.contended_total.value(), 0u);
  EXPECT_FALSE(acquire_all(*svc2, {b, c}, o));  // b is held: busy, nothing taken
  EXPECT_EQ(m.busy_total.value(), 1u);
  EXPECT_EQ(m.wait_seconds.snapshot().count, 4u);
  EXPECT_EQ(m.contended_total.value(), 2u);
  EXPECT_TRUE(async_release(*both, boost::asio::use_future).get());
  EXPECT_EQ(exists(a) + exists(b), 0);
  ASSERT_TRUE(eventually([&] { return m.releases_total.value() == 2; }));
  EXPECT_EQ(m.hold_seconds.snapshot().count, 2u);

  // A lease of the set, taken by the awaitable form, lost with one key.
  auto lease = async_acquire_all(*sched2, {a, c}, o, LeaseOptions{}, boost::asio::use_future).get();
  ASSERT_TRUE(lease);
  EXPECT_EQ(lease->lock_count(), 2u);
  client->exec(redis::Command{"SET", svc->keys().lock_key(c), "intruder", "PX", "10000"});
  ASSERT_TRUE(eventually([&] { return lease->lost(); }, 5s));
  ASSERT_TRUE(eventually([&] { return m.hold_seconds.snapshot().count == 4; }));
  EXPECT_EQ(m.leases_lost_total.value(), 1u);
  EXPECT_EQ(m.acquisitions_total.value(), 4u);
}

TEST_F(MultiLockTest, BadSetsAreRefusedBeforeAnythingIsSent) {
  const auto a = resource("a");
  auto expect_invalid = [&](std::vector<std::string> rs, LockOptions o, const std::string& words) {
    try {
      acquire_all(*svc, std::move(rs), o);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), errc::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_invalid({}, opts(), "no resource");
  expect_invalid({a, resource("b"), a}, opts(), "named twice");
  LockOptions p = opts();
  p.permits = 3;
  expect_invalid({a, resource("b")}, p, "permits");
  LockOptions f = opts();
  f.fair = true;
  expect_invalid({a, resource("b")}, f, "fair");
  expect_invalid({a, "bad{brace"}, opts(), "bad{brace");
  EXPECT_EQ(exists(a), 0);
}

TEST_F(MultiLockTest, OppositeOrdersDoNotDeadlockAndNeverOverlap) {
  const auto a = resource("a"), b = resource("b");
  std::atomic<int> inside{0}, overlaps{0};
  auto worker = [&](std::vector<std::string> set, int rounds, int* done) {
    auto c = make_client();
    auto s = LockService::create(*c);
    for (int i = 0; i < rounds; ++i) {
      auto m = acquire_all(*s, set, opts(10s, 30s));
      if (!m) continue;
      if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
      std::this_thread::sleep_for(1ms);
      inside.fetch_sub(1);
      if (m->release()) ++*done;
    }
  };
  int done1 = 0, done2 = 0;
  std::thread t1(worker, std::vector<std::string>{a, b}, 40, &done1);
  std::thread t2(worker, std::vector<std::string>{b, a}, 40, &done2);
  t1.join();
  t2.join();
  EXPECT_EQ(done1, 40);
  EXPECT_EQ(done2, 40);
  EXPECT_EQ(overlaps.load(), 0);
}

// A server never trusted looks like one restarted empty: in quarantine.
class MultiLockQuarantine : public MultiLockTest {
 protected:
  void SetUp() override {
    trust_new_server_ = false;
    MultiLockTest::SetUp();
  }
};

TEST_F(MultiLockQuarantine, EveryGrantPassesTheQuarantineGate) {
  const auto a = resource("a"), b = resource("b");
  try {
    acquire_all(*svc, {a, b}, opts());
    ADD_FAILURE() << "granted by a server in quarantine";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::server_busy) << e.what();
    EXPECT_NE(std::string(e.what()).find("lost lock state"), std::string::npos) << e.what();
  }
  EXPECT_EQ(exists(a), 0);
  EXPECT_EQ(exists(b), 0);
}

class MultiLeaseTest : public LeaseTest {};

TEST_F(MultiLeaseTest, OneLeaseRenewsEveryKey) {
  const auto a = resource("a"), b = resource("b");
  auto m = acquire_all(*svc, {a, b}, opts(300ms));
  ASSERT_TRUE(m);
  Lease lease = sched->adopt_all(std::move(*m));
  ASSERT_EQ(lease.lock_count(), 2u);
  EXPECT_EQ(lease.lock_at(0).resource(), a);
  EXPECT_EQ(lease.lock_at(1).resource(), b);
  EXPECT_THROW((void)lease.lock_at(2), std::out_of_range);
  // Several TTLs later, both keys are still ours: every renewal renewed both.
  ASSERT_TRUE(eventually([&] { return lease.renewals() >= 6; }, 10s));
  EXPECT_FALSE(lease.lost());
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& l = lease.lock_at(i);
    EXPECT_EQ(client->exec(redis::Command{"GET", l.key()}).str, l.token());
    EXPECT_GT(client->exec(redis::Command{"PTTL", l.key()}).integer, 0);
  }
  EXPECT_TRUE(lease.release());
  EXPECT_EQ(client->exec(redis::Command{"EXISTS", svc->keys().lock_key(a), svc->keys().lock_key(b)}).integer, 0);
}

TEST_F(MultiLeaseTest, LosingOneKeyLosesTheLeaseOnceAndGivesBackTheOthers) {
  const auto a = resource("a"), b = resource("b"), c = resource("c");
  auto m = acquire_all(*svc, {a, b, c}, opts(600ms));
  ASSERT_TRUE(m);
  Lease lease = sched->adopt_all(std::move(*m));
  std::atomic<int> signals{0};
  lease.on_lost([&](LeaseState, const std::string&) { signals.fetch_add(1); });
  // Someone else takes b (an operator's force release, then a new holder).
  client->exec(redis::Command{"SET", svc->keys().lock_key(b), "intruder", "PX", "10000"});
  ASSERT_TRUE(eventually([&] { return lease.lost(); }, 5s));
  EXPECT_EQ(lease.state(), LeaseState::token_gone);
  // The state is published a moment before the stop is requested (the loop's thread).
  EXPECT_TRUE(eventually([&] { return lease.stop_token().stop_requested(); }));
  EXPECT_NE(lease.reason().find(svc->keys().lock_key(b)), std::string::npos) << lease.reason();
  ASSERT_TRUE(eventually([&] { return signals.load() == 1; }));
  // a and c are given back at once; b stays the intruder's.
  ASSERT_TRUE(eventually([&] {
    return client->exec(redis::Command{"EXISTS", svc->keys().lock_key(a), svc->keys().lock_key(c)}).integer == 0;
  }));
  EXPECT_EQ(client->exec(redis::Command{"GET", svc->keys().lock_key(b)}).str, "intruder");
  EXPECT_FALSE(lease.release());
  EXPECT_EQ(signals.load(), 1);
}

// --- a Redis Cluster, the keys on different primaries -------------------------

class ClusterMultiLock : public test::SharedClusterTest {
 protected:
  void SetUp() override {
    client = connect();
    trust_new_server(*client);
    keys = KeyBuilder(fmt::format("ml{}", ++round));
    svc = LockService::create(*client, keys);
  }
  std::unique_ptr<redis::Client> connect() const {
    auto o = redis::parse_url(cluster->url());
    o.command_timeout = 2s;
    o.connect_timeout = 1s;
    auto c = std::make_unique<redis::Client>(o);
    EXPECT_TRUE(c->wait_connected(5s));
    return c;
  }
  std::uint16_t port_of(const std::string& r) { return cluster->primary_of(redis::detail::key_slot(keys.lock_key(r))); }
  // Three resources in canonical order, each on a different primary.
  std::vector<std::string> one_per_shard(const std::string& stem) {
    std::map<std::uint16_t, std::string> by_port;
    for (int i = 0; by_port.size() < 3 && i < 1000; ++i) by_port.emplace(port_of(fmt::format("{}:{}", stem, i)), fmt::format("{}:{}", stem, i));
    std::vector<std::string> out;
    for (auto& [p, r] : by_port) out.push_back(r);
    std::sort(out.begin(), out.end());
    return out;
  }
  long long exists_on_its_primary(const std::string& r) {
    return std::stoll(cluster->on(port_of(r), "EXISTS " + keys.lock_key(r)));
  }
  static inline int round = 0;
  std::unique_ptr<redis::Client> client;
  KeyBuilder keys{"ml"};
  std::shared_ptr<LockService> svc;
};

TEST_F(ClusterMultiLock, AContenderThatFindsOneKeyHeldLeavesNoneHeldAcrossSlots) {
  const auto rs = one_per_shard("stock");
  ASSERT_EQ(rs.size(), 3u);
  auto other = connect();
  auto svc2 = LockService::create(*other, keys);
  auto held = svc2->acquire(rs[1], opts());
  ASSERT_TRUE(held);
  for (int i = 0; i < 10; ++i) {
    EXPECT_FALSE(acquire_all(*svc, {rs[2], rs[1], rs[0]}, opts()));
    EXPECT_EQ(exists_on_its_primary(rs[0]), 0);
    EXPECT_EQ(exists_on_its_primary(rs[2]), 0);
    EXPECT_EQ(exists_on_its_primary(rs[1]), 1);
  }
  EXPECT_TRUE(held->release());
  auto m = acquire_all(*svc, rs, opts());
  ASSERT_TRUE(m);
  for (const auto& r : rs) EXPECT_EQ(exists_on_its_primary(r), 1) << r;
  EXPECT_TRUE(m->release());
  for (const auto& r : rs) EXPECT_EQ(exists_on_its_primary(r), 0) << r;
}

TEST_F(ClusterMultiLock, ResourcesInOneSlotAreGrantedByOneScript) {
  // Two names whose lock keys hash to one slot.
  std::map<std::uint16_t, std::string> by_slot;
  std::string r1, r2;
  for (int i = 0; r2.empty() && i < 100000; ++i) {
    const auto r = fmt::format("same:{}", i);
    auto [it, fresh] = by_slot.emplace(redis::detail::key_slot(keys.lock_key(r)), r);
    if (!fresh) r1 = it->second, r2 = r;
  }
  ASSERT_FALSE(r2.empty());
  const auto port = port_of(r1);
  auto other = connect();
  auto svc2 = LockService::create(*other, keys);
  auto held = svc2->acquire(r2, opts());
  ASSERT_TRUE(held);
  cluster->on(port, "CONFIG RESETSTAT");
  EXPECT_FALSE(acquire_all(*svc, {r1, r2}, opts()));
  EXPECT_EQ(exists_on_its_primary(r1), 0);
  EXPECT_TRUE(held->release());
  auto m = acquire_all(*svc, {r1, r2}, opts());
  ASSERT_TRUE(m);
  // Written: two locks and two fences by the grant, nothing by the busy
  // attempt, and nothing deleted (taken one by one, r1 would have been taken
  // and deleted again).
  const auto stats = cluster->on(port, "INFO commandstats");
  EXPECT_NE(stats.find("cmdstat_set:calls=4,"), std::string::npos) << stats;
  EXPECT_NE(stats.find("cmdstat_del:calls=1,"), std::string::npos) << stats;  // held's release is the one DEL
  EXPECT_EQ(exists_on_its_primary(r1), 1);
  EXPECT_EQ(exists_on_its_primary(r2), 1);
}

TEST_F(ClusterMultiLock, OneLeaseRenewsKeysOnEveryShardAndIsLostWithAnyOfThem) {
  const auto rs = one_per_shard("move");
  auto sched = LeaseScheduler::create(svc);
  auto m = acquire_all(*svc, rs, opts(300ms));
  ASSERT_TRUE(m);
  Lease lease = sched->adopt_all(std::move(*m));
  ASSERT_TRUE(eventually([&] { return lease.renewals() >= 6; }, 10s));
  EXPECT_FALSE(lease.lost());
  for (const auto& r : rs) EXPECT_EQ(exists_on_its_primary(r), 1) << r;
  cluster->on(port_of(rs[2]), "DEL " + keys.lock_key(rs[2]));
  ASSERT_TRUE(eventually([&] { return lease.lost(); }, 5s));
  EXPECT_NE(lease.reason().find(keys.lock_key(rs[2])), std::string::npos) << lease.reason();
  ASSERT_TRUE(eventually([&] { return exists_on_its_primary(rs[0]) == 0 && exists_on_its_primary(rs[1]) == 0; }));
}

TEST_F(ClusterMultiLock, OppositeOrdersAcrossSlotsDoNotDeadlock) {
  const auto rs = one_per_shard("pair");
  std::atomic<int> inside{0}, overlaps{0};
  auto worker = [&](std::vector<std::string> set, int* done) {
    auto c = connect();
    auto s = LockService::create(*c, keys);
    for (int i = 0; i < 20; ++i) {
      auto m = acquire_all(*s, set, opts(10s, 30s));
      if (!m) continue;
      if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
      std::this_thread::sleep_for(1ms);
      inside.fetch_sub(1);
      if (m->release()) ++*done;
    }
  };
  int d1 = 0, d2 = 0;
  std::thread t1(worker, std::vector<std::string>{rs[0], rs[1], rs[2]}, &d1);
  std::thread t2(worker, std::vector<std::string>{rs[2], rs[1], rs[0]}, &d2);
  t1.join();
  t2.join();
  EXPECT_EQ(d1, 20);
  EXPECT_EQ(d2, 20);
  EXPECT_EQ(overlaps.load(), 0);
}

}  // namespace
}  // namespace jobguard
