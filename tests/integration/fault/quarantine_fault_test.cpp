// Redis losing lock state must not let a second holder join
// the first. Real `jobguard run --fence` workers take jobs one after another
// (all of them contend for the current one); each job's CMD reads whether the
// job is done, works for a while (the window a fault lands in), then applies
// its effect through a downstream that rejects a fencing token at or below the
// last one it accepted for that job, and logs every start and every effect.
// Faults, each injected while a holder is mid-effect:
//   - redis-server restarted without persistence, three times;
//   - failover to a replica that was stopped (SIGSTOP) during the grant, then
//     promoted (REPLICAOF NO ONE); clients reach Redis through a TCP relay
//     that switches to it and drops its connections, as a moving VIP does;
//   - a server that evicts keys (maxmemory + volatile-lru) flooded by filler.
// No worker opts out of the quarantine. Counted from the downstream's log:
// 0 jobs done twice, 0 stale writes accepted, 0 jobs lost; the jobs completed
// against the same run without faults, and the time grants were refused.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <future>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "jobguard/testing/embedded_redis.hpp"
#include "support/cluster_redis.hpp"
#include "support/redis_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Short enough for CI: a lease of 1 s and a quarantine (max TTL) of 2 s.
constexpr const char* kTtl = "1s";
constexpr const char* kMaxTtl = "2s";
constexpr const char* kEffectSeconds = "0.6";
// When a fault lands, counted from the start of the holder's CMD: after its
// lease's first renewal (ttl/3 from the grant) and 200 ms before its write,
// so the holder's next renewal comes only after it has written: the fault
// goes unnoticed by the holder, which writes shortly after it.
constexpr auto kFaultAfter = 400ms;
constexpr int kWorkers = 3;
constexpr auto kRunFor = 6s;       // new jobs are taken for this long
constexpr auto kMoreFor = 12s;     // and on, until the run's faults are in, for at most this
constexpr auto kDrainFor = 25s;    // then the job in progress must finish within this

// The job's CMD: $1 job, $2 store dir, $3 effect seconds. The store is a
// directory guarded by flock(1): `fence.J` is the highest token accepted for
// job J, `log` has one line per start, skip, effect and rejection:
// "<kind> <job> <fence> <pid> <unix time ns>".
constexpr const char* kJobScript = R"SH(set -e
cd "$2"
exec 9>>store.lock
flock 9
if grep -q "^effect $1 " log 2>/dev/null; then echo "skip $1 $JOBGUARD_FENCE $$ $(date +%s%N)" >> log; exit 0; fi
echo "start $1 $JOBGUARD_FENCE $$ $(date +%s%N)" >> log
flock -u 9
sleep "$3"
flock 9
last=$(cat "fence.$1" 2>/dev/null || echo 0)
if [ "$JOBGUARD_FENCE" -le "$last" ]; then echo "reject $1 $JOBGUARD_FENCE $$ $(date +%s%N)" >> log; exit 3; fi
echo "$JOBGUARD_FENCE" > "fence.$1"
echo "effect $1 $JOBGUARD_FENCE $$ $(date +%s%N)" >> log
)SH";

// A TCP relay in front of Redis. switch_to() points it at another server and
// drops every relayed connection, as a virtual IP moving to a new primary does.
class Relay {
 public:
  explicit Relay(std::uint16_t target) : target_(target) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 64) != 0)
      throw std::runtime_error("relay: cannot listen");
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~Relay() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    acceptor_.join();
    ::close(fd_);
    for (auto& t : pumps_) t.join();
  }
  std::uint16_t port() const { return port_; }
  void switch_to(std::uint16_t target) {
    target_ = target;
    ++generation_;
  }
  // Stops forwarding (bytes wait in the kernel and in the sender), as a
  // congested or partitioned link does.
  void freeze() { frozen_ = true; }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      const int u = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(target_.load());
      if (::connect(u, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(c);
        ::close(u);
        continue;
      }
      std::lock_guard<std::mutex> g(mu_);
      pumps_.emplace_back([this, c, u, gen = generation_.load()] { pump(c, u, gen); });
    }
  }
  void pump(int c, int u, std::uint64_t gen) {
    char buf[16384];
    while (!stop_ && generation_ == gen) {
      if (frozen_) {
        std::this_thread::sleep_for(10ms);
        continue;
      }
      pollfd p[2] = {{c, POLLIN, 0}, {u, POLLIN, 0}};
      if (::poll(p, 2, 20) <= 0) continue;
      bool closed = false;
      for (int i = 0; i < 2 && !closed; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::read(p[i].fd, buf, sizeof buf);
        if (n <= 0 || ::send(p[1 - i].fd, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL) != n) closed = true;
      }
      if (closed) break;
    }
    ::close(c);
    ::close(u);
  }

  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<std::uint16_t> target_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> stop_{false}, frozen_{false};
  std::mutex mu_;
  std::vector<std::thread> pumps_;
  std::thread acceptor_;
};

