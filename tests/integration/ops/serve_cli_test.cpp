// Runs the real `jobguard serve` binary, as an operator would.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "exposition_parser.hpp"
#include "http_client.hpp"
#include "jobguard/testing/embedded_redis.hpp"
#include "support/peers.hpp"

using jobguard::test::http_request;
using jobguard::test::parse_exposition;
using namespace std::chrono_literals;

namespace {

const std::string kBinary = JOBGUARD_BINARY_DIR "/apps/jobguard/jobguard";

std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("bind failed");
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A child process of the binary; stdout and stderr go to pipes. Killed
// (SIGKILL) and reaped on destruction if still running.
class Child {
 public:
  explicit Child(std::vector<std::string> args) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(kBinary.c_str()));
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(kBinary.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    out_ = out[0];
    err_ = err[0];
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
    ::close(out_);
    ::close(err_);
  }
  pid_t pid() const { return pid_; }

  // Waits up to `timeout` for the exit; returns the exit status, or -1 when
  // it did not exit in time, -2 when a signal killed it.
  int wait_exit(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      int st = 0;
      const pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -2;
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }
  // One line of stdout, waiting up to `timeout` for it (throws on timeout).
  std::string read_stdout_line(std::chrono::milliseconds timeout) {
    std::string s;
    const auto until = std::chrono::steady_clock::now() + timeout;
    char ch;
    while (std::chrono::steady_clock::now() < until) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      if (::read(out_, &ch, 1) != 1) break;
      if (ch == '\n') return s;
      s += ch;
    }
    throw std::runtime_error("no line on stdout in time; got: " + s);
  }
  // After exit: everything the child wrote (pipes are at EOF by then).
  std::string drain_stdout() { return drain(out_); }
  std::string drain_stderr() { return drain(err_); }

 private:
  static std::string drain(int fd) {
    std::string s;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) s.append(buf, static_cast<std::size_t>(n));
    return s;
  }
  pid_t pid_ = -1;
  int out_ = -1, err_ = -1;
  bool reaped_ = false;
};

// Polls /healthz until the server answers (it binds right after start-up);
// 200 or 503 (no Redis behind it) both mean it serves.
bool wait_until_serving(std::uint16_t port) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < until) {
    try {
      const int status = http_request(port, "GET", "/healthz", 5s).status;
      if (status == 200 || status == 503) return true;
    } catch (const std::runtime_error&) {
    }
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

}  // namespace

