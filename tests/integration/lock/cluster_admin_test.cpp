// The operator's tools on a real Redis Cluster (3 primaries, one cluster for
// the suite): `locks ls` must see every shard's locks (SCAN sees only the
// node it runs on), and a force release — whose script must touch one slot
// only — is audited in its resource's slot and read back with the rest.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <thread>

#include "jobguard/admin.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/rwlock.hpp"
#include "redis/cluster.hpp"
#include "support/cluster_redis.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;

namespace {

class ClusterAdmin : public test::SharedClusterTest {
 protected:
  void SetUp() override {
    auto o = redis::parse_url(cluster->url());
    o.command_timeout = 2s;
    o.connect_timeout = 1s;
    client = std::make_unique<redis::Client>(o);
    ASSERT_TRUE(client->wait_connected(5s));
    trust_new_server(*client);
    keys = KeyBuilder(fmt::format("adm{}", ++round));
    svc = LockService::create(*client, keys);
  }
  // One resource per shard, by the port of the primary serving it.
  std::map<std::uint16_t, std::string> one_per_shard(const std::string& stem) {
    std::map<std::uint16_t, std::string> out;
    for (int i = 0; out.size() < 3 && i < 1000; ++i) {
      const std::string r = fmt::format("{}:{}", stem, i);
      out.emplace(cluster->primary_of(redis::detail::key_slot(keys.lock_key(r))), r);
    }
    return out;
  }
  static inline int round = 0;
  std::unique_ptr<redis::Client> client;
  KeyBuilder keys{"adm"};
  std::shared_ptr<LockService> svc;
};

}  // namespace

TEST_F(ClusterAdmin, PrimariesNamesEveryShardAndANodeCallRunsOnThatNode) {
  const auto primaries = client->primaries();
  ASSERT_EQ(primaries.size(), 3u);
  std::set<std::string> expected;
  for (std::uint16_t slot : {0, 8000, 16383}) expected.insert(fmt::format("127.0.0.1:{}", cluster->primary_of(slot)));
  EXPECT_EQ(std::set<std::string>(primaries.begin(), primaries.end()), expected);
  // A key per shard: each node's DBSIZE counts its own key only.
  const auto per_shard = one_per_shard("dbsize");
  for (const auto& [port, r] : per_shard) client->exec(redis::Command{"SET", keys.lock_key(r), "x", "PX", "60000"});
  for (const auto& [port, r] : per_shard) {
    const auto node = fmt::format("127.0.0.1:{}", port);
    EXPECT_EQ(client->exec(redis::Command{"EXISTS", keys.lock_key(r)}, {.node = node}).integer, 1) << node;
    EXPECT_EQ(std::stoll(cluster->on(port, "EXISTS " + keys.lock_key(r))), 1);
  }
  // A node that is not host:port is the caller's mistake, named.
  try {
    client->exec(redis::Command{"DBSIZE"}, {.node = "no-port"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("no-port"), std::string::npos) << e.what();
  }
}

TEST_F(ClusterAdmin, LsListsTheLocksOfEveryShard) {
  const auto per_shard = one_per_shard("ls");
  ASSERT_EQ(per_shard.size(), 3u);
  std::vector<Lock> held;
  std::set<std::string> want;
  for (const auto& [port, r] : per_shard) {
    auto l = svc->acquire(r, {.ttl = 60s, .fence = true});
    ASSERT_TRUE(l);
    held.push_back(std::move(*l));
    want.insert(r);
  }
  const auto res = admin::list_locks(*svc, {.scan_count = 10});
  std::set<std::string> got;
  for (const auto& info : res.locks) {
    got.insert(info.resource);
    EXPECT_TRUE(info.held);
  }
  EXPECT_EQ(got, want) << "seen on " << res.stats.scan_calls << " SCAN calls";
  EXPECT_GE(res.stats.scan_calls, 3u);  // at least one per primary
  // The limit stops the walk across shards too.
  EXPECT_EQ(admin::list_locks(*svc, {.limit = 1}).locks.size(), 1u);
  for (auto& l : held) EXPECT_TRUE(l.release());
  EXPECT_TRUE(admin::list_locks(*svc).locks.empty());
}

TEST_F(ClusterAdmin, ForceReleaseOnEveryShardIsAuditedInItsSlotAndReadBackNewestFirst) {
  const auto per_shard = one_per_shard("force");
  ASSERT_EQ(per_shard.size(), 3u);
  std::vector<std::string> order;  // as released
  for (const auto& [port, r] : per_shard) {
    auto l = svc->acquire(r, {.ttl = 60s, .fence = true});
    ASSERT_TRUE(l);
    const auto fence = *l->fence();
    l->detach();  // the holder "died": its lock stays until the operator acts
    const auto out = admin::force_release(*svc, r, {.reason = "host gone", .who = "ops@test"});
    ASSERT_EQ(out.outcome, admin::ForceReleaseResult::Outcome::released) << r;
    EXPECT_GT(out.new_fence, fence);
    EXPECT_EQ(client->exec(redis::Command{"EXISTS", keys.lock_key(r)}).integer, 0);
    // The record is in the resource's own stream, on the resource's primary.
    EXPECT_EQ(std::stoll(cluster->on(port, "XLEN " + admin::audit_key(keys, r))), 1) << r;
    order.push_back(r);
    // Streams on different nodes are ordered by their ids' milliseconds:
    // two releases within one millisecond on two shards have no order.
    std::this_thread::sleep_for(3ms);
  }
  // An operator action of another kind, in the one stream, last.
  std::this_thread::sleep_for(3ms);
  admin::append_audit(*svc, {.action = "retry_dead_letter", .resource = "queue:x", .who = "ops@test",
                             .reason = "retried"});
  const auto recs = admin::read_audit(*svc, 10);
  ASSERT_EQ(recs.size(), 4u);
  EXPECT_EQ(recs[0].action, "retry_dead_letter");
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(recs[i + 1].resource, order[2 - i]) << "newest first";
    EXPECT_EQ(recs[i + 1].reason, "host gone");
    EXPECT_EQ(recs[i + 1].who, "ops@test");
  }
  const auto two = admin::read_audit(*svc, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].id, recs[0].id);
  EXPECT_EQ(two[1].id, recs[1].id);
}

