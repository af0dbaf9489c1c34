// Quorum (Redlock) locks over three private, independent redis-servers:
// majorities, the validity time, the undo of failed attempts on every
// instance, leases, fences across holders and restarts, deadlines, and
// contenders through a crash and an empty restart.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include "jobguard/async.hpp"
#include "jobguard/quorum.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/testing/embedded_redis.hpp"
#include "support/critical_section.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using jobguard::test::eventually;
using jobguard::test::redis_command_at;
using Clock = std::chrono::steady_clock;

namespace {

std::int64_t ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// Short TTLs below get a 200 ms per-instance deadline rather than ttl/10: a
// loaded CI machine can take more than 50 ms to answer on loopback.
class QuorumTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (std::size_t i = 0; i < n_; ++i) {
      servers.push_back(std::make_unique<EmbeddedRedis>());
      servers.back()->start();
    }
    for (std::size_t i = 0; i < n_; ++i) {
      clients.push_back(std::make_unique<redis::Client>(options(i)));
      ASSERT_TRUE(clients.back()->wait_connected(5s));
      trust_new_server(*clients.back());
    }
    std::vector<redis::Client*> raw;
    for (auto& c : clients) raw.push_back(c.get());
    svc = QuorumLockService::create(raw);
  }

  void TearDown() override {
    for (auto& s : servers) s->resume();  // a test that failed while one was stopped
    svc.reset();
    clients.clear();
    servers.clear();
  }

  redis::ConnectionOptions options(std::size_t i) const {
    redis::ConnectionOptions o;
    o.host = servers[i]->host();
    o.port = servers[i]->port();
    o.command_timeout = 2000ms;
    o.connect_timeout = 1000ms;
    o.lock_max_ttl = max_ttl;
    return o;
  }

  std::string admin(std::size_t i, const std::string& cmd) const {
    return redis_command_at(servers[i]->host(), servers[i]->port(), cmd);
  }
  std::string key() const { return svc->keys().lock_key(resource()); }
  std::string resource() const {
    return std::string("q:") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  // How many instances hold `value` under the lock key.
  std::size_t holding(const std::string& value) const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < n_; ++i)
      if (servers[i]->running() && admin(i, "GET " + key()) == value) ++n;
    return n;
  }
  std::size_t existing() const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < n_; ++i)
      if (servers[i]->running() && admin(i, "EXISTS " + key()) == "1") ++n;
    return n;
  }

  std::size_t n_ = 3;
  std::chrono::milliseconds max_ttl{60000};
  std::vector<std::unique_ptr<EmbeddedRedis>> servers;
  std::vector<std::unique_ptr<redis::Client>> clients;
  std::shared_ptr<QuorumLockService> svc;
};

TEST_F(QuorumTest, GrantedOnAllThreeAndReleasedOnAllThree) {
  EXPECT_EQ(svc->quorum(), 2u);
  auto l = svc->acquire(resource(), QuorumOptions{.ttl = 5s});
  ASSERT_TRUE(l);
  EXPECT_EQ(l->granted(), 3u);
  EXPECT_EQ(holding(l->token()), 3u);
  EXPECT_GT(l->validity_left(), 0ms);
  EXPECT_LE(l->validity_left(), 5000ms - quorum_drift(5s, 0.01));
  const auto pttl = std::stoll(admin(0, "PTTL " + key()));
  EXPECT_GT(pttl, 4000);
  EXPECT_LE(pttl, 5000);
  EXPECT_EQ(l->release(), 3u);
  EXPECT_FALSE(l->held());
  EXPECT_EQ(existing(), 0u);
}

TEST_F(QuorumTest, DriftIsTtlTimesFactorPlusTwoMilliseconds) {
  EXPECT_EQ(quorum_drift(10000ms, 0.01), 102ms);
  EXPECT_EQ(quorum_drift(1000ms, 0.01), 12ms);
  EXPECT_EQ(quorum_drift(150ms, 0.01), 4ms);  // 1.5 rounded up, + 2
  EXPECT_EQ(quorum_drift(100ms, 0.0), 2ms);
}

