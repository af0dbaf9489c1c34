#include <gtest/gtest.h>

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "exposition_parser.hpp"
#include "http_client.hpp"
#include "jobguard/error.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/ops/metrics_server.hpp"

using namespace jobguard::observe;
using namespace jobguard::ops;
using jobguard::test::http_request;
using jobguard::test::parse_exposition;
using jobguard::test::TcpConn;
using namespace std::chrono_literals;

namespace {

MetricsServerOptions ephemeral() {
  MetricsServerOptions o;
  o.listen = {"127.0.0.1", 0};
  return o;
}

void fill(Registry& r) {
  auto& b = r.lock_class("billing");
  b.acquisitions_total.inc(5);
  b.busy_total.inc(2);
  b.hold_seconds.observe(3ms);
  b.hold_seconds.observe(40ms);
  b.hold_seconds.observe(8s);
  b.wait_seconds.observe(1ms);
  b.leases_lost_total.inc();
  auto& s = r.lock_class("tenant \"sync\"");
  s.fail_open_total.inc(7);
}

}  // namespace

TEST(MetricsServer, ScrapeIsWellFormedAndCarriesTheRegistryNumbers) {
  Registry r;
  fill(r);
  MetricsServer server(r, ephemeral());
  server.start();
  ASSERT_NE(server.port(), 0);

  const auto res = http_request(server.port(), "GET", "/metrics");
  ASSERT_EQ(res.status, 200);
  EXPECT_EQ(res.headers.at("content-type"), "text/plain; version=0.0.4; charset=utf-8");

  const auto e = parse_exposition(res.body);
  EXPECT_TRUE(e.problems.empty()) << ::testing::PrintToString(e.problems) << "\n" << res.body;
  EXPECT_EQ(e.type.at("jobguard_lock_acquisitions_total"), "counter");
  EXPECT_EQ(e.type.at("jobguard_lock_hold_seconds"), "histogram");
  EXPECT_EQ(e.samples.at("jobguard_lock_acquisitions_total{lock_class=\"billing\"}"), 5);
  EXPECT_EQ(e.samples.at("jobguard_lock_busy_total{lock_class=\"billing\"}"), 2);
  EXPECT_EQ(e.samples.at("jobguard_lock_leases_lost_total{lock_class=\"billing\"}"), 1);
  EXPECT_EQ(e.samples.at("jobguard_lock_fail_open_total{lock_class=\"tenant \\\"sync\\\"\"}"), 7);
  EXPECT_EQ(e.samples.at("jobguard_lock_hold_seconds_count{lock_class=\"billing\"}"), 3);
  EXPECT_EQ(e.samples.at("jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"0.005\"}"), 1);
  EXPECT_EQ(e.samples.at("jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"0.05\"}"), 2);
  EXPECT_EQ(e.samples.at("jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"10\"}"), 3);
  EXPECT_EQ(e.samples.at("jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"+Inf\"}"), 3);
  EXPECT_NEAR(e.samples.at("jobguard_lock_hold_seconds_sum{lock_class=\"billing\"}"), 8.043, 1e-9);

  // A later scrape sees later increments: the server renders live numbers.
  r.lock_class("billing").acquisitions_total.inc();
  const auto again = parse_exposition(http_request(server.port(), "GET", "/metrics").body);
  EXPECT_EQ(again.samples.at("jobguard_lock_acquisitions_total{lock_class=\"billing\"}"), 6);
}

TEST(MetricsServer, JsonAndHealthEndpoints) {
  Registry r;
  fill(r);
  MetricsServer server(r, ephemeral());
  server.start();

  const auto json = http_request(server.port(), "GET", "/metrics.json");
  ASSERT_EQ(json.status, 200);
  EXPECT_EQ(json.headers.at("content-type"), "application/json");
  const auto j = nlohmann::json::parse(json.body);
  EXPECT_EQ(j.at("lock_classes").at("billing").at("acquisitions_total"), 5);
  EXPECT_EQ(j.at("lock_classes").at("billing").at("hold_seconds").at("count"), 3);

  const auto health = http_request(server.port(), "GET", "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok\n");

  // Query strings are ignored (some scrapers add them).
  EXPECT_EQ(http_request(server.port(), "GET", "/metrics?format=text").status, 200);
}

TEST(MetricsServer, UnknownPathIs404AndOtherMethodsAre405) {
  Registry r;
  MetricsServer server(r, ephemeral());
  server.start();
  EXPECT_EQ(http_request(server.port(), "GET", "/").status, 404);
  EXPECT_EQ(http_request(server.port(), "GET", "/metricsx").status, 404);
  const auto post = http_request(server.port(), "POST", "/metrics");
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.headers.at("allow"), "GET, HEAD");
  EXPECT_EQ(http_request(server.port(), "DELETE", "/healthz").status, 405);
}

