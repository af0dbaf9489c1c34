// The library loading its lock classes from the catalog: the class a
// GuardedRunner gets from job::Catalog::load is the one the file declares —
// its key pattern, TTL, fencing and renewal govern the real lock in Redis.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

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
  std::optional<int> slot_seen = 0;
  int permits_seen = -1;
  std::string pttl_seen;
  const auto r = runner.run({.id = "7", .run_id = "r1"}, [&](job::JobContext& ctx) {
    fence_seen = ctx.fence();
    slot_seen = ctx.permit_slot();
    permits_seen = ctx.permits();
    pttl_seen = admin("PTTL " + ctx.lock_key());
    return std::string("ok");
  });
  ASSERT_TRUE(r.ok()) << r.detail;
  EXPECT_FALSE(fence_seen.has_value());
  EXPECT_FALSE(slot_seen.has_value()) << "a mutex class has no permit slot";
  EXPECT_EQ(permits_seen, 0);
  EXPECT_GT(std::stoll(pttl_seen), 30000);  // ttl: 1m
  EXPECT_EQ(admin("EXISTS jobguard:fence:{image:7:thumb}"), "0");
}

TEST_F(CatalogRunner, APermitsClassHoldsOneOfTheSemaphoresPermitsNotTheLock) {
  const auto catalog = job::Catalog::load(kExample);
  const job::LockClass& cls = catalog.get("payment-provider");  // permits: 5, key "psp:acme-pay"
  ASSERT_EQ(cls.permits, 5);
  auto client = make_client();
  auto svc = LockService::create(*client);
  auto leases = LeaseScheduler::create(svc);
  guard::RedisCompletionStore records(*client);
  job::GuardedRunner runner(leases, cls, {.completions = &records});
  std::string key_seen, holders_seen, lock_seen;
  std::optional<int> others_permits, slot;
  int permits = 0;
  std::set<int> slots;
  const auto r = runner.run({.id = "inv-1", .run_id = "r1"}, [&](job::JobContext& ctx) {
    key_seen = ctx.lock_key();
    holders_seen = admin("ZCARD jobguard:sem:{psp:acme-pay}");
    lock_seen = admin("EXISTS jobguard:lock:{psp:acme-pay}");
    slot = ctx.permit_slot();
    permits = ctx.permits();
    // The four others of the five fit beside this holder; a sixth does not.
    std::vector<Lock> others;
    for (int i = 0; i < 5; ++i)
      if (auto l = svc->acquire("psp:acme-pay", {.ttl = 10s, .permits = 5})) others.push_back(std::move(*l));
    others_permits = static_cast<int>(others.size());
    for (const auto& l : others) slots.insert(l.permit_slot());
    return std::string("charged");
  });
  ASSERT_TRUE(r.ok()) << r.detail;
  // The job's slot is its own: the four others hold the other four.
  ASSERT_TRUE(slot.has_value());
  EXPECT_GE(*slot, 0);
  EXPECT_LT(*slot, 5);
  EXPECT_EQ(permits, 5);
  EXPECT_EQ(slots.size(), 4u);
  EXPECT_EQ(slots.count(*slot), 0u);
  EXPECT_EQ(key_seen, "jobguard:sem:{psp:acme-pay}");
  EXPECT_EQ(holders_seen, "1");
  EXPECT_EQ(lock_seen, "0");
  EXPECT_EQ(others_permits, 4);
  EXPECT_EQ(admin("ZCARD jobguard:sem:{psp:acme-pay}"), "0");  // every permit given back
}

TEST_F(CatalogRunner, ReadWriteClassesHoldTheResourcesReadersOrItsWriter) {
  const auto catalog = job::Catalog::load(kExample);
  const job::LockClass& report = catalog.get("ledger-report");   // mode: shared
  const job::LockClass& rebuild = catalog.get("ledger-rebuild");  // mode: exclusive, renewing, fenced
  auto client = make_client();
  auto svc = LockService::create(*client);
  auto leases = LeaseScheduler::create(svc);
  guard::RedisCompletionStore records(*client);
  guard::RedisIdempotencyStore keys(*client);
  job::GuardedRunner readers(leases, report, {.completions = &records});
  job::GuardedRunner writers(leases, rebuild, {.completions = &records, .idempotency = &keys});
  LockOptions reader{.ttl = 5s}, writer{.ttl = 5s};
  reader.mode = LockMode::shared;
  writer.mode = LockMode::exclusive;

  std::string key_seen;
  bool other_reader = false, writer_refused = false;
  auto r = readers.run({.id = "7", .run_id = "d1"}, [&](job::JobContext& ctx) {
    key_seen = ctx.lock_key();
    other_reader = svc->acquire("book:7", reader).has_value();
    writer_refused = !svc->acquire("book:7", writer).has_value();
    return std::string("read");
  });
  ASSERT_TRUE(r.ok()) << r.detail;
  EXPECT_EQ(key_seen, "jobguard:rwr:{book:7}");
  EXPECT_TRUE(other_reader);
  EXPECT_TRUE(writer_refused);

  bool reader_refused = false;
  std::optional<std::int64_t> fence;
  r = writers.run({.id = "7", .run_id = "n1"}, [&](job::JobContext& ctx) {
    key_seen = ctx.lock_key();
    fence = ctx.fence();
    reader_refused = !svc->acquire("book:7", reader).has_value();
    return std::string("rebuilt");
  });
  ASSERT_TRUE(r.ok()) << r.detail;
  EXPECT_EQ(key_seen, "jobguard:rww:{book:7}");
  EXPECT_TRUE(fence.has_value());  // fencing: true
  EXPECT_TRUE(reader_refused);
  EXPECT_EQ(admin("ZCARD jobguard:rww:{book:7}"), "0");
}

}  // namespace
}  // namespace jobguard::test