TEST_F(QuorumTest, OneOfThreeDownTheMajorityStillGrants) {
  servers[2]->kill();
  auto l = svc->acquire(resource(), QuorumOptions{.ttl = 5s});
  ASSERT_TRUE(l);
  EXPECT_EQ(l->granted(), 2u);
  EXPECT_EQ(holding(l->token()), 2u);
  EXPECT_EQ(l->release(), 2u);
  EXPECT_EQ(existing(), 0u);
}

TEST_F(QuorumTest, TwoOfThreeDownIsRefusedAndNothingIsLeftOnTheLiveOne) {
  servers[1]->kill();
  servers[2]->kill();
  const auto t0 = Clock::now();
  try {
    auto l = svc->acquire(resource(), QuorumOptions{.ttl = 5s, .wait = 300ms});
    FAIL() << "granted with one of three instances";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::redis_unavailable)) << e.what();
    EXPECT_NE(std::string(e.what()).find("1 of 3 instances answered, 2 needed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(clients[1]->address()), std::string::npos) << e.what();
  }
  EXPECT_LT(ms_since(t0), 2000);
  EXPECT_EQ(admin(0, "EXISTS " + key()), "0") << "the failed attempt was not undone on the live instance";
}

TEST_F(QuorumTest, ASecondContenderIsRefusedWhileHeldAndGrantedAfterRelease) {
  auto a = svc->acquire(resource(), QuorumOptions{.ttl = 5s});
  ASSERT_TRUE(a);
  auto b = svc->acquire(resource(), QuorumOptions{.ttl = 5s, .wait = 200ms});
  EXPECT_FALSE(b);
  EXPECT_EQ(holding(a->token()), 3u) << "the refused contender disturbed the holder";
  EXPECT_EQ(a->release(), 3u);
  b = svc->acquire(resource(), QuorumOptions{.ttl = 5s});
  ASSERT_TRUE(b);
  EXPECT_NE(b->token(), a->token());
  EXPECT_EQ(b->granted(), 3u);
}

TEST_F(QuorumTest, AWaitingContenderRetriesUntilTheHolderReleases) {
  auto a = svc->acquire(resource(), QuorumOptions{.ttl = 5s});
  ASSERT_TRUE(a);
  std::optional<QuorumLock> b;
  std::thread t([&] { b = svc->acquire(resource(), QuorumOptions{.ttl = 5s, .wait = 5s}); });
  // The release happens while the contender is between attempts or in one.
  ASSERT_TRUE(eventually([&] { return a->validity_left() < 4900ms; }));
  a->release();
  t.join();
  ASSERT_TRUE(b);
  EXPECT_EQ(holding(b->token()), 3u);
}

TEST_F(QuorumTest, AMinorityHeldByAStrangerStillLetsTheMajorityGrant) {
  // The rule: a key on a minority (another client's leftover, a half-done
  // attempt) does not block a grant; the stranger's key is left as it is.
  admin(0, "SET " + key() + " stranger PX 10000");
  auto l = svc->acquire(resource(), QuorumOptions{.ttl = 5s});
  ASSERT_TRUE(l);
  EXPECT_EQ(l->granted(), 2u);
  EXPECT_EQ(l->release(), 2u);
  EXPECT_EQ(admin(0, "GET " + key()), "stranger");
}

TEST_F(QuorumTest, AMajorityHeldByAStrangerIsBusyAndTheFreeInstanceIsUndone) {
  admin(0, "SET " + key() + " stranger PX 10000");
  admin(1, "SET " + key() + " stranger PX 10000");
  auto l = svc->acquire(resource(), QuorumOptions{.ttl = 5s});
  EXPECT_FALSE(l);
  EXPECT_EQ(admin(2, "EXISTS " + key()), "0");
  EXPECT_EQ(holding("stranger"), 2u);
}

TEST_F(QuorumTest, ValidityTakesOffElapsedTimeSlowInstancesAreRefusedAndUndoneEverywhere) {
  // Two instances stopped for 1.2 s answer after the 1 s TTL: a majority
  // grants, but with no validity left; the grant is undone on all three.
  servers[1]->pause();
  servers[2]->pause();
  std::thread resumer([&] {
    std::this_thread::sleep_for(1200ms);
    servers[1]->resume();
    servers[2]->resume();
  });
  Error err;
  try {
    auto l = svc->acquire(resource(), QuorumOptions{.ttl = 1000ms, .instance_timeout = 5000ms});
    EXPECT_FALSE(l) << "granted with no validity left";
  } catch (const Error& e) {
    err = e;
  }
  resumer.join();
  EXPECT_EQ(err.code(), make_error_code(errc::timeout)) << err.what();
  EXPECT_NE(std::string(err.what()).find("granted on 3 of 3"), std::string::npos) << err.what();
  // Within the TTL of the late grants (written after the resume): gone
  // because they were undone, not expired.
  EXPECT_EQ(existing(), 0u);
}