struct LogLine {
  std::string kind;
  int job = 0;
  std::int64_t fence = 0;
  std::int64_t at_ns = 0;  // wall clock: compared with fault times taken from the same clock
};

std::int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Outcome {
  int jobs_taken = 0, jobs_done = 0, done_twice = 0, stale_accepted = 0, rejected = 0, lost = 0;
  int exit69 = 0, exit70 = 0, exit75 = 0, other = 0;
  std::vector<double> refused_ms;  // per fault: from the fault to the next start of a job
  double seconds = 0;              // from the first start to the last effect
  std::string others;
};

// One run: kWorkers threads run `jobguard run` on the current job until it is
// done, then move to the next; `fault(n)` is called when the n-th job is
// mid-effect and returns whether it injected a fault. New jobs are taken for
// kRunFor, and on until `faults_wanted` faults are in (at most kMoreFor more).
class JobRun {
 public:
  JobRun(std::string url, std::string dir, std::string effect_seconds = kEffectSeconds, std::string ttl = kTtl,
         std::string max_ttl = kMaxTtl)
      : url_(std::move(url)),
        dir_(std::move(dir)),
        effect_seconds_(std::move(effect_seconds)),
        ttl_(std::move(ttl)),
        max_ttl_(std::move(max_ttl)) {
    std::filesystem::create_directories(dir_);
  }
  // The workers' stderr lines that name `what`.
  std::vector<std::string> stderr_lines(const std::string& what) const {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<std::string> out;
    std::istringstream in(stderr_);
    for (std::string line; std::getline(in, line);)
      if (line.find(what) != std::string::npos) out.push_back(line);
    return out;
  }

  std::vector<LogLine> log() const {
    std::vector<LogLine> out;
    std::istringstream in(read_file(dir_ + "/log"));
    LogLine l;
    long long pid = 0;
    while (in >> l.kind >> l.job >> l.fence >> pid >> l.at_ns) out.push_back(l);
    return out;
  }
  bool done(int job) const {
    for (const auto& l : log())
      if (l.kind == "effect" && l.job == job) return true;
    return false;
  }
  bool mid_effect(int job) const {
    bool started = false;
    for (const auto& l : log()) {
      if (l.job != job) continue;
      if (l.kind == "start") started = true;
      if (l.kind == "effect" || l.kind == "reject") started = false;
    }
    return started;
  }

  Outcome run(const std::function<bool(int job)>& fault, int faults_wanted) {
    const auto t0 = Clock::now();
    faults_wanted_ = faults_wanted;
    std::vector<std::thread> threads;
    for (int w = 0; w < kWorkers; ++w) threads.emplace_back([&, w] { worker(w, t0); });
    // Faults: watch the current job; when it is mid-effect, offer a fault.
    std::vector<std::int64_t> fault_at;
    while (!finished_) {
      const int j = current_.load();
      if (mid_effect(j)) {
        std::this_thread::sleep_for(kFaultAfter);
        if (fault(j)) {
          fault_at.push_back(wall_ns());
          ++faults_;
        }
        while (current_.load() == j && !finished_) std::this_thread::sleep_for(5ms);
      }
      std::this_thread::sleep_for(5ms);
    }
    for (auto& t : threads) t.join();

    Outcome o;
    const auto lines = log();
    std::map<int, int> effects;
    std::map<int, std::int64_t> max_start;
    for (const auto& l : lines) {
      if (l.kind == "start") max_start[l.job] = std::max(max_start[l.job], l.fence);
      if (l.kind == "reject") ++o.rejected;
      if (l.kind == "effect") {
        ++effects[l.job];
        // Accepted from a holder that had been replaced: a later grant on the
        // same job had already started.
        if (max_start[l.job] > l.fence) ++o.stale_accepted;
      }
    }
    std::lock_guard<std::mutex> g(mu_);
    o.jobs_taken = static_cast<int>(attempted_.size());
    for (int j : attempted_) {
      const int n = effects[j];
      if (n >= 1) ++o.jobs_done;
      if (n > 1) o.done_twice += n - 1;
      if (n == 0) ++o.lost;
    }
    o.exit69 = exit69_;
    o.exit70 = exit70_;
    o.exit75 = exit75_;
    o.other = other_;
    o.others = others_;
    // The cost of each fault: until a job starts again after it.
    for (const auto at : fault_at) {
      for (const auto& l : lines)
        if (l.kind == "start" && l.at_ns > at) {
          o.refused_ms.push_back(static_cast<double>(l.at_ns - at) / 1e6);
          break;
        }
    }
    std::int64_t first = 0, last = 0;
    for (const auto& l : lines) {
      if (l.kind == "start" && first == 0) first = l.at_ns;
      if (l.kind == "effect") last = l.at_ns;
    }
    o.seconds = static_cast<double>(last - first) / 1e9;
    return o;
  }

