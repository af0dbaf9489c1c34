// The lock-state quarantine on a Redis Cluster: each primary
// keeps its own record, so a shard that restarts empty — no replica, no
// persistence — is found by its own record, whichever shard the one-server
// record (jobguard:epoch) lives on. The shard restarted here is, on purpose,
// not the one of jobguard:epoch: with a single record its loss went unseen,
// and a second worker was granted the lock the first still held.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "lock/quarantine.hpp"
#include "support/cluster_redis.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using jobguard::test::eventually;

namespace {

redis::ConnectionOptions cluster_options(test::ClusterRedis& c) {
  auto o = redis::parse_url(c.url("max_ttl=2s"));
  o.command_timeout = 2s;
  o.connect_timeout = 500ms;
  return o;
}

}  // namespace

TEST(ClusterLockState, EveryShardKeepsARecordOnAKeyItServes) {
  redis::PrimaryShard low{"a:1", {{0, 5460}}}, one{"b:2", {{9000, 9000}}}, none{"c:3", {}};
  for (const auto* s : {&low, &one}) {
    const auto key = detail::lock_state_key_for(*s);
    ASSERT_FALSE(key.empty());
    EXPECT_TRUE(s->serves(redis::key_slot(key))) << key;
    EXPECT_EQ(key.rfind("jobguard:epoch:{", 0), 0u) << key;
    EXPECT_EQ(detail::lock_state_key_for(*s), key) << "every client picks the same key";
  }
  EXPECT_EQ(detail::lock_state_key_for(none), "");
}

TEST(ClusterLockState, AShardRestartedEmptyIsQuarantinedAndOnlyItsLeasesAreLost) {
  test::ClusterRedis cluster(3, 0);
  cluster.start();
  redis::Client first(cluster_options(cluster)), second(cluster_options(cluster));
  ASSERT_TRUE(first.wait_connected(5s));
  ASSERT_TRUE(second.wait_connected(5s));
  trust_new_server(first);

  // The shard that restarts: not the one serving jobguard:epoch.
  const auto record_port = cluster.primary_of(redis::key_slot(detail::kLockStateKey));
  KeyBuilder keys;
  std::map<std::uint16_t, std::string> by_port;
  for (int i = 0; by_port.size() < 3 && i < 1000; ++i) {
    const std::string r = fmt::format("ledger:{}", i);
    by_port.emplace(cluster.primary_of(redis::key_slot(keys.lock_key(r))), r);
  }
  ASSERT_EQ(by_port.size(), 3u);
  std::uint16_t victim_port = 0;
  std::string victim, healthy;
  for (const auto& [port, r] : by_port) {
    if (port != record_port && victim_port == 0) {
      victim_port = port;
      victim = r;
    } else if (healthy.empty()) {
      healthy = r;
    }
  }
  ASSERT_NE(victim_port, 0);

  auto svc1 = LockService::create(first);
  auto svc2 = LockService::create(second);
  auto leases = LeaseScheduler::create(svc1);
  const LockOptions held{.ttl = 1500ms};
  auto on_victim = leases->acquire(victim, held);
  auto on_healthy = leases->acquire(healthy, held);
  ASSERT_TRUE(on_victim && on_healthy);
  // The second worker sees both held before the loss.
  EXPECT_FALSE(svc2->acquire(victim, LockOptions{.ttl = 1s}));

  std::size_t node = cluster.size();
  for (std::size_t i = 0; i < cluster.size(); ++i)
    if (cluster.node(i).port() == victim_port) node = i;
  ASSERT_LT(node, cluster.size());
  cluster.node(node).restart();  // empty: no persistence, no replica to resync from
  ASSERT_TRUE(eventually(
      [&] { return cluster.on(victim_port, "CLUSTER INFO").find("cluster_state:ok") != std::string::npos; }, 10s));
  ASSERT_EQ(cluster.on(victim_port, "EXISTS " + keys.lock_key(victim)), "0") << "the restart lost the lock";

  // Until the first holder is told, nobody else is granted the lock it held.
  int granted_while_held = 0, quarantined = 0, refused = 0;
  while (!on_victim->lost()) {
    try {
      if (auto l = svc2->acquire(victim, LockOptions{.ttl = 1s})) {
        ++granted_while_held;
        l->release();
      }
    } catch (const Error& e) {
      // The reconnect itself may refuse a try or two; the quarantine must be among them.
      if (std::string(e.what()).find("lost lock state") != std::string::npos) ++quarantined;
      ++refused;
    }
    std::this_thread::sleep_for(20ms);
    ASSERT_LT(refused, 1000) << "the victim's lease was never told it was lost";
  }
  EXPECT_EQ(granted_while_held, 0) << "a second holder while the first still held the lock";
  EXPECT_FALSE(on_victim->reason().empty());
  // The second worker's own gate found the loss too (it checks every shard).
  try {
    svc2->acquire(victim, LockOptions{.ttl = 1s});
  } catch (const Error& e) {
    if (std::string(e.what()).find("lost lock state") != std::string::npos) ++quarantined;
  }
  EXPECT_GT(quarantined, 0) << "grants refused for the shard's lost lock state";
  // The lease on an untouched shard is not lost with it.
  EXPECT_FALSE(on_healthy->lost()) << on_healthy->reason();

  // The quarantine ends max_ttl after the loss was found; then grants resume.
  ASSERT_TRUE(eventually(
      [&] {
        try {
          auto l = svc2->acquire(victim, LockOptions{.ttl = 1s});
          return l && l->release();
        } catch (const Error&) {
          return false;
        }
      },
      6s));
  EXPECT_FALSE(on_healthy->lost()) << on_healthy->reason();
  EXPECT_TRUE(on_healthy->release());
}