TEST_F(QuorumTest, TheDriftAllowanceAloneCanLeaveNoValidity) {
  // drift = 100 ms * 0.98 + 2 ms = the whole TTL: validity <= 0 however fast.
  EXPECT_THROW(svc->acquire(resource(), QuorumOptions{.ttl = 100ms, .clock_drift_factor = 0.98}), Error);
  EXPECT_EQ(existing(), 0u);
  auto l = svc->acquire(resource(), QuorumOptions{.ttl = 100ms, .clock_drift_factor = 0.5});
  ASSERT_TRUE(l);
  EXPECT_LE(l->valid_until() - l->acquired_at(), 100ms - 52ms);
}

TEST_F(QuorumTest, APausedInstanceDoesNotHangAcquireOrRelease) {
  // Proved to hold (a pause that ends early would grant on all three).
  ASSERT_TRUE(jobguard::test::pause_clients_at(options(0), servers[0]->host(), servers[0]->port(), 2000ms));
  const auto t0 = Clock::now();
  auto l = svc->acquire(resource(), QuorumOptions{.ttl = 10s});
  EXPECT_LT(ms_since(t0), 1000) << "acquire waited on the paused instance";
  ASSERT_TRUE(l);
  EXPECT_EQ(l->granted(), 2u);
  const auto t1 = Clock::now();
  EXPECT_EQ(l->release(), 2u);
  EXPECT_LT(ms_since(t1), 1000) << "release waited on the paused instance";
  // The paused instance runs the late grant and then its undo, in order on
  // one connection: nothing is left behind there either.
  EXPECT_TRUE(eventually([&] { return admin(0, "PING") == "PONG"; }, 10s));
  EXPECT_EQ(admin(0, "EXISTS " + key()), "0");
}

TEST_F(QuorumTest, ExtendMovesTheValidityOnAMajority) {
  auto l = svc->acquire(resource(), QuorumOptions{.ttl = 1000ms});
  ASSERT_TRUE(l);
  const auto before = l->valid_until();
  ASSERT_TRUE(l->extend(5000ms));
  EXPECT_GT(l->valid_until(), before + 3000ms);
  EXPECT_GT(std::stoll(admin(1, "PTTL " + key())), 4000);
  admin(0, "DEL " + key());
  admin(1, "SET " + key() + " stranger");
  EXPECT_FALSE(l->extend()) << "extended with one instance of three";
}

TEST_F(QuorumTest, LeaseRenewsOnAMajorityAndIsLostWhenTheMajorityLosesTheToken) {
  auto l = svc->acquire(resource(), QuorumOptions{.ttl = 600ms, .instance_timeout = 200ms});
  ASSERT_TRUE(l);
  const std::string token = l->token();
  auto lease = QuorumLease::adopt(std::move(*l));
  std::atomic<int> called{0};
  std::atomic<LeaseState> seen{LeaseState::active};
  lease.on_lost([&](LeaseState s, const std::string&) {
    seen = s;
    ++called;
  });
  // Renewed past several TTLs.
  ASSERT_TRUE(eventually([&] { return lease.renewals() >= 4; }, 10s)) << lease.reason();
  EXPECT_FALSE(lease.lost());
  EXPECT_EQ(holding(token), 3u);
  // One instance gone: a majority still renews.
  servers[2]->kill();
  auto r = lease.renewals();
  ASSERT_TRUE(eventually([&] { return lease.renewals() >= r + 3; }, 10s)) << lease.reason();
  EXPECT_FALSE(lease.lost());
  EXPECT_GT(lease.safe_time_left(), 0ms);
  // Back empty: it answers "not yours", the two others still renew.
  servers[2]->start();
  ASSERT_TRUE(eventually([&] { return clients[2]->stats().connected > 0; }, 10s));
  r = lease.renewals();
  ASSERT_TRUE(eventually([&] { return lease.renewals() >= r + 2; }, 10s)) << lease.reason();
  EXPECT_EQ(admin(2, "EXISTS " + key()), "0");
  // Another instance's key taken by a stranger: two of three say the token
  // is not ours, so no majority can be had.
  admin(1, "SET " + key() + " stranger PX 10000");
  ASSERT_TRUE(eventually([&] { return lease.lost(); }, 10s));
  EXPECT_EQ(lease.state(), LeaseState::token_gone) << lease.reason();
  EXPECT_NE(lease.reason().find("no longer ours"), std::string::npos) << lease.reason();
  EXPECT_TRUE(lease.stop_token().stop_requested());
  EXPECT_EQ(lease.safe_time_left(), 0ms);
  EXPECT_THROW(lease.ensure(1ms), Error);
  EXPECT_TRUE(eventually([&] { return called.load() == 1; }));
  EXPECT_EQ(seen.load(), LeaseState::token_gone);
  EXPECT_FALSE(lease.release()) << "a lost lease released";
  EXPECT_EQ(admin(1, "GET " + key()), "stranger");
}

