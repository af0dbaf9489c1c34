// Locks through a Sentinel failover, across processes (issue #15): four
// worker processes take one lock over and over through a
// redis+sentinel:// URL while the test forces `SENTINEL FAILOVER`. Each
// holder marks the critical section with an O_EXCL file (a second holder
// inside it is an overlap) and logs its fence, in grant order (only a holder
// writes). Counted: grants, overlaps, fences at or below the one before.
// Forked workers: not in the ThreadSanitizer run (see process_test.cpp).
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "support/redis_fixture.hpp"
#include "support/sentinel_redis.hpp"
#include "support/subprocess.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using Clock = std::chrono::steady_clock;

namespace {

struct Tally {
  int grants = 0, overlaps = 0, regressions = 0, errors = 0, unconfirmed = 0;
  long long failover_ms = 0;
};

void append(const std::string& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  // One write per line: O_APPEND keeps lines whole across processes.
  [[maybe_unused]] const auto n = ::write(fd, line.data(), line.size());
  ::close(fd);
}

// One worker process: until `until`, acquire, hold 20 ms, release.
[[noreturn]] void worker(const std::string& url, const std::string& dir, Clock::time_point until) {
  int errors = 0, unconfirmed = 0;
  try {
    auto o = redis::parse_url(url);
    o.command_timeout = 1s;
    o.connect_timeout = 500ms;
    o.on_warning = [](const std::string&) {};
    redis::Client client(o);
    auto svc = LockService::create(client);
    while (Clock::now() < until) {
      std::optional<Lock> lock;
      try {
        lock = svc->acquire("job", {.ttl = 1s, .wait = 1500ms, .fence = true});
      } catch (const Error& e) {
        ++errors;
        if (std::string(e.what()).find("not confirmed by replicas") != std::string::npos) ++unconfirmed;
        std::this_thread::sleep_for(20ms);
        continue;
      }
      if (!lock) continue;
      const std::string held = dir + "/held";
      const int fd = ::open(held.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
      append(dir + "/log", fmt::format("{} {}\n", fd >= 0 ? "grant" : "overlap", *lock->fence()));
      std::this_thread::sleep_for(20ms);
      if (fd >= 0) {
        ::close(fd);
        ::unlink(held.c_str());
      }
      try {
        lock->release();
      } catch (const Error&) {
        ++errors;
      }
    }
  } catch (...) {
    _exit(3);
  }
  append(dir + "/errors", fmt::format("{} {}\n", errors, unconfirmed));
  _exit(0);
}

Tally run_through_failover(int replicas) {
  test::SentinelRedis dep;
  dep.start();
  {
    auto o = redis::parse_url(dep.url());
    redis::Client c(o);
    trust_new_server(c);
  }
  char tmpl[] = "/tmp/jobguard-sentinel-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string url =
      dep.url(fmt::format("max_ttl=1s&replicas={}&replicas_timeout=100ms&sentinel_check=200ms", replicas));
  const auto until = Clock::now() + 7s;
  std::vector<pid_t> kids;
  for (int p = 0; p < 4; ++p) {
    const pid_t pid = ::fork();
    if (pid == 0) worker(url, dir, until);
    kids.push_back(pid);
  }
  std::this_thread::sleep_for(2s);
  Tally t;
  const auto f0 = Clock::now();
  dep.failover();
  t.failover_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - f0).count();
  for (pid_t k : kids) {
    int st = 0;
    ::waitpid(k, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "worker " << k << " status " << st;
  }
  std::istringstream log(test::read_file(dir + "/log"));
  std::string kind;
  long long fence = 0, last = -1;
  while (log >> kind >> fence) {
    if (kind == "overlap") ++t.overlaps;
    else ++t.grants;
    if (fence <= last) ++t.regressions;
    last = fence;
  }
  std::istringstream errs(test::read_file(dir + "/errors"));
  int e = 0, u = 0;
  while (errs >> e >> u) {
    t.errors += e;
    t.unconfirmed += u;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::fprintf(stderr,
               "[sentinel-failover] replicas=%d: %d grants, %d overlaps, %d fences not above the last, %d acquire "
               "errors (%d unconfirmed); the failover took %lld ms\n",
               replicas, t.grants, t.overlaps, t.regressions, t.errors, t.unconfirmed, t.failover_ms);
  return t;
}

}  // namespace

TEST(SentinelFailover, ReplicaConfirmedLocksStayExclusiveAndFencesMonotonic) {
  const Tally t = run_through_failover(1);
  EXPECT_GT(t.grants, 20) << "the workers hardly ran";
  EXPECT_EQ(t.overlaps, 0);
  EXPECT_EQ(t.regressions, 0);
}

TEST(SentinelFailover, WithoutReplicaConfirmation) {
  const Tally t = run_through_failover(0);
  EXPECT_GT(t.grants, 20) << "the workers hardly ran";
  EXPECT_EQ(t.regressions, 0);
  EXPECT_EQ(t.overlaps, 0);
}
