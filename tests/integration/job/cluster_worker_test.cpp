// The job source and the guarded worker on a real Redis Cluster (3
// primaries, one cluster for the suite): every stream command has one key,
// and every key of one job's guards one hash tag, so the jobs' locks,
// idempotency keys and completion records land on all three shards while the
// stream and its dead letters stay whole on theirs; the fleet numbers, one
// hash tag, go to one shard.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <set>

#include "jobguard/guard/completion.hpp"
#include "jobguard/guard/idempotency.hpp"
#include "jobguard/job/runner.hpp"
#include "jobguard/job/stream_source.hpp"
#include "jobguard/job/worker.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/fleet.hpp"
#include "redis/cluster.hpp"
#include "support/cluster_redis.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
namespace asio = boost::asio;

namespace {

class ClusterWorker : public test::SharedClusterTest {};

}  // namespace

TEST_F(ClusterWorker, JobsOnEveryShardRunOnceAFailingOneIsDeadLetteredAndTheFleetCountsThem) {
  auto o = redis::parse_url(cluster->url());
  o.command_timeout = 2s;
  o.connect_timeout = 1s;
  redis::Client client(o);
  ASSERT_TRUE(client.wait_connected(5s));
  trust_new_server(client);
  const KeyBuilder keys("cw");
  auto leases = LeaseScheduler::create(LockService::create(client, keys));
  guard::RedisCompletionStore done(client, guard::RedisCompletionOptions{.prefix = "cw:done:"});
  guard::RedisIdempotencyStore idem(client, guard::IdempotencyOptions{.prefix = "cw:idem:"});
  job::StreamOptions stream{.stream = "cw:jobs"};
  stream.claim_idle = 300ms;
  // A copy that finds its unit's lock busy is left pending and taken again
  // after claim_idle; "fails" is dead-lettered at its third failure.
  stream.max_attempts = 3;
  stream.block = 50ms;
  const job::LockClass cls{.name = "cluster-worker",
                           .key_pattern = "unit:{id}",
                           .consequence = job::Consequence::moderate,
                           .ttl = 5s,
                           .owner = "tests",
                           .protects = "a counter per unit"};
  job::GuardedRunner runner(leases, cls, {.completions = &done, .idempotency = &idem});
  job::StreamSource producer(client, stream);
  producer.ensure_group();
  constexpr int kUnits = 30, kCopies = 2;
  std::set<std::uint16_t> shards;
  for (int c = 0; c < kCopies; ++c)
    for (int u = 0; u < kUnits; ++u) {
      producer.add({{"id", std::to_string(u)}, {"run", "r"}});
      shards.insert(cluster->primary_of(redis::detail::key_slot(keys.lock_key("unit:" + std::to_string(u)))));
    }
  ASSERT_EQ(shards.size(), 3u) << "the units' locks are not spread over the shards";
  producer.add({{"id", "fails"}, {"run", "r"}});

  std::mutex mu;
  std::map<std::string, int> runs;
  job::AsyncJobEffect effect = [&](job::WorkItem& item) -> asio::awaitable<std::string> {
    const std::string id = item.context().unit().id;
    {
      std::lock_guard lk(mu);
      ++runs[id];
    }
    if (id == "fails") throw std::runtime_error("exit status 3");
    co_return "ok-" + id;
  };
  job::StreamWorker worker(client, stream, runner, effect,
                           {.concurrency = 16, .exit_when_idle = 2s});
  worker.run();

  const auto st = worker.stats();
  EXPECT_EQ(st.completed, kUnits);
  // Every copy found the record: of the 2 x 30 messages 30 completed, none
  // ran twice (runs below) and none is left pending, so each other one was a
  // skip. `skipped` counts deliveries, and a delivery still in flight after
  // claim_idle (a loaded host) is delivered again and skipped once more: at
  // least one skip per copy, not exactly one.
  EXPECT_GE(st.skipped, kUnits * (kCopies - 1)) << "the copies found the completion record";
  EXPECT_EQ(st.dead_lettered, 1);
  EXPECT_EQ(producer.pending_count(), 0);
  {
    std::lock_guard lk(mu);
    EXPECT_EQ(runs.size(), static_cast<std::size_t>(kUnits + 1));
    for (const auto& [id, n] : runs) EXPECT_EQ(n, id == "fails" ? 3 : 1) << "unit " << id;
  }
  const auto dead = producer.dead_letters(10);
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].attempts, 3);
  EXPECT_NE(dead[0].last_error.find("exit status 3"), std::string::npos) << dead[0].last_error;
  for (int u = 0; u < kUnits; ++u) {
    auto rec = done.find(cls.name, "unit:" + std::to_string(u), "r");
    ASSERT_TRUE(rec) << u;
    EXPECT_EQ(rec->result, "ok-" + std::to_string(u));
  }

  // The fleet numbers: one hash tag ({cw:fleet}), so the publisher's script
  // and the reader's calls go to one shard, whichever it is.
  observe::FleetPublisher fleet(client, {.prefix = "cw", .interval = 0ms});
  ASSERT_TRUE(fleet.flush());
  const auto snap = observe::FleetReader(client, {.prefix = "cw"}).read(std::chrono::minutes(5));
  const auto* c = snap.find(cls.name);
  ASSERT_NE(c, nullptr);
  EXPECT_GE(c->counts.acquisitions, static_cast<std::uint64_t>(kUnits + 1));
  EXPECT_EQ(c->counts.releases, c->counts.acquisitions);
  EXPECT_EQ(c->counts.redis_errors, 0u);
}