TEST_F(QuorumTest, LeaseExpiresWhenAMajorityStopsAnswering) {
  auto l = svc->acquire(resource(), QuorumOptions{.ttl = 500ms, .instance_timeout = 200ms});
  ASSERT_TRUE(l);
  auto lease = QuorumLease::adopt(std::move(*l));
  ASSERT_TRUE(eventually([&] { return lease.renewals() >= 1; }, 10s)) << lease.reason();
  servers[0]->pause();
  servers[1]->pause();
  ASSERT_TRUE(eventually([&] { return lease.lost(); }, 10s));
  EXPECT_EQ(lease.state(), LeaseState::expired) << lease.reason();
  EXPECT_NE(lease.reason().find(clients[0]->address()), std::string::npos) << lease.reason();
  // It said so no later than the safe time's end plus one renewal's deadline.
  EXPECT_LE(Clock::now() - lease.deadline(), 1000ms);
  servers[0]->resume();
  servers[1]->resume();
}

TEST_F(QuorumTest, LeaseReleaseFreesTheLockOnEveryInstance) {
  auto lease = QuorumLease::adopt(*svc->acquire(resource(), QuorumOptions{.ttl = 5s}));
  EXPECT_EQ(holding(lease.token()), 3u);
  EXPECT_TRUE(lease.release());
  EXPECT_EQ(lease.state(), LeaseState::released);
  EXPECT_EQ(existing(), 0u);
}

TEST_F(QuorumTest, LeaseHardTimeoutStopsAndFreesIt) {
  auto lease = QuorumLease::adopt(*svc->acquire(resource(), QuorumOptions{.ttl = 5s}),
                                  LeaseOptions{.hard_timeout = 200ms});
  ASSERT_TRUE(eventually([&] { return lease.lost(); }, 5s));
  EXPECT_EQ(lease.state(), LeaseState::timed_out);
  EXPECT_TRUE(eventually([&] { return existing() == 0; }, 5s));
}