// A read-write lock on every shard: its scripts touch one slot each, a
// reader's release wakes the waiting writer by sharded pub/sub (SPUBLISH),
// and a force release of a reader is audited in the resource's slot.
TEST_F(ClusterAdmin, ARwLockOnEveryShardWakesItsWriterAndForceReleasesAReader) {
  const auto per_shard = one_per_shard("rw");
  ASSERT_EQ(per_shard.size(), 3u);
  for (const auto& [port, r] : per_shard) {
    LockOptions ro;
    ro.mode = LockMode::shared;
    ro.ttl = 10s;
    ro.fence = true;
    auto reader = svc->acquire(r, ro);
    ASSERT_TRUE(reader) << r;
    LockOptions wo = ro;
    wo.mode = LockMode::exclusive;
    wo.wait = 60s;
    wo.backoff_max = 30s;  // only the release's wake can grant it soon
    std::optional<Lock> writer;
    std::thread t([&] { writer = svc->acquire(r, wo); });
    ASSERT_TRUE(test::eventually([&] {
      return client->exec(redis::Command{"ZCARD", keys.rw_writers_line_key(r)}).integer == 1;
    }));
    // Subscribed (the waiter looked again after its subscription).
    std::this_thread::sleep_for(300ms);
    EXPECT_TRUE(reader->release());
    t.join();
    ASSERT_TRUE(writer) << r;
    EXPECT_GT(*writer->fence(), *reader->fence());
    EXPECT_TRUE(writer->release());
    // Force release of one reader, audited.
    auto stuck = svc->acquire(r, ro);
    ASSERT_TRUE(stuck);
    admin::ForceReleaseOptions fo;
    fo.reason = "cluster rw test";
    const auto res = force_release_rw(*svc, r, fo);
    EXPECT_EQ(res.outcome, admin::ForceReleaseResult::Outcome::released) << r;
    EXPECT_GT(res.new_fence, *stuck->fence());
    EXPECT_FALSE(stuck->release());
  }
  const auto audit = admin::read_audit(*svc, 100);
  int found = 0;
  for (const auto& rec : audit)
    if (rec.reason == "cluster rw test") ++found;
  EXPECT_EQ(found, 3);
}
