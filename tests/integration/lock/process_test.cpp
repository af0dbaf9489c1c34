// Lock and lease tests that fork worker processes or load one scheduler with
// 10,000 leases. They are not in the ThreadSanitizer run: TSan does not
// support threads in a child forked from a multi-threaded process, and its
// slowdown turns a capacity test into a test of TSan.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <thread>

#include "fixtures.hpp"
#include "jobguard/error.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using Clock = std::chrono::steady_clock;
using jobguard::test::eventually;

namespace {
// Four processes, 20 critical sections each, logged to one file: any
// interleaving of enter/exit lines means the lock failed.
void mutual_exclusion_across_processes(const redis::ConnectionOptions& opts, const std::string& res, bool fair) {
  char tmpl[] = "/tmp/jobguard-mx-XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  close(fd);
  const std::string log = tmpl;
  std::vector<pid_t> kids;
  for (int p = 0; p < 4; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        redis::Client c(opts);
        auto s = LockService::create(c);
        for (int i = 0; i < 20; ++i) {
          auto l = s->acquire(res, LockOptions{.ttl = 5s, .wait = 20s, .fair = fair});
          if (!l) {
            rc = 2;
            break;
          }
          std::ofstream(log, std::ios::app) << "enter " << p << "\n" << std::flush;
          std::this_thread::sleep_for(1ms);
          std::ofstream(log, std::ios::app) << "exit " << p << "\n" << std::flush;
          l->release();
        }
      } catch (...) {
        rc = 3;
      }
      _exit(rc);
    }
    kids.push_back(pid);
  }
  for (pid_t k : kids) {
    int st = 0;
    waitpid(k, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
  }
  std::ifstream in(log);
  std::string what, who, holder;
  int n = 0;
  while (in >> what >> who) {
    if (what == "enter") {
      EXPECT_EQ(holder, "") << "process " << who << " entered while " << holder << " was inside";
      holder = who;
      ++n;
    } else {
      EXPECT_EQ(holder, who);
      holder.clear();
    }
  }
  EXPECT_EQ(n, 80);
  unlink(tmpl);
}
}  // namespace

TEST_F(LockTest, MutualExclusionAcrossProcesses) {
  mutual_exclusion_across_processes(options(), resource("proc"), false);
}

TEST_F(LockTest, FairMutualExclusionAcrossProcesses) {
  // Fair releases hand the lock from process to process (release.lua).
  mutual_exclusion_across_processes(options(), resource("proc"), true);
}

TEST_F(LockTest, FairWaiterKilledInTheQueueIsNotHandedTheLock) {
  // A queued waiter's process dies. The release must not make it the holder
  // (for its 60 s TTL): its grant channel has no listener, so the lock stays
  // free, and the next waiter gets it once the dead one's place expires (2 s).
  const std::string res = resource("dead-waiter");
  auto a = svc->acquire(res, LockOptions{.ttl = 10s, .fair = true});
  ASSERT_TRUE(a);
  const auto opts = options();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      redis::Client c(opts);
      auto s = LockService::create(c);
      s->acquire(res, LockOptions{.ttl = 60s, .wait = 60s, .fair = true});
    } catch (...) {
    }
    _exit(0);
  }
  ASSERT_TRUE(fair_queue_ready(res, 1));
  const std::string entry = admin("LINDEX " + svc->keys().queue_key(res) + " 0");
  const std::string channel = entry_channel(entry);
  ASSERT_FALSE(channel.empty()) << entry;
  kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
  // Redis has dropped the dead process's connections (as it does within
  // moments of the kernel closing them).
  ASSERT_TRUE(eventually(
      [&] {
        auto r = client->exec(redis::Command{"PUBSUB", "NUMSUB", channel});
        return r.is_array() && r.elements.size() == 2 && r.elements[1].is_integer() && r.elements[1].integer == 0;
      },
      5s));
  // Our own waiter queues behind the dead one.
  auto c2 = make_client();
  auto svc2 = LockService::create(*c2);
  std::optional<Lock> b;
  Clock::duration waited{};
  std::thread t([&] {
    const auto t0 = Clock::now();
    b = svc2->acquire(res, LockOptions{.ttl = 10s, .wait = 15s, .fair = true});
    waited = Clock::now() - t0;
  });
  ASSERT_TRUE(eventually([&] { return admin("LLEN " + svc->keys().queue_key(res)) == "2"; }, 5s));
  ASSERT_TRUE(a->release());
  const std::string holder = admin("GET " + a->key());
  EXPECT_TRUE(holder.empty() || holder == "(nil)") << "the release handed the lock to " << holder;
  t.join();
  ASSERT_TRUE(b);
  EXPECT_LT(waited, 10s);
  EXPECT_TRUE(b->release());
}

TEST_F(LeaseTest, StoppedProcessDetectsTheLossOnResume) {
  // A child holds a lease (ttl 400 ms); we SIGSTOP it for 1.5 s. On SIGCONT it
  // must report the lease lost from its own clock (state expired: the safe
  // time passed while it was stopped), not learn it from its next renewal's
  // reply (token_gone), and must not have renewed it after the fact.
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
        std::atomic<int> lost_as{-1};
        lease->on_lost([&](LeaseState st, const std::string&) { lost_as = static_cast<int>(st); });
        char ok = 'r';
        (void)!write(pipefd[1], &ok, 1);
        // Watch for the gap the stop leaves in our own timeline.
        auto last = Clock::now();
        Clock::time_point resumed{};
        rc = 11;
        for (int i = 0; i < 5000; ++i) {
          std::this_thread::sleep_for(2ms);
          const auto now = Clock::now();
          if (resumed == Clock::time_point{} && now - last > 1s) resumed = now;
          last = now;
          if (resumed != Clock::time_point{} && lost_as.load() >= 0) {
            std::fprintf(stderr, "[sigstop] loss reported %lld ms after the resume\n",
                         static_cast<long long>(
                             std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - resumed).count()));
            rc = lost_as.load() == static_cast<int>(LeaseState::expired) ? 0 : 12;
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
  EXPECT_EQ(WEXITSTATUS(st), 0) << "10: no lease, 11: loss not reported, 12: learned from a renewal, not from its own clock";
}

TEST_F(LeaseTest, OneSchedulerRenewsTenThousandLeasesInBatches) {
  constexpr int kLeases = 10000;
  // 10,000 grants pipelined at once queue behind each other: on a loaded
  // machine under ASan the last waits longer than the fixture's 2 s command
  // deadline. This test is about renewals, so its client gets 30 s.
  sched.reset();
  svc.reset();
  auto o = options();
  o.command_timeout = 30s;
  client = std::make_unique<redis::Client>(o);
  ASSERT_TRUE(client->wait_connected(5s));
  svc = LockService::create(*client);
  sched = LeaseScheduler::create(svc);
  std::mutex mu;
  std::vector<Lease> leases;
  leases.reserve(kLeases);
  std::atomic<int> done{0}, failed{0};
  for (int i = 0; i < kLeases; ++i) {
    // Adopt in the completion: the scheduler owns each lock from its grant.
    // A TTL of 6 s leaves each renewal 4 s of slack: the sanitized build on a
    // loaded 2-core machine renews 10,000 leases in batches well inside it.
    svc->async_acquire(resource(std::to_string(i)), LockOptions{.ttl = 6s},
                       [&](const Error& e, std::optional<Lock> l) {
                         if (e || !l) {
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
  std::this_thread::sleep_for(13s);  // more than two TTLs
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
  // Every lock key, plus the server's lock-state record (jobguard:epoch).
  EXPECT_EQ(admin("DBSIZE"), std::to_string(kLeases + 1));
}