// One scheduler, one deadline queue: a single-server lease on one server and
// a quorum lease over all three renewed together, each heard through the same
// Lease calls, and the quorum's loss leaves the single-server lease alone.
TEST_F(QuorumTest, OneSchedulerRenewsAQuorumLeaseAndASingleServerLeaseTogether) {
  auto sched = LeaseScheduler::create(LockService::create(*clients[0]));
  auto one = sched->acquire("q:single", LockOptions{.ttl = 600ms, .fence = true});
  auto both = sched->acquire(*svc, resource(), QuorumOptions{.ttl = 600ms, .fence = true, .instance_timeout = 200ms});
  ASSERT_TRUE(one && both);
  EXPECT_EQ(one->quorum_lock(), nullptr);
  ASSERT_NE(both->quorum_lock(), nullptr);
  EXPECT_EQ(both->lock_count(), 0u);
  EXPECT_EQ(sched->stats().active, 2u);
  auto ended = async_wait_lost(*both, boost::asio::use_future);
  std::atomic<int> lost_calls{0};
  for (Lease* l : {&*one, &*both}) {
    EXPECT_TRUE(l->fence());
    l->on_lost([&](LeaseState, const std::string&) { ++lost_calls; });
  }
  // Renewed past several TTLs, both from the same queue.
  ASSERT_TRUE(eventually([&] { return one->renewals() >= 4 && both->renewals() >= 4; }, 10s))
      << one->reason() << both->reason();
  EXPECT_GE(sched->stats().renewals_sent, 8u);
  for (Lease* l : {&*one, &*both}) EXPECT_NO_THROW(l->ensure(1ms)) << l->key();
  EXPECT_EQ(holding(both->token()), 3u);
  admin(0, "SET " + key() + " stranger PX 10000");
  admin(1, "SET " + key() + " stranger PX 10000");
  ASSERT_EQ(ended.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(ended.get(), LeaseState::token_gone);
  EXPECT_TRUE(both->stop_token().stop_requested());
  EXPECT_NE(both->reason().find("no longer ours"), std::string::npos) << both->reason();
  EXPECT_TRUE(eventually([&] { return lost_calls.load() == 1; }));
  const auto r = one->renewals();
  ASSERT_TRUE(eventually([&] { return one->renewals() >= r + 2; }, 10s)) << one->reason();
  EXPECT_FALSE(one->lost());
  EXPECT_EQ(sched->stats().active, 1u);
  EXPECT_EQ(sched->stats().lost, 1u);
  EXPECT_TRUE(one->release());
  EXPECT_FALSE(both->release()) << "a lost lease released";
  EXPECT_EQ(lost_calls.load(), 1);
}

TEST_F(QuorumTest, FencesIncreaseStrictlyAcrossHolders) {
  std::int64_t last = 0;
  for (int i = 0; i < 50; ++i) {
    auto l = svc->acquire(resource(), QuorumOptions{.ttl = 5s, .fence = true});
    ASSERT_TRUE(l && l->fence());
    EXPECT_GT(*l->fence(), last);
    last = *l->fence();
    l->release();
  }
  EXPECT_EQ(svc->acquire(resource(), QuorumOptions{.ttl = 5s})->fence(), std::nullopt);
}

TEST_F(QuorumTest, TheMaximumFenceIsRaisedOnTheMajoritySoALaterMajorityWithoutItsIssuerIssuesAbove) {
  // Instance 0's counter far ahead of the others': the grant's fence is its
  // +1, and must stay the floor when instance 0 is then out of the majority.
  const std::string fkey = svc->keys().fence_key(resource());
  admin(0, "SET " + fkey + " 9000000000000000");
  auto a = svc->acquire(resource(), QuorumOptions{.ttl = 5s, .fence = true});
  ASSERT_TRUE(a && a->fence());
  EXPECT_EQ(*a->fence(), 9000000000000001);
  a->release();
  servers[0]->kill();
  auto b = svc->acquire(resource(), QuorumOptions{.ttl = 5s, .fence = true});
  ASSERT_TRUE(b && b->fence());
  EXPECT_EQ(b->granted(), 2u);
  EXPECT_GT(*b->fence(), *a->fence()) << "a majority without the fence's issuer went back";
}

TEST_F(QuorumTest, FencesStayIncreasingWhenOneInstanceIsFlushedAndItIsQuarantined) {
  std::int64_t last = 0;
  auto grant = [&](std::size_t want) {
    auto l = svc->acquire(resource(), QuorumOptions{.ttl = 500ms, .fence = true, .instance_timeout = 200ms});
    ASSERT_TRUE(l && l->fence());
    EXPECT_EQ(l->granted(), want);
    EXPECT_GT(*l->fence(), last);
    last = *l->fence();
    l->release();
  };
  for (int i = 0; i < 10; ++i) grant(3);
  admin(1, "FLUSHALL");  // its lock, its counter and its lock-state record gone
  // It votes no for its max TTL (60 s here): the two others carry the grants.
  for (int i = 0; i < 10; ++i) grant(2);
  EXPECT_NE(admin(1, "HGET jobguard:epoch reason").find("no lock-state record"), std::string::npos);
  EXPECT_EQ(admin(1, "EXISTS " + svc->keys().fence_key(resource())), "0");
}

TEST_F(QuorumTest, ASingleServerLockServiceHonoursTheQuarantineAQuorumVoteRecorded) {
  admin(1, "FLUSHALL");
  auto l = svc->acquire(resource(), QuorumOptions{.ttl = 5s});
  ASSERT_TRUE(l);
  EXPECT_EQ(l->granted(), 2u);
  auto single = LockService::create(*clients[1]);
  try {
    single->acquire("q:single", LockOptions{.ttl = 5s});
    FAIL() << "the single-server lock granted on a quarantined server";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::server_busy)) << e.what();
  }
}