TEST(ServeCli, ServesMetricsAndExitsZeroOnSigterm) {
  const auto port = free_port();
  Child c({"serve", "--listen", "127.0.0.1:" + std::to_string(port)});
  ASSERT_TRUE(wait_until_serving(port)) << "jobguard serve never answered on port " << port;

  const auto res = http_request(port, "GET", "/metrics");
  ASSERT_EQ(res.status, 200);
  EXPECT_EQ(res.headers.at("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  const auto e = parse_exposition(res.body);
  EXPECT_TRUE(e.problems.empty()) << ::testing::PrintToString(e.problems);
  EXPECT_EQ(e.type.at("jobguard_lock_hold_seconds"), "histogram");
  EXPECT_EQ(e.type.at("jobguard_lock_acquisitions_total"), "counter");
  // A fresh process: of its own only build info (the jobguard_fleet_* and
  // jobguard_redis_* families that follow are read from Redis:
  // docs/observability.md, docs/alerts.md).
  std::size_t own = 0;
  for (const auto& [name, v] : e.samples)
    own += name.rfind("jobguard_fleet_", 0) != 0 && name.rfind("jobguard_redis_", 0) != 0;
  ASSERT_EQ(own, 1u);
  EXPECT_EQ(e.samples.begin()->first.rfind("jobguard_build_info{version=", 0), 0u);
  EXPECT_EQ(http_request(port, "GET", "/nope").status, 404);
  EXPECT_EQ(http_request(port, "PUT", "/metrics").status, 405);

  ASSERT_EQ(::kill(c.pid(), SIGTERM), 0);
  EXPECT_EQ(c.wait_exit(10s), 0);
  EXPECT_NE(c.drain_stdout().find("listening on http://127.0.0.1:" + std::to_string(port)), std::string::npos);
  EXPECT_EQ(c.drain_stderr(), "");
}

TEST(ServeCli, SigintAlsoStopsCleanly) {
  const auto port = free_port();
  Child c({"serve", "--listen", "127.0.0.1:" + std::to_string(port)});
  ASSERT_TRUE(wait_until_serving(port));
  // A client idling on a connection must not keep the process alive.
  jobguard::test::TcpConn idle(port, 5s);
  ASSERT_EQ(::kill(c.pid(), SIGINT), 0);
  EXPECT_EQ(c.wait_exit(10s), 0);
}

TEST(ServeCli, JsonOutputNamesTheBoundPortWhenAskedForPortZero) {
  // Port 1: no Redis there, so /healthz says so.
  Child c({"--json", "--redis", "redis://127.0.0.1:1/0", "serve", "--listen", "127.0.0.1:0"});
  const std::string line = c.read_stdout_line(10s);
  const auto j = nlohmann::json::parse(line);
  const auto port = j.at("port").get<std::uint16_t>();
  ASSERT_NE(port, 0);
  EXPECT_EQ(j.at("listening"), "http://127.0.0.1:" + std::to_string(port));
  const auto health = http_request(port, "GET", "/healthz", 10s);
  EXPECT_EQ(health.status, 503);
  EXPECT_NE(health.body.find("Redis at redis://127.0.0.1:1/0"), std::string::npos) << health.body;
  ASSERT_EQ(::kill(c.pid(), SIGTERM), 0);
  EXPECT_EQ(c.wait_exit(10s), 0);
}

TEST(ServeCli, MalformedListenIsAOneLineUsageError) {
  for (const std::string bad : {"nonsense", "127.0.0.1:70000", "[::1:9464", "::1:9464", "127.0.0.1:abc"}) {
    Child c({"serve", "--listen", bad});
    EXPECT_EQ(c.wait_exit(10s), 64) << bad;
    const std::string err = c.drain_stderr();
    EXPECT_NE(err.find(bad), std::string::npos) << err;
    ASSERT_FALSE(err.empty());
    EXPECT_EQ(err.find('\n'), err.size() - 1) << "more than one line: " << err;
  }
}

TEST(ServeCli, MalformedRedisCheckIntervalIsAOneLineUsageError) {
  for (const std::string bad : {"soon", "0s", "-1s"}) {
    Child c({"serve", "--listen", "127.0.0.1:0", "--redis-check-interval", bad});
    EXPECT_EQ(c.wait_exit(10s), 64) << bad;
    const std::string err = c.drain_stderr();
    EXPECT_NE(err.find("--redis-check-interval"), std::string::npos) << err;
    ASSERT_FALSE(err.empty());
    EXPECT_EQ(err.find('\n'), err.size() - 1) << "more than one line: " << err;
  }
}

TEST(ServeCli, PortAlreadyInUseFailsWithOneLine) {
  // Hold a listening socket on a port, then ask serve for the same one.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const auto port = std::to_string(ntohs(a.sin_port));
  Child c({"serve", "--listen", "127.0.0.1:" + port});
  const int status = c.wait_exit(10s);
  ::close(fd);
  EXPECT_NE(status, 0);
  EXPECT_NE(status, -1) << "serve kept running on a port it could not bind";
  const std::string err = c.drain_stderr();
  EXPECT_NE(err.find("127.0.0.1:" + port), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), err.size() - 1) << err;
}

TEST(ServeCli, HealthzIsOkWhileRedisAnswersAnd503WithTheReasonWhenItDoesNot) {
  jobguard::EmbeddedRedis redis;
  redis.start();
  const auto port = free_port();
  Child c({"--redis", redis.url(), "serve", "--listen", "127.0.0.1:" + std::to_string(port), "--health-timeout",
           "500ms"});
  ASSERT_TRUE(wait_until_serving(port));
  auto health = http_request(port, "GET", "/healthz", 10s);
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok\n");
  redis.pause();  // SIGSTOP: the PING meets its deadline
  health = http_request(port, "GET", "/healthz", 10s);
  EXPECT_EQ(health.status, 503);
  EXPECT_NE(health.body.find("unavailable: Redis at redis://"), std::string::npos) << health.body;
  EXPECT_EQ(health.body.find('\n'), health.body.size() - 1) << health.body;
  EXPECT_EQ(http_request(port, "GET", "/metrics", 10s).status, 200);  // metrics do not wait for Redis
  redis.resume();
  redis.kill();
  health = http_request(port, "GET", "/healthz", 10s);
  EXPECT_EQ(health.status, 503);
  ASSERT_EQ(::kill(c.pid(), SIGTERM), 0);
  EXPECT_EQ(c.wait_exit(10s), 0);
}

TEST(ServeCli, RedisPasswordIsNeverInTheHealthAnswer) {
  const auto port = free_port();
  Child c({"--redis", "redis://:se/cr?et@127.0.0.1:1/0", "serve", "--listen", "127.0.0.1:" + std::to_string(port)});
  ASSERT_TRUE(wait_until_serving(port));
  const auto health = http_request(port, "GET", "/healthz", 10s);
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(health.body.find("se/cr"), std::string::npos) << health.body;
  EXPECT_NE(health.body.find("***@127.0.0.1:1"), std::string::npos) << health.body;
  ASSERT_EQ(::kill(c.pid(), SIGTERM), 0);
  EXPECT_EQ(c.wait_exit(10s), 0);
}

TEST(ServeCli, WarnsOnANonLoopbackBind) {
  Child c({"--redis", "redis://127.0.0.1:1/0", "serve", "--listen", "0.0.0.0:0"});
  (void)c.read_stdout_line(10s);  // listening
  ASSERT_EQ(::kill(c.pid(), SIGTERM), 0);
  EXPECT_EQ(c.wait_exit(10s), 0);
  const std::string err = c.drain_stderr();
  EXPECT_NE(err.find("warning"), std::string::npos) << err;
  EXPECT_NE(err.find("reachable from other hosts"), std::string::npos) << err;
}

// A frozen link in a long-lived process: serve's connection to Redis dies
// silently (a frozen TCP relay: no reset, no FIN, like a dropped NAT entry).
// /healthz says so, and after the client's three timeouts in a row the
// connection is replaced: /healthz is 200 again without a restart.
TEST(ServeCli, HealthzRecoversWhenTheLinkToRedisFreezes) {
  jobguard::EmbeddedRedis redis;
  redis.start();
  jobguard::test::FrozenRelay relay(redis.port());
  const auto port = free_port();
  Child c({"--redis", "redis://127.0.0.1:" + std::to_string(relay.port()) + "/0", "serve", "--listen",
           "127.0.0.1:" + std::to_string(port), "--health-timeout", "300ms"});
  ASSERT_TRUE(wait_until_serving(port));
  // Polls /healthz (each answer waits at most the health timeout) until it
  // gives `status`, for up to a minute of a loaded host.
  auto health_becomes = [&](int status) {
    const auto until = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < until)
      if (http_request(port, "GET", "/healthz", 10s).status == status) return true;
    return false;
  };
  ASSERT_TRUE(health_becomes(200));
  const int before = relay.accepted();

  relay.freeze_existing();
  EXPECT_TRUE(health_becomes(503));
  EXPECT_TRUE(health_becomes(200)) << "the frozen connection was never replaced";
  EXPECT_GT(relay.accepted(), before);
  ASSERT_EQ(::kill(c.pid(), SIGTERM), 0);
  EXPECT_EQ(c.wait_exit(10s), 0);
  const std::string err = c.drain_stderr();
  EXPECT_NE(err.find("connection recycled"), std::string::npos) << err;
}