 private:
  void worker(int w, Clock::time_point t0) {
    while (true) {
      const int j = current_.load();
      if (done(j)) {
        // Move on, unless the time for new jobs is over.
        const auto ran = Clock::now() - t0;
        if (ran >= kRunFor + kMoreFor || (ran >= kRunFor && faults_.load() >= faults_wanted_)) {
          finished_ = true;
          return;
        }
        int expected = j;
        current_.compare_exchange_strong(expected, j + 1);
        continue;
      }
      if (finished_ || Clock::now() - t0 >= kRunFor + kMoreFor + kDrainFor) {
        finished_ = true;
        return;
      }
      {
        std::lock_guard<std::mutex> g(mu_);
        attempted_.insert(j);
      }
      const char* join = url_.find('?') == std::string::npos ? "?" : "&";
      auto r = run_jobguard({"--redis", url_ + join + "max_ttl=" + max_ttl_ + "&timeout=500ms&connect_timeout=500ms", "run",
                             "--key", fmt::format("job:{}", j), "--ttl", ttl_, "--grace", "1s", "--fence", "--", "sh",
                             "-c", kJobScript, "job", std::to_string(j), dir_, effect_seconds_},
                            30s);
      {
        std::lock_guard<std::mutex> g(mu_);
        stderr_ += r.err;
        switch (r.status) {
          case 0: break;
          case 69: ++exit69_; break;
          case 70: ++exit70_; break;
          case 75: ++exit75_; break;
          default:
            ++other_;
            if (others_.size() < 2000) others_ += fmt::format("[w{} job {} exit {}] {}\n", w, j, r.status, r.err);
        }
      }
      if (r.status == 69) std::this_thread::sleep_for(150ms);
      else if (r.status == 75) std::this_thread::sleep_for(40ms);
    }
  }

  std::string url_, dir_, effect_seconds_, ttl_, max_ttl_;
  std::atomic<int> current_{0};
  std::atomic<bool> finished_{false};
  mutable std::mutex mu_;
  std::string stderr_;
  std::atomic<int> faults_{0};
  int faults_wanted_ = 0;
  std::set<int> attempted_;  // every job a worker ran jobguard for: each must end done once
  int exit69_ = 0, exit70_ = 0, exit75_ = 0, other_ = 0;
  std::string others_;
};

class QuarantineFault : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/jobguard-quarantine-fault.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void check(const char* name, const Outcome& o, int faults, const Outcome* baseline) {
    std::string refused;
    for (double ms : o.refused_ms) refused += fmt::format(" {:.0f}", ms);
    std::cout << fmt::format(
        "[fault] {}: {} faults; jobs done {} of {} taken in {:.1f} s = {:.2f}/s{}; done twice {}, stale writes "
        "accepted {}, lost {}, rejected writes {}; exits 69:{} 70:{} 75:{}; grants refused after each fault (ms):{}\n",
        name, faults, o.jobs_done, o.jobs_taken, o.seconds, o.jobs_done / std::max(o.seconds, 0.001),
        baseline ? fmt::format(" (without faults: {} in {:.1f} s = {:.2f}/s)", baseline->jobs_done, baseline->seconds,
                               baseline->jobs_done / std::max(baseline->seconds, 0.001))
                 : std::string(),
        o.done_twice,
        o.stale_accepted, o.lost, o.rejected, o.exit69, o.exit70, o.exit75, refused);
    EXPECT_EQ(o.done_twice, 0) << name;
    EXPECT_EQ(o.stale_accepted, 0) << name;
    EXPECT_EQ(o.lost, 0) << name;
    EXPECT_EQ(o.other, 0) << name << ": unexpected exit statuses\n" << o.others;
    EXPECT_GT(o.jobs_done, 0) << name;
  }

  std::string dir_;
};