TEST_F(QuorumTest, AnInstanceThatForgetsTheHoldersVoteIsQuarantinedSoNoSecondHolderIsGranted) {
  // The holder's majority is {0, 1}: a stranger has instance 2.
  admin(2, "SET " + key() + " stranger PX 30000");
  auto holder = svc->acquire(resource(), QuorumOptions{.ttl = 20s});
  ASSERT_TRUE(holder);
  ASSERT_EQ(holder->granted(), 2u);
  // Instance 1 restarts without persistence: the holder's vote there is gone,
  // and the stranger leaves instance 2.
  servers[1]->kill();
  servers[1]->start();
  admin(2, "DEL " + key());
  ASSERT_TRUE(eventually([&] {
    try {
      return clients[1]->exec(redis::Command{"PING"}).str == "PONG";
    } catch (const Error&) {
      return false;
    }
  }, 10s));
  // {1, 2} would be a majority for a second holder. Instance 1 votes no
  // until its max TTL is over.
  EXPECT_FALSE(svc->acquire(resource(), QuorumOptions{.ttl = 20s})) << "two holders at once";
  EXPECT_NE(admin(1, "HGET jobguard:epoch reason").find("no lock-state record"), std::string::npos);
  // Without the quarantine that is exactly what happens: the hazard the
  // Redlock description's "delayed restart" is for.
  admin(1, "DEL jobguard:epoch");
  auto second = svc->acquire(resource(), QuorumOptions{.ttl = 20s, .quarantine = false});
  ASSERT_TRUE(second) << "the hazard did not reproduce: this test would not see a missing quarantine";
  EXPECT_EQ(second->granted(), 2u);
  EXPECT_TRUE(holder->held());
}

class QuorumShortMaxTtl : public QuorumTest {
 protected:
  QuorumShortMaxTtl() { max_ttl = 1500ms; }
};

TEST_F(QuorumShortMaxTtl, AFlushedInstanceVotesAgainAfterItsQuarantineWithAFenceStillAbove) {
  std::int64_t last = 0;
  {
    auto l = svc->acquire(resource(), QuorumOptions{.ttl = 1000ms, .fence = true, .instance_timeout = 200ms});
    ASSERT_TRUE(l && l->fence());
    last = *l->fence();
  }
  admin(2, "FLUSHALL");
  ASSERT_TRUE(eventually(
      [&] {
        auto l = svc->acquire(resource(), QuorumOptions{.ttl = 1000ms, .fence = true, .instance_timeout = 200ms});
        if (!l) return false;
        EXPECT_GT(*l->fence(), last);
        last = *l->fence();
        return l->granted() == 3;
      },
      10s));
}

TEST_F(QuorumShortMaxTtl, AllInstancesQuarantinedIsServerBusyNamingThem) {
  for (std::size_t i = 0; i < n_; ++i) admin(i, "FLUSHALL");
  try {
    svc->acquire(resource(), QuorumOptions{.ttl = 1000ms});
    FAIL() << "granted by quarantined instances";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::server_busy)) << e.what();
    EXPECT_NE(std::string(e.what()).find("lost lock state"), std::string::npos) << e.what();
  }
  EXPECT_THROW(svc->acquire(resource(), QuorumOptions{.ttl = 2000ms}), Error) << "ttl above max_ttl accepted";
}

