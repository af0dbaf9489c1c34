// The library loading its lock classes from the catalog: the class a
// GuardedRunner gets from job::Catalog::load is the one the file declares —
// its key pattern, TTL, fencing and renewal govern the real lock in Redis.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "jobguard/guard/completion.hpp"
#include "jobguard/guard/idempotency.hpp"
#include "jobguard/job/catalog.hpp"
#include "jobguard/job/runner.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "support/redis_fixture.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;

const std::string kExample = std::string(JOBGUARD_SOURCE_DIR) + "/docs/catalog.example.yaml";

class CatalogRunner : public RedisTest {};

TEST_F(CatalogRunner, TheExampleCatalogsRenewingFencedClassGovernsTheLock) {
  const auto catalog = job::Catalog::load(kExample);
  const job::LockClass& cls = catalog.get("tenant-sync");  // moderate, ttl 30s, renewing, fenced
  auto client = make_client();
  auto leases = LeaseScheduler::create(LockService::create(*client));
  guard::RedisCompletionStore records(*client);
  guard::RedisIdempotencyStore keys(*client);
  job::GuardedRunner runner(leases, cls, {.completions = &records, .idempotency = &keys});

  std::string key_seen, pttl_seen, idem;
  std::optional<std::int64_t> fence_seen;
  const auto r = runner.run({.id = "acme", .run_id = "2026-12-01"}, [&](job::JobContext& ctx) {
    key_seen = ctx.lock_key();
    fence_seen = ctx.fence();
    idem = ctx.idempotency_key();
    pttl_seen = admin("PTTL " + ctx.lock_key());
    return std::string("exported");
  });
  ASSERT_TRUE(r.ok()) << r.detail;
  EXPECT_EQ(key_seen, "jobguard:lock:{tenant:acme:sync}");  // key: "tenant:{id}:sync"
  EXPECT_TRUE(fence_seen.has_value());                     // fencing: true
  EXPECT_FALSE(idem.empty());                              // consequence: moderate
  const auto pttl = std::stoll(pttl_seen);
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 30000);  // ttl: 30s
  EXPECT_EQ(admin("EXISTS " + key_seen), "0");  // released after the effect

  // The completion record written under the class makes a second run a no-op.
  const auto again = runner.run({.id = "acme", .run_id = "2026-12-01"}, [](job::JobContext&) {
    ADD_FAILURE() << "ran twice";
    return std::string();
  });
  EXPECT_EQ(again.outcome, job::Outcome::already_done);
}

TEST_F(CatalogRunner, AnUnfencedClassFromTheCatalogGetsNoFence) {
  const auto catalog = job::Catalog::load(kExample);
  const job::LockClass& cls = catalog.get("thumbnail");  // low, ttl 1m, not fenced
  auto client = make_client();
  auto leases = LeaseScheduler::create(LockService::create(*client));
  guard::RedisCompletionStore records(*client);
  job::GuardedRunner runner(leases, cls, {.completions = &records});
  std::optional<std::int64_t> fence_seen = 1;
  std::string pttl_seen;
  const auto r = runner.run({.id = "7", .run_id = "r1"}, [&](job::JobContext& ctx) {
    fence_seen = ctx.fence();
    pttl_seen = admin("PTTL " + ctx.lock_key());
    return std::string("ok");
  });
  ASSERT_TRUE(r.ok()) << r.detail;
  EXPECT_FALSE(fence_seen.has_value());
  EXPECT_GT(std::stoll(pttl_seen), 30000);  // ttl: 1m
  EXPECT_EQ(admin("EXISTS jobguard:fence:{image:7:thumb}"), "0");
}

}  // namespace
}  // namespace jobguard::test
