// LockService::inspect, Lease::deadline, and the operator's tools
// (jobguard/admin.hpp) against a real redis-server.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "fixtures.hpp"
#include "jobguard/admin.hpp"
#include "jobguard/error.hpp"
#include "jobguard/guard/fence_check.hpp"

namespace jobguard {
namespace {

using namespace std::chrono_literals;

class AdminTest : public LockTest {};

TEST_F(AdminTest, InspectShowsHolderTtlLeftFenceAndAge) {
  const auto r = resource("inv");
  auto lock = svc->acquire(r, LockOptions{.ttl = 20s, .fence = true, .job_id = "invoice-run"});
  ASSERT_TRUE(lock);
  const auto info = svc->inspect(r);
  EXPECT_TRUE(info.held);
  EXPECT_EQ(info.resource, r);
  EXPECT_EQ(info.key, svc->keys().lock_key(r));
  EXPECT_EQ(info.holder, token_owner(lock->token()));
  EXPECT_NE(info.holder.find("/invoice-run"), std::string::npos) << info.holder;
  EXPECT_GT(info.ttl_left, 0ms);
  EXPECT_LE(info.ttl_left, 20s);
  EXPECT_EQ(info.fence, lock->fence());
  ASSERT_TRUE(info.fence_age.has_value());  // the fence reads as its grant time
  EXPECT_GE(info.fence_age->count(), 0);
  EXPECT_LT(*info.fence_age, 20s);
  EXPECT_EQ(info.waiters, 0);
}

TEST_F(AdminTest, InspectOfAFreeResourceIsNotHeld) {
  const auto info = svc->inspect(resource("free"));
  EXPECT_FALSE(info.held);
  EXPECT_TRUE(info.holder.empty());
  EXPECT_FALSE(info.fence.has_value());
  EXPECT_GT(info.server_time_ms, 0);
}

TEST_F(AdminTest, InspectShowsATokenOfAnotherClientWhole) {
  const auto r = resource("foreign");
  admin("SET " + svc->keys().lock_key(r) + " redlock-value-123 PX 5000");
  const auto info = svc->inspect(r);
  EXPECT_TRUE(info.held);
  EXPECT_EQ(info.holder, "redlock-value-123");
}

TEST_F(AdminTest, InspectCountsFairWaiters) {
  const auto r = resource("fair");
  auto held = svc->acquire(r, LockOptions{.ttl = 10s, .fair = true});
  ASSERT_TRUE(held);
  auto client2 = make_client();
  auto svc2 = LockService::create(*client2);
  std::thread waiter([&] { auto l = svc2->acquire(r, LockOptions{.ttl = 10s, .wait = 5s, .fair = true}); });
  EXPECT_TRUE(test::eventually([&] { return svc->inspect(r).waiters == 1; }));
  held->release();
  waiter.join();
}

TEST_F(AdminTest, InspectCountsDefaultModeWaitersInTheirLine) {
  const auto r = resource("line");
  auto held = svc->acquire(r, LockOptions{.ttl = 10s});
  ASSERT_TRUE(held);
  auto client2 = make_client();
  auto svc2 = LockService::create(*client2);
  std::optional<Lock> got;
  std::thread waiter([&] { got = svc2->acquire(r, LockOptions{.ttl = 10s, .wait = 10s}); });
  EXPECT_TRUE(test::eventually([&] { return svc->inspect(r).waiters == 1; }));
  held->release();
  waiter.join();
  ASSERT_TRUE(got);
  EXPECT_EQ(svc->inspect(r).waiters, 0);
  got->release();
  got.reset();
  svc2.reset();
}

TEST_F(AdminTest, InspectRefusesAMalformedResource) {
  EXPECT_THROW(svc->inspect("has space"), Error);
}

TEST_F(AdminTest, LeaseDeadlineIsWhereSafeTimeLeftCountsDownTo) {
  auto sched = LeaseScheduler::create(svc);
  auto lease = sched->acquire(resource("lease"), LockOptions{.ttl = 3s}, LeaseOptions{.hard_timeout = 60s});
  ASSERT_TRUE(lease);
  // safe_time_left() is deadline() minus the moment it was read, which lies
  // between t0 and t1 (a renewal in between only moves the deadline later).
  const auto t0 = std::chrono::steady_clock::now();
  const auto left = lease->safe_time_left();
  const auto t1 = std::chrono::steady_clock::now();
  const auto deadline = lease->deadline();
  EXPECT_GT(left, 0ms);
  EXPECT_LE(left, deadline - t0);
  if (lease->renewals() == 0) {
    EXPECT_GE(left + 1ms, deadline - t1);
  }
  ASSERT_TRUE(lease->hard_deadline().has_value());
  EXPECT_GT(*lease->hard_deadline(), lease->deadline());
  // A renewal moves the deadline later.
  const auto first = lease->deadline();
  EXPECT_TRUE(test::eventually([&] { return lease->renewals() > 0; }, 10s));
  EXPECT_GT(lease->deadline(), first);
  lease->release();
}

TEST_F(AdminTest, LsListsHeldLocksWithTheirHolders) {
  auto a = svc->acquire("inv:1", LockOptions{.ttl = 10s, .fence = true, .job_id = "a"});
  auto b = svc->acquire("inv:2", LockOptions{.ttl = 10s, .job_id = "b"});
  auto c = svc->acquire("tenant:x", LockOptions{.ttl = 10s, .job_id = "c"});
  ASSERT_TRUE(a && b && c);
  // Keys that are not locks: our own fence counters, and unrelated keys.
  for (int i = 0; i < 50; ++i) admin("SET cache:" + std::to_string(i) + " v");
  auto all = admin::list_locks(*svc, admin::ListOptions{.scan_count = 7});
  ASSERT_EQ(all.locks.size(), 3u);
  EXPECT_EQ(all.locks[0].resource, "inv:1");
  EXPECT_EQ(all.locks[0].holder, token_owner(a->token()));
  EXPECT_EQ(all.locks[0].fence, a->fence());
  EXPECT_EQ(all.locks[2].resource, "tenant:x");
  EXPECT_GT(all.stats.scan_calls, 1u);  // COUNT 7 over ~55 keys: several round trips
  // Never KEYS, which blocks the server for the whole keyspace: only SCAN.
  const auto cmdstats = admin("INFO commandstats");
  EXPECT_NE(cmdstats.find("cmdstat_scan:calls="), std::string::npos) << cmdstats;
  EXPECT_EQ(cmdstats.find("cmdstat_keys:"), std::string::npos) << cmdstats;

  auto inv = admin::list_locks(*svc, admin::ListOptions{.prefix = "inv:"});
  ASSERT_EQ(inv.locks.size(), 2u);
  auto filtered = admin::list_locks(
      *svc, admin::ListOptions{.filter = [](std::string_view r) { return r.substr(0, 7) == "tenant:"; }});
  ASSERT_EQ(filtered.locks.size(), 1u);
  EXPECT_EQ(filtered.locks[0].resource, "tenant:x");
}

TEST_F(AdminTest, LsPrefixWithGlobCharactersMatchesThemLiterally) {
  auto star = svc->acquire("a*b:1", LockOptions{.ttl = 10s});
  auto plain = svc->acquire("axb:1", LockOptions{.ttl = 10s});
  ASSERT_TRUE(star && plain);
  auto r = admin::list_locks(*svc, admin::ListOptions{.prefix = "a*"});
  ASSERT_EQ(r.locks.size(), 1u);
  EXPECT_EQ(r.locks[0].resource, "a*b:1");
}

TEST_F(AdminTest, ForceReleaseAdvancesTheFenceSoTheOldHoldersWriteIsRejected) {
  const auto r = resource("charge");
  guard::FenceCheck downstream;
  auto old_holder = svc->acquire(r, LockOptions{.ttl = 30s, .fence = true, .job_id = "stuck"});
  ASSERT_TRUE(old_holder && old_holder->fence());
  ASSERT_TRUE(downstream.accept(r, *old_holder->fence()));  // its first write went through

  const auto res = admin::force_release(*svc, r, admin::ForceReleaseOptions{.reason = "host web-3 is dead",
                                                                             .who = "ops@bastion"});
  ASSERT_EQ(res.outcome, admin::ForceReleaseResult::Outcome::released);
  EXPECT_EQ(res.holder, token_owner(old_holder->token()));
  EXPECT_GT(res.new_fence, *old_holder->fence());
  EXPECT_GT(res.ttl_left, 0ms);
  EXPECT_FALSE(svc->inspect(r).held);

  // The next holder is granted a fence above the released one and writes.
  auto next = svc->acquire(r, LockOptions{.ttl = 30s, .fence = true, .job_id = "next"});
  ASSERT_TRUE(next && next->fence());
  EXPECT_GT(*next->fence(), res.new_fence);
  EXPECT_TRUE(downstream.accept(r, *next->fence()));
  // The old holder wakes up and writes late: refused.
  EXPECT_FALSE(downstream.accept(r, *old_holder->fence()));
  EXPECT_THROW(downstream.require(r, *old_holder->fence()), Error);
  // Nor can it delete the new holder's lock.
  EXPECT_FALSE(old_holder->release());
  EXPECT_TRUE(svc->inspect(r).held);

  const auto audit = admin::read_audit(*svc);
  ASSERT_EQ(audit.size(), 1u);
  EXPECT_EQ(audit[0].resource, r);
  EXPECT_EQ(audit[0].who, "ops@bastion");
  EXPECT_EQ(audit[0].reason, "host web-3 is dead");
  EXPECT_EQ(audit[0].holder, res.holder);
  EXPECT_EQ(audit[0].fence, res.new_fence);
  EXPECT_EQ(audit[0].id, res.audit_id);
  EXPECT_GT(audit[0].at_ms, 0);
}

TEST_F(AdminTest, ForceReleaseAlsoFencesAnUnfencedResource) {
  // The downstream told the released fence (e.g. PgTransaction::advance_fence)
  // refuses every fence issued before the release.
  const auto r = resource("unfenced");
  auto before = svc->acquire(r, LockOptions{.ttl = 30s, .fence = true});
  ASSERT_TRUE(before);
  before->release();
  auto holder = svc->acquire(r, LockOptions{.ttl = 30s});
  ASSERT_TRUE(holder);
  const auto res = admin::force_release(*svc, r, admin::ForceReleaseOptions{.reason = "stuck"});
  ASSERT_EQ(res.outcome, admin::ForceReleaseResult::Outcome::released);
  guard::FenceCheck downstream;
  EXPECT_TRUE(downstream.accept(r, res.new_fence));
  EXPECT_FALSE(downstream.accept(r, *before->fence()));
}

TEST_F(AdminTest, ForceReleaseOfAFreeLockRecordsNothing) {
  const auto res = admin::force_release(*svc, resource("free"), admin::ForceReleaseOptions{.reason = "x"});
  EXPECT_EQ(res.outcome, admin::ForceReleaseResult::Outcome::not_held);
  EXPECT_TRUE(admin::read_audit(*svc).empty());
}

TEST_F(AdminTest, ForceReleaseWithAnExpectedHolderLeavesAnotherHoldersLock) {
  const auto r = resource("changed");
  auto lock = svc->acquire(r, LockOptions{.ttl = 30s, .job_id = "new-owner"});
  ASSERT_TRUE(lock);
  const auto res = admin::force_release(
      *svc, r, admin::ForceReleaseOptions{.reason = "x", .expect_holder = "web-3/4121/old-owner"});
  EXPECT_EQ(res.outcome, admin::ForceReleaseResult::Outcome::holder_changed);
  EXPECT_EQ(res.holder, token_owner(lock->token()));
  EXPECT_TRUE(svc->inspect(r).held);
  EXPECT_TRUE(admin::read_audit(*svc).empty());
  const auto ok = admin::force_release(
      *svc, r, admin::ForceReleaseOptions{.reason = "x", .expect_holder = token_owner(lock->token())});
  EXPECT_EQ(ok.outcome, admin::ForceReleaseResult::Outcome::released);
}

TEST_F(AdminTest, ForceReleaseNeedsAReason) {
  EXPECT_THROW(admin::force_release(*svc, resource("r"), admin::ForceReleaseOptions{}), Error);
}

TEST_F(AdminTest, ForceReleaseWakesAPlainWaiterAtOnce) {
  const auto r = resource("wake");
  auto held = svc->acquire(r, LockOptions{.ttl = 60s});
  ASSERT_TRUE(held);
  auto client2 = make_client();
  auto svc2 = LockService::create(*client2);
  std::optional<Lock> got;
  // Backoff far longer than the test: only the release's PUBLISH can wake it.
  std::thread waiter([&] {
    got = svc2->acquire(r, LockOptions{.ttl = 10s, .wait = 30s, .backoff_min = 20s, .backoff_max = 20s});
  });
  // Wait until the waiter is subscribed to the release channel.
  ASSERT_TRUE(test::eventually([&] {
    auto c = client->exec(redis::Command{"PUBSUB", "NUMSUB", svc->keys().channel(r)});
    return c.is_array() && c.elements.size() == 2 && c.elements[1].integer >= 1;
  }));
  const auto t0 = std::chrono::steady_clock::now();
  admin::force_release(*svc, r, admin::ForceReleaseOptions{.reason = "wake"});
  waiter.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 15s);  // not the 20 s backoff: "does not hang"
}

TEST_F(AdminTest, AuditStreamIsCapped) {
  for (int i = 0; i < 300; ++i) {
    auto l = svc->acquire(resource("cap"), LockOptions{.ttl = 10s});
    ASSERT_TRUE(l);
    l->detach();
    admin::force_release(*svc, resource("cap"), admin::ForceReleaseOptions{.reason = "cap", .audit_maxlen = 100});
  }
  const auto len = std::stoll(admin("XLEN " + admin::audit_key(svc->keys())));
  EXPECT_GE(len, 100);
  EXPECT_LT(len, 300);  // MAXLEN ~ trims whole nodes: about 100, never all 300
  EXPECT_EQ(admin::read_audit(*svc, 5).size(), 5u);
}

}  // namespace
}  // namespace jobguard