TEST_F(QuarantineFault, NoJobIsDoneTwiceWhenRedisLosesLockState) {
  // --- the same run without faults --------------------------------------------
  Outcome base;
  {
    EmbeddedRedis r;
    r.start();
    JobRun run(r.url(), dir_ + "/baseline");
    base = run.run([](int) { return false; }, 0);
    check("baseline", base, 0, nullptr);
  }

  // --- restarts without persistence, each while a holder is mid-effect ----------
  {
    EmbeddedRedis r;
    r.start();
    JobRun run(r.url(), dir_ + "/restart");
    int restarts = 0, last_job = -1;
    const auto o = run.run([&](int job) {
      if (restarts >= 3 || job == last_job) return false;
      r.restart();
      last_job = job;
      ++restarts;
      return true;
    }, 3);
    // Three are asked for; a slow host may fit only two in the run's time.
    EXPECT_GE(restarts, 2);
    check("restart without persistence", o, restarts, &base);
  }

  // --- failover to a replica stopped during the grant ---------------------------
  {
    EmbeddedRedis primary, replica;
    primary.start();
    replica.start();
    // Replication runs through a relay of its own, frozen with the replica,
    // so the grants made meanwhile cannot reach it from socket buffers when
    // it resumes: it has missed them for certain.
    Relay repl_link(primary.port());
    ASSERT_EQ(redis_command_at("127.0.0.1", replica.port(), fmt::format("REPLICAOF 127.0.0.1 {}", repl_link.port())),
              "OK");
    ASSERT_TRUE(eventually([&] {
      return redis_command_at("127.0.0.1", replica.port(), "INFO replication").find("master_link_status:up") !=
             std::string::npos;
    }, 10s));
    Relay relay(primary.port());
    JobRun run(fmt::format("redis://127.0.0.1:{}/0", relay.port()), dir_ + "/failover");
    bool failed_over = false, paused = false, missed = false;
    const auto o = run.run([&](int job) {
      if (failed_over || job < 2) return false;
      if (!paused) {
        // Stopped now; the next job's grant happens on the primary only.
        replica.pause();
        repl_link.freeze();
        paused = true;
        return false;
      }
      primary.kill();
      replica.resume();
      missed = redis_command_at("127.0.0.1", replica.port(), fmt::format("EXISTS jobguard:lock:{{job:{}}}", job)) == "0";
      EXPECT_EQ(redis_command_at("127.0.0.1", replica.port(), "REPLICAOF NO ONE"), "OK");
      relay.switch_to(replica.port());
      failed_over = true;
      return true;
    }, 1);
    EXPECT_TRUE(failed_over);
    EXPECT_TRUE(missed) << "the promoted replica had the holder's grant: the scenario did not happen";
    check("failover to a stopped replica", o, failed_over ? 1 : 0, &base);
  }

  // --- a server that evicts keys -------------------------------------------------
  {
    // volatile-lru, a lock Redis shared with a cache: only keys with a TTL
    // are evicted, least recently used first; the holder's lock key, renewed
    // before the filler arrives, is older than all of it.
    EmbeddedRedis r(EmbeddedRedisOptions{.extra_args = {"--maxmemory", "8mb", "--maxmemory-policy", "volatile-lru"}});
    r.start();
    JobRun run(r.url(), dir_ + "/evict");
    int floods = 0, last_job = -1, evicted_holders = 0;
    const std::string blob(256 * 1024, 'f');
    const auto o = run.run([&](int job) {
      if (floods >= 2 || job == last_job) return false;
      // Filler traffic well past maxmemory: most keys with a TTL are
      // evicted, the holder's lock key among them. A burst:
      // the filler expires soon after, as a cache's short-lived keys do
      // (with memory kept full, every write would evict, and the server
      // would stay in quarantine, as docs/lock-safety.md says).
      redis::ConnectionOptions co;
      co.host = r.host();
      co.port = r.port();
      redis::Client c(co);
      std::vector<std::future<redis::Reply>> fs;
      for (int i = 0; i < 40; ++i)
        fs.push_back(c.exec_future(redis::Command{"SET", fmt::format("cache:{}:{}", floods, i), blob, "PX", "300"}));
      for (auto& f : fs) {
        try {
          f.get();
        } catch (const std::exception&) {
        }
      }
      if (redis_command_at(r.host(), r.port(), fmt::format("EXISTS jobguard:lock:{{job:{}}}", job)) == "0") ++evicted_holders;
      last_job = job;
      ++floods;
      return true;
    }, 2);
    const std::string stats = redis_command_at(r.host(), r.port(), "INFO stats");
    EXPECT_EQ(stats.find("evicted_keys:0\r"), std::string::npos) << "the filler evicted nothing";
    EXPECT_GE(floods, 1);
    std::cout << fmt::format("[fault] floods that evicted the holder's lock key: {} of {}\n", evicted_holders, floods);
    check("evicting server (volatile-lru)", o, floods, &base);
  }
}

