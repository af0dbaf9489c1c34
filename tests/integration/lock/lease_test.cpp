#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/lease.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using Clock = std::chrono::steady_clock;
using jobguard::test::eventually;

#include "fixtures.hpp"

TEST_F(LeaseTest, RenewalKeepsTheLockFarPastItsTtl) {
  auto lease = sched->acquire(resource("long"), LockOptions{.ttl = 300ms});
  ASSERT_TRUE(lease);
  // Five TTLs at least, and eight renewals however long a slow build takes
  // to send them: the count is what is asserted, not a rate.
  std::this_thread::sleep_for(1500ms);
  EXPECT_TRUE(eventually([&] { return lease->renewals() >= 8u || lease->lost(); }, 10s)) << lease->renewals();
  EXPECT_FALSE(lease->lost()) << lease->reason();
  EXPECT_EQ(admin("GET " + lease->key()), lease->token());
  EXPECT_GT(lease->safe_time_left(), 0ms);
  EXPECT_LE(lease->safe_time_left(), 300ms);
  EXPECT_NO_THROW(lease->ensure(50ms));
  EXPECT_THROW(lease->ensure(10s), Error) << "cannot promise more than a TTL";
  EXPECT_TRUE(lease->release());
  EXPECT_EQ(admin("EXISTS " + lease->key()), "0");
}

TEST_F(LeaseTest, DeletedKeyIsReportedLostThroughStopTokenAndCallback) {
  auto lease = sched->acquire(resource("del"), LockOptions{.ttl = 600ms});
  ASSERT_TRUE(lease);
  std::atomic<int> calls{0};
  std::atomic<LeaseState> seen{LeaseState::active};
  lease->on_lost([&](LeaseState s, const std::string&) {
    seen = s;
    calls++;
  });
  auto stop = lease->stop_token();
  admin("DEL " + lease->key());
  const auto t0 = Clock::now();
  ASSERT_TRUE(eventually([&] { return stop.stop_requested(); }, 3s));
  EXPECT_LT(Clock::now() - t0, 1s) << "loss must be noticed at the next renewal (ttl/3)";
  EXPECT_TRUE(eventually([&] { return calls.load() == 1; }, 1s));
  EXPECT_EQ(seen.load(), LeaseState::token_gone);
  EXPECT_TRUE(lease->lost());
  EXPECT_THROW(lease->ensure(0ms), Error);
  try {
    lease->ensure(1ms);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::lease_lost);
  }
  EXPECT_FALSE(lease->release()) << "a lost lease must not delete anything";
}

TEST_F(LeaseTest, ALeaseTakenOverBySomeoneElseIsLost) {
  auto lease = sched->acquire(resource("steal"), LockOptions{.ttl = 600ms});
  ASSERT_TRUE(lease);
  admin("SET " + lease->key() + " intruder PX 10000");
  ASSERT_TRUE(eventually([&] { return lease->lost(); }, 3s));
  EXPECT_EQ(lease->state(), LeaseState::token_gone);
  lease->release();
  EXPECT_EQ(admin("GET " + lease->key()), "intruder") << "release of a lost lease deleted another owner's lock";
}

TEST_F(LeaseTest, RedisPausedPastTheTtlLosesTheLease) {
  auto lease = sched->acquire(resource("pause"), LockOptions{.ttl = 500ms});
  ASSERT_TRUE(lease);
  ASSERT_TRUE(pause_clients(1500ms));
  ASSERT_TRUE(eventually([&] { return lease->lost(); }, 3s));
  EXPECT_EQ(lease->state(), LeaseState::expired) << lease->reason();
}

TEST_F(LeaseTest, HardTimeoutStopsTheJob) {
  auto lease = sched->acquire(resource("hard"), LockOptions{.ttl = 5s}, LeaseOptions{.hard_timeout = 300ms});
  ASSERT_TRUE(lease);
  auto stop = lease->stop_token();
  ASSERT_TRUE(eventually([&] { return stop.stop_requested(); }, 3s));
  EXPECT_EQ(lease->state(), LeaseState::timed_out);
}