// The HTTP statuses an operator's probe or a stray client meets at the
// binary (every 4xx case: MetricsServer.MalformedAndOversizedRequestsGetTheirOwn4xx).
TEST(ServeCli, UnknownPathsMethodsAndMalformedRequestsGetTheir4xx) {
  const auto port = free_port();
  Child c({"--redis", "redis://127.0.0.1:1/0", "serve", "--listen", "127.0.0.1:" + std::to_string(port)});
  ASSERT_TRUE(wait_until_serving(port));
  EXPECT_EQ(http_request(port, "GET", "/nope", 10s).status, 404);
  EXPECT_EQ(http_request(port, "DELETE", "/metrics", 10s).status, 405);
  jobguard::test::TcpConn raw(port, 10s);
  raw.send_all("GARBAGE\r\n\r\n");
  EXPECT_EQ(jobguard::test::parse_http_response(raw.read_to_eof(10s)).status, 400);
  EXPECT_EQ(http_request(port, "GET", "/metrics", 10s).status, 200);
  ASSERT_EQ(::kill(c.pid(), SIGTERM), 0);
  EXPECT_EQ(c.wait_exit(10s), 0);
}

// Idle connections must not lock a scrape out: 1,000 idle connections are
// open and a scrape is still answered.
TEST(ServeCli, AThousandIdleConnectionsDoNotStarveAScrape) {
  // The test holds 1,000 sockets itself: raise its soft descriptor limit.
  rlimit lim{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &lim), 0);
  if (lim.rlim_cur < 1100) {
    ASSERT_GE(lim.rlim_max, 1100u) << "hard RLIMIT_NOFILE too low for this test";
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 4096);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lim), 0);
  }
  const auto port = free_port();
  Child c({"--redis", "redis://127.0.0.1:1/0", "serve", "--listen", "127.0.0.1:" + std::to_string(port)});
  ASSERT_TRUE(wait_until_serving(port));
  std::vector<std::unique_ptr<jobguard::test::TcpConn>> idle;
  idle.reserve(1000);
  for (int i = 0; i < 1000; ++i) idle.push_back(std::make_unique<jobguard::test::TcpConn>(port, 10s));
  // A generous deadline: this proves "answered", not "fast".
  for (int i = 0; i < 3; ++i) {
    const auto res = http_request(port, "GET", "/metrics", 30s);
    EXPECT_EQ(res.status, 200);
  }
  ASSERT_EQ(::kill(c.pid(), SIGTERM), 0);
  EXPECT_EQ(c.wait_exit(10s), 0);
}