// The server's wall clock stepped forward by more than the TTL while a holder
// works and contenders ask every ~40 ms: redis-server runs under an
// LD_PRELOAD shim (clock_shim.cpp) whose offset the test moves. Redis then
// expires the holder's key at once and a contender is granted; the holder's
// clock probe must find the step, write the quarantine to the lock-state
// record and stop its CMD before the CMD writes. The step lands 0.4 s into a
// 0.9 s job whose lease (3 s TTL) renews every second: the renewal that
// would find the key gone comes after the write.
void write_offset(const std::string& path, std::int64_t us) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, &us, sizeof us, 0), static_cast<ssize_t>(sizeof us));
  ::close(fd);
}

std::int64_t server_time_us(const EmbeddedRedis& r) {
  redis::ConnectionOptions co;
  co.host = r.host();
  co.port = r.port();
  redis::Client c(co);
  const auto t = c.exec(redis::Command{"TIME"});
  return std::stoll(t.elements.at(0).str) * 1000000 + std::stoll(t.elements.at(1).str);
}

// Milliseconds from `at` until `counted()` exceeds `before` (a record counts a
// step), or -1 when it does not within 5 s.
double ms_until_counted(Clock::time_point at, const std::function<int()>& counted, int before) {
  while (Clock::now() - at < 5s) {
    if (counted() > before) return std::chrono::duration<double, std::milli>(Clock::now() - at).count();
    std::this_thread::sleep_for(1ms);
  }
  return -1;
}

