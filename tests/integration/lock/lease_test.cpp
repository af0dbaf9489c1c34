#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/lease.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using Clock = std::chrono::steady_clock;
using jobguard::test::eventually;

class LeaseTest : public jobguard::test::RedisTest {
 protected:
  void SetUp() override {
    RedisTest::SetUp();
    client = make_client();
    svc = LockService::create(*client);
    sched = LeaseScheduler::create(svc);
  }
  void TearDown() override {
    sched.reset();
    svc.reset();
    client.reset();
    RedisTest::TearDown();
  }
  std::string resource(const std::string& s) const {
    return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + ":" + s;
  }
  std::unique_ptr<redis::Client> client;
  std::shared_ptr<LockService> svc;
  std::shared_ptr<LeaseScheduler> sched;
};

TEST_F(LeaseTest, RenewalKeepsTheLockFarPastItsTtl) {
  auto lease = sched->acquire(resource("long"), LockOptions{.ttl = 300ms});
  ASSERT_TRUE(lease);
  std::this_thread::sleep_for(1500ms);  // five TTLs
  EXPECT_FALSE(lease->lost()) << lease->reason();
  EXPECT_EQ(admin("GET " + lease->key()), lease->token());
  EXPECT_GE(lease->renewals(), 8u);
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
  admin("CLIENT PAUSE 1500 ALL");
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

TEST_F(LeaseTest, StoppedProcessDetectsTheLossOnResume) {
  // A child holds a lease (ttl 400 ms); we SIGSTOP it for 1.5 s. On SIGCONT it
  // must report the lease lost at once, not at its next renewal, and must not
  // have renewed it after the fact.
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const auto opts = options();
  const std::string res = resource("sigstop");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(pipefd[0]);
    int rc = 10;
    {
      redis::Client c(opts);
      auto s = LockService::create(c);
      auto sch = LeaseScheduler::create(s);
      auto lease = sch->acquire(res, LockOptions{.ttl = 400ms});
      if (lease) {
        std::atomic<bool> lost{false};
        lease->on_lost([&](LeaseState, const std::string&) { lost = true; });
        char ok = 'r';
        (void)!write(pipefd[1], &ok, 1);
        // Watch for the gap the stop leaves in our own timeline.
        auto last = Clock::now();
        Clock::time_point resumed{};
        rc = 11;
        for (int i = 0; i < 2000; ++i) {
          std::this_thread::sleep_for(2ms);
          const auto now = Clock::now();
          if (resumed == Clock::time_point{} && now - last > 1s) resumed = now;
          last = now;
          if (resumed != Clock::time_point{} && lost.load()) {
            rc = (Clock::now() - resumed) < 300ms ? 0 : 12;
            break;
          }
        }
        lease->release();
      }
    }
    _exit(rc);
  }
  close(pipefd[1]);
  char buf = 0;
  ASSERT_EQ(read(pipefd[0], &buf, 1), 1);
  close(pipefd[0]);
  std::this_thread::sleep_for(50ms);
  kill(pid, SIGSTOP);
  std::this_thread::sleep_for(1500ms);
  kill(pid, SIGCONT);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "10: no lease, 11: loss not reported, 12: reported late";
}

TEST_F(LeaseTest, OneSchedulerRenewsTenThousandLeasesInBatches) {
  constexpr int kLeases = 10000;
  std::mutex mu;
  std::vector<Lease> leases;
  leases.reserve(kLeases);
  std::atomic<int> done{0}, failed{0};
  for (int i = 0; i < kLeases; ++i) {
    // Adopt in the completion: the scheduler owns each lock from its grant.
    svc->async_acquire(resource(std::to_string(i)), LockOptions{.ttl = 3s},
                       [&](std::error_code ec, std::optional<Lock> l) {
                         if (ec || !l) {
                           failed++;
                         } else {
                           Lease lease = sched->adopt(std::move(*l));
                           std::lock_guard<std::mutex> g(mu);
                           leases.push_back(std::move(lease));
                         }
                         done++;
                       });
  }
  ASSERT_TRUE(eventually([&] { return done.load() == kLeases; }, 60s));
  ASSERT_EQ(failed.load(), 0);
  std::this_thread::sleep_for(7s);  // more than two TTLs
  int lost = 0;
  {
    std::lock_guard<std::mutex> g(mu);
    for (auto& l : leases) lost += l.lost() ? 1 : 0;
  }
  EXPECT_EQ(lost, 0);
  const auto st = sched->stats();
  EXPECT_EQ(st.active, static_cast<std::uint64_t>(kLeases));
  EXPECT_GE(st.renewals_sent, static_cast<std::uint64_t>(kLeases) * 2);
  // Renewals falling due together leave together: far fewer wake-ups than renewals.
  EXPECT_LT(st.renewal_batches * 20, st.renewals_sent) << st.renewal_batches << " batches";
  EXPECT_EQ(admin("DBSIZE"), std::to_string(kLeases));
}