// The hard timeout leaves the key ours: the scheduler deletes it at once, so
// the next holder need not wait out the TTL (30 s here, far longer than the
// test's wait, so a key gone by expiry cannot pass for one deleted).
TEST_F(LeaseTest, ALeaseEndedByTheHardTimeoutDeletesItsKey) {
  auto lease = sched->acquire(resource("hard-del"), LockOptions{.ttl = 30s}, LeaseOptions{.hard_timeout = 200ms});
  ASSERT_TRUE(lease);
  ASSERT_EQ(admin("GET " + lease->key()), lease->token());
  ASSERT_TRUE(eventually([&] { return lease->stop_token().stop_requested(); }, 10s));
  EXPECT_EQ(lease->state(), LeaseState::timed_out);
  ASSERT_TRUE(eventually([&] { return admin("EXISTS " + lease->key()) == "0"; }, 10s))
      << "PTTL " << admin("PTTL " + lease->key());
  // The resource is free for a try-once acquire, and the lost lease's release
  // leaves the new holder's key alone.
  auto next = svc->acquire(lease->resource(), LockOptions{.ttl = 30s});
  ASSERT_TRUE(next);
  EXPECT_FALSE(lease->release());
  EXPECT_EQ(admin("GET " + next->key()), next->token());
  EXPECT_TRUE(next->release());
}

// Renewals due together share one script call; a key taken in the middle of
// that batch loses its own lease and no other.
TEST_F(LeaseTest, ABatchOfRenewalsLosesOnlyTheLeasesWhoseKeysWereTaken) {
  constexpr int kLeases = 300;  // more than one batch of 256
  std::vector<Lease> leases;
  for (int i = 0; i < kLeases; ++i) {
    auto l = sched->acquire(resource("batch" + std::to_string(i)), LockOptions{.ttl = 600ms});
    ASSERT_TRUE(l);
    leases.push_back(std::move(*l));
  }
  for (int i : {3, 150, 299}) admin("SET " + leases[static_cast<std::size_t>(i)].key() + " intruder PX 10000");
  const auto before = sched->stats();
  const auto commands_before = client->stats().commands;
  std::this_thread::sleep_for(1500ms);  // several renewals each
  const auto commands = client->stats().commands - commands_before;
  for (int i = 0; i < kLeases; ++i) {
    const auto& l = leases[static_cast<std::size_t>(i)];
    if (i == 3 || i == 150 || i == 299) {
      EXPECT_EQ(l.state(), LeaseState::token_gone) << i;
      EXPECT_EQ(admin("GET " + l.key()), "intruder") << i;
    } else {
      EXPECT_FALSE(l.lost()) << i << ": " << l.reason();
      EXPECT_EQ(admin("GET " + l.key()), l.token()) << i;
    }
  }
  const auto st = sched->stats();
  const auto renewals = st.renewals_sent - before.renewals_sent;
  EXPECT_GE(renewals, static_cast<std::uint64_t>(kLeases) * 2);
  // One command per batch, not per renewal (the client counts what it sent).
  EXPECT_LT(commands * 10, renewals) << commands << " commands carried " << renewals << " renewals";
  // ... plus one incident record (XADD) per lease lost (admin::record_incident),
  // and the clock probe's TIME every 200 ms while leases are held.
  EXPECT_LE(commands, st.renewal_batches - before.renewal_batches + 2 + 3 + 1500 / 200 + 1);
}

TEST_F(LeaseTest, ExtendManyAnswersEachEntryAndNamesTheServerOnError) {
  auto a = svc->acquire(resource("em-a"), LockOptions{.ttl = 5s});
  auto b = svc->acquire(resource("em-b"), LockOptions{.ttl = 5s});
  ASSERT_TRUE(a && b);
  std::promise<std::pair<Error, std::vector<bool>>> p;
  // Entries are views: every string they name lives as long as they do.
  const std::string none = resource("em-none");
  std::vector<LockService::ExtendEntry> entries{{a->resource(), a->token(), 60s},
                                                {b->resource(), "not-the-token", 60s, b->key()},
                                                {none, "x", 60s}};
  svc->async_extend_many(entries, [&](const Error& e, std::vector<bool> ours) { p.set_value({e, ours}); });
  auto [err, ours] = p.get_future().get();
  ASSERT_FALSE(err) << err.what();
  EXPECT_EQ(ours, (std::vector<bool>{true, false, false}));
  EXPECT_GT(std::stoll(admin("PTTL " + a->key())), 10000);
  EXPECT_LE(std::stoll(admin("PTTL " + b->key())), 5000) << "a wrong token must not extend";

  server->kill();
  std::promise<Error> q;
  svc->async_extend_many(entries, [&](const Error& e, std::vector<bool>) { q.set_value(e); });
  const Error e = q.get_future().get();
  EXPECT_TRUE(e);
  EXPECT_NE(std::string(e.what()).find(std::to_string(server->port())), std::string::npos) << e.what();
}