TEST(MetricsServer, KeepAliveServesSeveralRequestsOnOneConnection) {
  Registry r;
  MetricsServer server(r, ephemeral());
  server.start();
  TcpConn c(server.port(), 5s);
  c.send_all("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string raw = c.read_to_eof(5s);
  std::size_t count = 0;
  for (auto p = raw.find("HTTP/1.1 200"); p != std::string::npos; p = raw.find("HTTP/1.1 200", p + 1)) ++count;
  EXPECT_EQ(count, 2u) << raw;
}

TEST(MetricsServer, SilentClientDoesNotBlockOtherScrapesAndIsDroppedAtItsDeadline) {
  Registry r;
  r.lock_class("billing").acquisitions_total.inc();
  MetricsServerOptions o = ephemeral();
  o.read_timeout = 500ms;
  MetricsServer server(r, o);
  server.start();

  TcpConn silent(server.port(), 5s);  // connects, sends nothing
  TcpConn partial(server.port(), 5s);
  partial.send_all("GET /metr");  // half a request line, then nothing
  for (int i = 0; i < 3; ++i) EXPECT_EQ(http_request(server.port(), "GET", "/metrics", 3s).status, 200);

  // The server closes both when the read deadline passes (EOF, no response);
  // without a deadline read_to_eof would throw after 10 s.
  EXPECT_EQ(silent.read_to_eof(10s), "");
  EXPECT_EQ(partial.read_to_eof(10s), "");
}

TEST(MetricsServer, OversizedRequestIsRefusedNotBuffered) {
  Registry r;
  MetricsServer server(r, ephemeral());
  server.start();
  TcpConn c(server.port(), 5s);
  std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Junk: " + std::string(64 * 1024, 'a') + "\r\n\r\n";
  try {
    c.send_all(req);  // may fail half-way once the server has closed
  } catch (const std::runtime_error&) {
  }
  const std::string raw = c.read_to_eof(5s);
  EXPECT_EQ(raw.find("200 OK"), std::string::npos);
  EXPECT_EQ(http_request(server.port(), "GET", "/healthz").status, 200);
}

TEST(MetricsServer, StopClosesOpenConnectionsAndIsIdempotent) {
  Registry r;
  MetricsServerOptions o = ephemeral();
  o.read_timeout = 60s;  // so only stop() can end the idle connection
  MetricsServer server(r, o);
  server.start();
  const auto port = server.port();
  TcpConn idle(port, 5s);
  ASSERT_EQ(http_request(port, "GET", "/healthz").status, 200);  // the idle one was accepted first
  server.stop();
  EXPECT_EQ(idle.read_to_eof(5s), "");
  server.stop();
  EXPECT_THROW(http_request(port, "GET", "/healthz", 1s), std::runtime_error);
}

TEST(MetricsServer, PortInUseIsAOneLineError) {
  Registry r;
  MetricsServer first(r, ephemeral());
  first.start();
  MetricsServerOptions o;
  o.listen = {"127.0.0.1", first.port()};
  MetricsServer second(r, o);
  try {
    second.start();
    FAIL() << "second bind on the same port succeeded";
  } catch (const jobguard::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), jobguard::errc::invalid_argument);
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(first.port())), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos);
  }
}

TEST(MetricsServer, ConcurrentScrapesWhileWritersIncrement) {
  Registry r;
  MetricsServer server(r, ephemeral());
  server.start();
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    auto& m = r.lock_class("billing");
    while (!stop.load()) {
      m.acquisitions_total.inc();
      m.hold_seconds.observe(2ms);
    }
  });
  std::vector<std::thread> scrapers;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t)
    scrapers.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        const auto e = parse_exposition(http_request(server.port(), "GET", "/metrics").body);
        if (e.problems.empty()) ++ok;
      }
    });
  for (auto& s : scrapers) s.join();
  stop = true;
  writer.join();
  EXPECT_EQ(ok.load(), 40);
}

namespace {

// One raw request on a fresh connection; the whole answer, parsed.
jobguard::test::HttpResponse raw_request(std::uint16_t port, const std::string& bytes) {
  TcpConn c(port, 5s);
  try {
    c.send_all(bytes);  // may fail half-way once the server has answered and closed
  } catch (const std::runtime_error&) {
  }
  return jobguard::test::parse_http_response(c.read_to_eof(5s));
}

}  // namespace