TEST_F(QuarantineFault, ServerClockStepsForwardAreFoundAndNoJobIsDoneTwice) {
  const std::string offset_file = dir_ + "/clock.offset";
  write_offset(offset_file, 0);
  EmbeddedRedis r(EmbeddedRedisOptions{
      .env = {std::string("LD_PRELOAD=") + JOBGUARD_CLOCK_SHIM, "JOBGUARD_CLOCK_OFFSET_FILE=" + offset_file}});
  r.start();
  // The shim is in: the server's clock follows the file.
  const auto before = server_time_us(r);
  write_offset(offset_file, 3600LL * 1000000);
  const auto after = server_time_us(r);
  ASSERT_GT(after - before, 3599LL * 1000000) << "the clock shim did not move the server's clock";
  std::int64_t offset = 3600LL * 1000000;

  // Larger than the TTL (3 s) and the quarantine (4 s): every key is gone.
  constexpr std::int64_t kStep = 5000000;
  constexpr int kSteps = 3;
  struct Found {
    double latency_ms = -1;         // from the step to the record counting it
    std::int64_t at_ms = 0, until_ms = 0;  // the quarantine written, server clock
  };
  std::vector<Found> found;
  const auto steps_counted = [&] {
    const auto v = redis_command_at(r.host(), r.port(), "HGET jobguard:epoch clock_steps");
    return v == "(nil)" ? 0 : std::stoi(v);
  };
  JobRun run(r.url(), dir_ + "/clock", "0.9", "3s", "4s");
  int steps = 0, last_job = -1;
  const auto o = run.run([&](int job) {
    if (steps >= kSteps || job == last_job) return false;
    const int counted = steps_counted();
    offset += kStep;
    write_offset(offset_file, offset);
    const auto at = Clock::now();
    Found f;
    f.latency_ms = ms_until_counted(at, steps_counted, counted);
    if (f.latency_ms >= 0) {
      const auto last = redis_command_at(r.host(), r.port(), "HGET jobguard:epoch clock_step_last");
      f.at_ms = std::stoll(last.substr(last.find(' ') + 1));
      f.until_ms = std::stoll(redis_command_at(r.host(), r.port(), "HGET jobguard:epoch until"));
    }
    found.push_back(f);
    last_job = job;
    ++steps;
    return true;
  }, kSteps);
  ASSERT_GE(steps, 2);

  std::string latencies;
  int detected = 0;
  for (const auto& f : found) {
    latencies += f.latency_ms < 0 ? " missed" : fmt::format(" {:.0f}", f.latency_ms);
    if (f.latency_ms >= 0) ++detected;
  }
  const auto logged = run.stderr_lines("stepped forward by at least");
  std::cout << fmt::format("[fault] clock steps of +{} s: {}; found {} of {}, ms from the step to the record:{}; "
                           "warning lines {}\n",
                           kStep / 1000000, steps, detected, steps, latencies, logged.size());
  EXPECT_EQ(detected, steps) << "a step was not found";
  EXPECT_GE(static_cast<int>(logged.size()), detected) << "a found step was not logged";
  // No grant once a step's quarantine is written, until it ends: a grant's
  // fence is at least the server's clock in µs, and a fence issued in
  // between would land inside it. The record's time is in ms, so a grant in
  // that same ms may have come before it (a worker started after the step,
  // with no sample of its own: the window docs/lock-safety.md names), and
  // only a later one is in. A worker that checked before the record was
  // written and asks after is refused by acquire.lua's epoch comparison.
  for (const auto& l : run.log()) {
    if (l.kind != "start") continue;
    for (const auto& f : found)
      EXPECT_FALSE(f.latency_ms >= 0 && l.fence / 1000 > f.at_ms && l.fence / 1000 < f.until_ms)
          << "job " << l.job << " granted (fence " << l.fence << ") inside the quarantine " << f.at_ms << ".."
          << f.until_ms;
  }
  check("server clock stepped forward", o, steps, nullptr);
}

// The same on a Redis Cluster of three primaries whose clocks step together
// (the nodes of one host under one shim): each client watches every
// primary's clock on its own (a node's clock is not its neighbour's), from
// the lock-state checks and a probe of every primary while leases are held.
// A step found on one node is written to that node's own record, which
// quarantines the cluster for every client.
TEST_F(QuarantineFault, ServerClockStepsOnAClusterAreFoundAndNoJobIsDoneTwice) {
  const std::string offset_file = dir_ + "/cluster-clock.offset";
  write_offset(offset_file, 0);
  const std::vector<std::string> shim{std::string("LD_PRELOAD=") + JOBGUARD_CLOCK_SHIM,
                                      "JOBGUARD_CLOCK_OFFSET_FILE=" + offset_file};
  ClusterRedis cluster(3, 0, {shim, shim, shim});
  cluster.start();
  std::vector<std::uint16_t> primaries;
  for (std::size_t i = 0; i < cluster.size(); ++i) primaries.push_back(cluster.node(i).port());
  // Every primary's record counts the steps written to it.
  const auto steps_counted = [&] {
    int n = 0;
    for (const auto port : primaries) {
      redis::ConnectionOptions co;
      co.host = "127.0.0.1";
      co.port = port;
      redis::Client c(co);
      for (const auto& key : c.exec(redis::Command{"KEYS", "jobguard:epoch*"}).elements) {
        const auto v = c.exec(redis::Command{"HGET", key.str, "clock_steps"});
        if (v.is_string()) n += std::stoi(v.str);
      }
    }
    return n;
  };
  std::int64_t offset = 0;
  constexpr std::int64_t kStep = 5000000;  // past the TTL (3 s) and the quarantine (4 s)
  constexpr int kSteps = 2;
  std::vector<double> latencies_ms;
  JobRun run(cluster.url(), dir_ + "/cluster-clock", "0.9", "3s", "4s");
  int steps = 0, last_job = -1;
  const auto o = run.run([&](int job) {
    if (steps >= kSteps || job == last_job) return false;
    const int counted = steps_counted();
    offset += kStep;
    write_offset(offset_file, offset);
    latencies_ms.push_back(ms_until_counted(Clock::now(), steps_counted, counted));
    last_job = job;
    ++steps;
    return true;
  }, kSteps);
  ASSERT_GE(steps, 1);
  std::string latencies;
  int detected = 0;
  for (const auto l : latencies_ms) {
    latencies += l < 0 ? " missed" : fmt::format(" {:.0f}", l);
    if (l >= 0) ++detected;
  }
  const auto logged = run.stderr_lines("stepped forward by at least");
  std::cout << fmt::format("[fault] cluster clock steps of +{} s: {}; found {} of {}, ms from the step to a record:{}; "
                           "warning lines {}\n",
                           kStep / 1000000, steps, detected, steps, latencies, logged.size());
  EXPECT_EQ(detected, steps) << "a step was not found";
  EXPECT_GE(static_cast<int>(logged.size()), detected) << "a found step was not logged";
  check("cluster clock stepped forward", o, steps, nullptr);
}