TEST_F(QuorumTest, AsyncAcquireAnswersOnAnEventLoopAndBlockingCallsAreRefusedThere) {
  std::promise<std::optional<QuorumLock>> p;
  std::atomic<bool> refused_blocking{false};
  svc->async_acquire(resource(), QuorumOptions{.ttl = 5s}, [&](const Error& e, std::optional<QuorumLock> l) {
    EXPECT_FALSE(e) << e.what();
    try {
      svc->acquire("q:other", QuorumOptions{.ttl = 5s});
    } catch (const Error& be) {
      refused_blocking = be.code() == make_error_code(errc::invalid_argument);
    }
    p.set_value(std::move(l));
  });
  auto l = p.get_future().get();
  ASSERT_TRUE(l);
  EXPECT_TRUE(refused_blocking.load());
  EXPECT_EQ(holding(l->token()), 3u);
  std::promise<std::size_t> released;
  l->async_release([&](const Error& e, std::size_t n) {
    EXPECT_FALSE(e) << e.what();
    released.set_value(n);
  });
  EXPECT_EQ(released.get_future().get(), 3u);
  EXPECT_EQ(existing(), 0u);
}

// The completion-token forms, as the single-server lock's: a coroutine
// acquires, is refused while it holds, and releases on every instance.
TEST_F(QuorumTest, AwaitableAcquireAndReleaseHaveTheSingleServerForm) {
  boost::asio::io_context ctx;
  // Named options: g++ 12 mishandles a braced temporary inside co_await
  // (docs/async.md).
  const QuorumOptions opts{.ttl = 5s};
  auto task = [&]() -> boost::asio::awaitable<std::string> {
    auto l = co_await async_acquire(*svc, resource(), opts, boost::asio::use_awaitable);
    if (!l) co_return "not granted";
    if (holding(l->token()) != 3u) co_return "not held on all three";
    if (co_await async_acquire(*svc, resource(), opts, boost::asio::use_awaitable)) co_return "granted twice";
    const std::size_t n = co_await async_release(*l, boost::asio::use_awaitable);
    co_return n == 3u ? "ok" : fmt::format("released on {}", n);
  };
  auto f = boost::asio::co_spawn(ctx, task(), boost::asio::use_future);
  ctx.run();
  EXPECT_EQ(f.get(), "ok");
  EXPECT_EQ(existing(), 0u);
}

// The quorum service answers from its own thread. The caller's io_context may
// be destroyed as soon as run() returns: the operation counts as the caller's
// outstanding work until that thread has finished handing the result over, so
// run() cannot return while the other thread is still inside post(). Without
// that count this loop fails under ThreadSanitizer (a data race on the
// io_context's wake-up condition) or AddressSanitizer (its use after free).
TEST_F(QuorumTest, TheCallersIoContextMayBeDestroyedAsSoonAsRunReturns) {
  const QuorumOptions opts{.ttl = 5s};
  for (int i = 0; i < 40; ++i) {
    std::optional<QuorumLock> held;
    std::size_t released = 0;
    {
      boost::asio::io_context ctx;
      async_acquire(*svc, resource(), opts,
                    boost::asio::bind_executor(ctx, [&](std::exception_ptr e, std::optional<QuorumLock> l) {
                      EXPECT_FALSE(e);
                      held = std::move(l);
                    }));
      ctx.run();
    }
    ASSERT_TRUE(held) << "round " << i;
    {
      boost::asio::io_context ctx;
      async_release(*held, boost::asio::bind_executor(ctx, [&](std::exception_ptr e, std::size_t n) {
                      EXPECT_FALSE(e);
                      released = n;
                    }));
      ctx.run();
    }
    ASSERT_EQ(released, 3u) << "round " << i;
  }
}

TEST_F(QuorumTest, AQuorumOfOneIsAOneInstanceLock) {
  auto one = QuorumLockService::create({clients[0].get()});
  EXPECT_EQ(one->quorum(), 1u);
  auto l = one->acquire(resource(), QuorumOptions{.ttl = 5s, .fence = true});
  ASSERT_TRUE(l && l->fence());
  EXPECT_EQ(l->granted(), 1u);
  EXPECT_FALSE(one->acquire(resource(), QuorumOptions{.ttl = 5s}));
}

class QuorumFive : public QuorumTest {
 protected:
  QuorumFive() { n_ = 5; }
};