TEST(MetricsServer, MalformedAndOversizedRequestsGetTheirOwn4xx) {
  Registry r;
  MetricsServer server(r, ephemeral());
  server.start();
  const auto port = server.port();
  EXPECT_EQ(raw_request(port, "GARBAGE\r\n\r\n").status, 400);
  EXPECT_EQ(raw_request(port, "GET metrics HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(raw_request(port, "GET /metrics HTTP/1.1\r\nBad Header\r\n\r\n").status, 400);
  EXPECT_EQ(raw_request(port, "GET /metrics HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx").status,
            400);
  EXPECT_EQ(raw_request(port, "GET /metrics HTTP/2.0\r\n\r\n").status, 505);
  const auto big_head = raw_request(port, "GET /metrics HTTP/1.1\r\nX-Junk: " + std::string(16 * 1024, 'a') + "\r\n\r\n");
  EXPECT_EQ(big_head.status, 431);
  EXPECT_EQ(big_head.headers.at("connection"), "close");
  EXPECT_EQ(raw_request(port, "POST /metrics HTTP/1.1\r\nContent-Length: 100000\r\n\r\n").status, 413);
  EXPECT_EQ(raw_request(port, "POST /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").status, 501);
  // A small body is read and ignored; the method decides.
  EXPECT_EQ(raw_request(port, "POST /metrics HTTP/1.1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello").status,
            405);
  // HEAD: the headers of a GET, no body.
  TcpConn c(port, 5s);
  c.send_all("HEAD /healthz HTTP/1.1\r\nConnection: close\r\n\r\n");
  const std::string head = c.read_to_eof(5s);
  EXPECT_EQ(head.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << head;
  EXPECT_NE(head.find("Content-Length: 3\r\n"), std::string::npos) << head;
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n") << head;
  // The server is still fine.
  EXPECT_EQ(http_request(port, "GET", "/metrics").status, 200);
}

// Without eviction 64 idle connections would lock out every scrape until
// their deadlines passed: the idle ones are evicted for newcomers.
TEST(MetricsServer, IdleConnectionsAtTheLimitAreEvictedForAScrape) {
  Registry r;
  MetricsServerOptions o = ephemeral();
  o.max_connections = 8;
  o.idle_timeout = 60s;  // only eviction can free their slots
  o.read_timeout = 60s;
  MetricsServer server(r, o);
  server.start();
  std::vector<std::unique_ptr<TcpConn>> idle;
  for (int i = 0; i < 40; ++i) idle.push_back(std::make_unique<TcpConn>(server.port(), 5s));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(http_request(server.port(), "GET", "/metrics", 10s).status, 200);
  // The oldest idle ones were closed by the server (EOF, no response).
  EXPECT_EQ(idle.front()->read_to_eof(10s), "");
}

TEST(MetricsServer, IdleConnectionIsClosedAfterIdleTimeout) {
  Registry r;
  MetricsServerOptions o = ephemeral();
  o.idle_timeout = 200ms;
  MetricsServer server(r, o);
  server.start();
  TcpConn c(server.port(), 5s);
  c.send_all("GET /healthz HTTP/1.1\r\n\r\n");  // keep-alive
  // Answered, then idle: closed after idle_timeout (read_to_eof throws after 10 s otherwise).
  const std::string raw = c.read_to_eof(10s);
  EXPECT_EQ(raw.rfind("HTTP/1.1 200 OK", 0), 0u) << raw;
  EXPECT_NE(raw.find("Connection: keep-alive"), std::string::npos) << raw;
}

TEST(MetricsServer, HealthCheckDecidesHealthz) {
  Registry r;
  MetricsServerOptions o = ephemeral();
  std::atomic<int> mode{0};  // 0 ok, 1 failing, 2 never answers, 3 answers from another thread
  std::mutex threads_mutex;
  std::vector<std::thread> threads;
  o.handler_timeout = 300ms;
  o.health_check = [&](std::function<void(bool, std::string)> done) {
    switch (mode.load()) {
      case 0: return done(true, {});
      case 1: return done(false, "redis: connection refused\x1b[2J");
      case 2: return;  // dropped: the server must still answer
      default: {
        std::lock_guard lock(threads_mutex);
        threads.emplace_back([done = std::move(done)] { done(false, "from another thread"); });
      }
    }
  };
  {
    MetricsServer server(r, o);
    server.start();
    EXPECT_EQ(http_request(server.port(), "GET", "/healthz").body, "ok\n");
    mode = 1;
    auto res = http_request(server.port(), "GET", "/healthz");
    EXPECT_EQ(res.status, 503);
    EXPECT_EQ(res.body, "unavailable: redis: connection refused\\x1b[2J\n");
    mode = 2;
    res = http_request(server.port(), "GET", "/healthz", 10s);
    EXPECT_EQ(res.status, 503);
    EXPECT_NE(res.body.find("timed out"), std::string::npos) << res.body;
    mode = 3;
    res = http_request(server.port(), "GET", "/healthz", 10s);
    EXPECT_EQ(res.status, 503);
    EXPECT_EQ(res.body, "unavailable: from another thread\n");
    // /metrics does not depend on the health check.
    EXPECT_EQ(http_request(server.port(), "GET", "/metrics").status, 200);
  }
  for (auto& t : threads) t.join();
}

TEST(MetricsServer, LoopbackOnlyIsFalseForTheWildcardAddress) {
  Registry r;
  MetricsServer local(r, ephemeral());
  local.start();
  EXPECT_TRUE(local.loopback_only());
  MetricsServerOptions o;
  o.listen = {"0.0.0.0", 0};
  MetricsServer wide(r, o);
  wide.start();
  EXPECT_FALSE(wide.loopback_only());
}