// A server that starts evicting mid-run: it did not evict when the workers'
// services checked it; with a holder mid-effect, an operator sets an evicting
// policy and a maxmemory below what the server holds (memory pressure, in
// keys without a TTL), so every key with a TTL, the holder's lock among
// them, is evicted at once; the limit is lifted right after (writes would
// fail while it stays below what the server holds).
TEST_F(QuarantineFault, NoJobIsDoneTwiceWhenTheServerStartsEvictingMidRun) {
  EmbeddedRedis r;
  r.start();
  const std::string blob(64 * 1024, 'f');
  const auto fill = [&](int episode) {
    redis::ConnectionOptions co;
    co.host = r.host();
    co.port = r.port();
    redis::Client c(co);
    for (int i = 0; i < 100; ++i) c.exec(redis::Command{"SET", fmt::format("cache:{}:{}", episode, i), blob});
  };
  fill(0);
  JobRun run(r.url(), dir_ + "/evict-mid-run");
  int episodes = 0, last_job = -1, evicted_holders = 0;
  const auto o = run.run([&](int job) {
    if (episodes >= 3 || job == last_job) return false;
    redis_command_at(r.host(), r.port(), "CONFIG SET maxmemory-policy volatile-lru");
    redis_command_at(r.host(), r.port(), "CONFIG SET maxmemory 2mb");
    redis_command_at(r.host(), r.port(), "PING");
    redis_command_at(r.host(), r.port(), "CONFIG SET maxmemory 0");
    if (redis_command_at(r.host(), r.port(), fmt::format("EXISTS jobguard:lock:{{job:{}}}", job)) == "0") ++evicted_holders;
    last_job = job;
    ++episodes;
    return true;
  }, 3);
  EXPECT_GE(episodes, 1);
  std::cout << fmt::format("[fault] eviction episodes that evicted the holder's lock key: {} of {}\n", evicted_holders,
                           episodes);
  EXPECT_GE(evicted_holders, 1) << "no episode evicted a holder's key: the scenario did not happen";
  check("server starts evicting mid-run (volatile-lru)", o, episodes, nullptr);
}

// Where the user meets the quarantine: `jobguard run` on a server that cannot
// prove it kept its lock state (a new one, without the opt-out).
TEST(QuarantineCli, RunExits69NamingTheLossAndWaitsItOutWithinWait) {
  EmbeddedRedis r;
  r.start();
  const std::string url = r.url() + "?max_ttl=1500ms";
  auto refused = run_jobguard({"--redis", url, "run", "--key", "q:1", "--ttl", "1s", "--", "true"});
  EXPECT_EQ(refused.status, 69) << refused.err;
  EXPECT_NE(refused.err.find("server lost lock state (no lock-state record"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("grants refused for"), std::string::npos) << refused.err;
  // One line.
  EXPECT_EQ(std::count(refused.err.begin(), refused.err.end(), '\n'), 1) << refused.err;

  auto waited = run_jobguard({"--redis", url, "run", "--key", "q:1", "--ttl", "1s", "--wait", "10s", "--", "true"});
  EXPECT_EQ(waited.status, 0) << waited.err;

  auto too_long = run_jobguard({"--redis", url, "run", "--key", "q:1", "--ttl", "2s", "--", "true"});
  EXPECT_EQ(too_long.status, 64) << too_long.err;
  EXPECT_NE(too_long.err.find("max TTL"), std::string::npos) << too_long.err;
}

}  // namespace
}  // namespace jobguard::test