TEST_F(QuorumFive, TwoOfFiveDownStillGrantThreeDownRefuse) {
  EXPECT_EQ(svc->quorum(), 3u);
  servers[0]->kill();
  servers[3]->kill();
  auto l = svc->acquire(resource(), QuorumOptions{.ttl = 5s, .fence = true});
  ASSERT_TRUE(l && l->fence());
  EXPECT_EQ(l->granted(), 3u);
  EXPECT_EQ(holding(l->token()), 3u);
  EXPECT_FALSE(svc->acquire(resource(), QuorumOptions{.ttl = 5s})) << "a second holder on five instances";
  EXPECT_EQ(l->release(), 3u);
  servers[4]->kill();
  EXPECT_THROW(svc->acquire(resource(), QuorumOptions{.ttl = 5s}), Error);
  EXPECT_EQ(existing(), 0u);
}

TEST_F(QuorumTest, BadArgumentsAreRefused) {
  EXPECT_THROW(QuorumLockService::create({}), Error);
  EXPECT_THROW(QuorumLockService::create({clients[0].get(), clients[0].get()}), Error);
  EXPECT_THROW(svc->acquire(resource(), QuorumOptions{.ttl = 5ms}), Error);
  EXPECT_THROW(svc->acquire(resource(), QuorumOptions{.clock_drift_factor = 1.5}), Error);
}

// Contenders in threads, each its own service over the same three clients,
// looping acquire / critical section / release while one instance is killed
// and restarted empty. The restarted instance has lost the votes it gave;
// its quarantine keeps it from giving them again until they have expired.
TEST_F(QuorumShortMaxTtl, ContendersThroughACrashAndAnEmptyRestartNeverOverlap) {
  char tmpl[] = "/tmp/jobguard-quorum-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  std::atomic<bool> stop{false};
  std::atomic<int> grants{0}, overlaps{0}, errors{0}, short_validity{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&, w] {
      std::vector<redis::Client*> raw;
      for (auto& c : clients) raw.push_back(c.get());
      auto mine = QuorumLockService::create(raw);
      while (!stop.load()) {
        try {
          auto l = mine->acquire("q:contended", QuorumOptions{.ttl = 1000ms, .wait = 2000ms, .fence = true, .instance_timeout = 200ms});
          if (!l) continue;
          // Only with time to spare: past its validity a holder is not
          // protected, which is what fencing is for (docs/redlock.md).
          if (l->validity_left() < 300ms) {
            ++short_validity;
            continue;
          }
          if (test::hold_critical_section(dir + "/held", dir + "/log", fmt::format("w{} {}", w, *l->fence()), 3ms))
            ++grants;
          else
            ++overlaps;
          l->release();
        } catch (const Error&) {
          ++errors;
          std::this_thread::sleep_for(10ms);
        }
      }
    });
  }
  ASSERT_TRUE(eventually([&] { return grants.load() >= 20; }, 20s));
  servers[1]->kill();
  const int before_restart = grants.load();
  ASSERT_TRUE(eventually([&] { return grants.load() >= before_restart + 20; }, 20s));
  servers[1]->start();  // the same port, empty: no lock, no counter, no record
  const int after_restart = grants.load();
  // Through its quarantine (1.5 s) and after it.
  ASSERT_TRUE(eventually([&] { return grants.load() >= after_restart + 20; }, 20s));
  const auto quarantine_over = Clock::now() + 1600ms;
  ASSERT_TRUE(eventually([&] { return Clock::now() > quarantine_over; }, 5s));
  const int after_quarantine = grants.load();
  ASSERT_TRUE(eventually([&] { return grants.load() >= after_quarantine + 20; }, 20s));
  stop = true;
  for (auto& t : workers) t.join();

  // Fences in grant order (the log's order) strictly increase.
  std::ifstream in(dir + "/log");
  std::string line;
  std::int64_t last = 0;
  int regressions = 0, lines = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kind, who;
    std::int64_t fence = 0;
    ls >> kind >> who >> fence;
    if (kind != "grant") continue;
    ++lines;
    if (fence <= last) ++regressions;
    last = fence;
  }
  std::filesystem::remove_all(dir);
  std::printf("[quorum-contenders] %d grants, %d overlaps, %d fence regressions, %d errors, %d short validity\n",
              grants.load(), overlaps.load(), regressions, errors.load(), short_validity.load());
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(regressions, 0);
  EXPECT_EQ(lines, grants.load());
  EXPECT_EQ(admin(1, "HGET jobguard:epoch reason").find("no lock-state record"), 0u)
      << "the restarted instance was not quarantined";
}

}  // namespace
