// The dashboard's JSON API as scripts call it: the real `jobguard serve`
// against this test's redis-server, plain HTTP from a socket client. The
// browser drives the same endpoints in tests/browser/dashboard.test.js.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "integration/ops/http_client.hpp"
#include "jobguard/admin.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/command.hpp"
#include "support/cli_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

const std::string kToken = "dashboard-test-token-0123456789";

HttpResponse request(std::uint16_t port, const std::string& method, const std::string& target,
                     const std::string& body = {}, const std::string& token = {}) {
  TcpConn c(port, 5s);
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!token.empty()) req += "Authorization: Bearer " + token + "\r\n";
  if (!body.empty() || method == "POST")
    req += "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  c.send_all(req + "\r\n" + body);
  return parse_http_response(c.read_to_eof(10s));
}

// One-line JSON {"error": ...}: what a script can show as is.
std::string error_of(const HttpResponse& r) {
  EXPECT_EQ(r.headers.at("content-type"), "application/json");
  EXPECT_EQ(r.body.find('\n'), r.body.size() - 1) << r.body;
  return json::parse(r.body).at("error").get<std::string>();
}

class DashboardCli : public CliTest {
 protected:
  // `jobguard serve` on a free port; with the admin token when `admin`.
  std::uint16_t serve(bool admin, std::vector<std::string> extra = {}) {
    std::vector<std::string> a{jobguard_binary(), "--json", "--redis", url(), "serve", "--listen", "127.0.0.1:0",
                               "--stream", "jobs"};
    if (admin) {
      std::ofstream(file("token")) << kToken << "\n";
      a.insert(a.end(), {"--admin-token-file", file("token")});
    }
    a.insert(a.end(), extra.begin(), extra.end());
    proc_ = std::make_unique<Subprocess>(a);
    EXPECT_TRUE(eventually([&] { return proc_->out().find('\n') != std::string::npos; }, 10s)) << proc_->err();
    const auto ready = json::parse(proc_->out().substr(0, proc_->out().find('\n')));
    EXPECT_EQ(ready.at("actions").get<bool>(), admin);
    return ready.at("port").get<std::uint16_t>();
  }

  void TearDown() override {
    if (proc_) {
      proc_->signal(SIGTERM);
      const auto r = proc_->wait_or_kill(10s);
      EXPECT_EQ(r.status, 0) << r.err;
      // The token is a secret: never printed, whatever happened.
      EXPECT_EQ(r.out.find(kToken), std::string::npos);
      EXPECT_EQ(r.err.find(kToken), std::string::npos);
    }
    CliTest::TearDown();
  }

  std::unique_ptr<Subprocess> proc_;
};

TEST_F(DashboardCli, ServesThePageWithoutAnythingFromElsewhere) {
  const auto port = serve(false);
  const auto page = request(port, "GET", "/");
  ASSERT_EQ(page.status, 200);
  EXPECT_EQ(page.headers.at("content-type"), "text/html; charset=utf-8");
  EXPECT_NE(page.headers.at("content-security-policy").find("default-src 'self'"), std::string::npos);
  EXPECT_NE(page.body.find("<script src=\"/app.js\""), std::string::npos);
  EXPECT_EQ(page.body.find("http"), std::string::npos) << "the page loads nothing from another origin";
  const auto js = request(port, "GET", "/app.js");
  ASSERT_EQ(js.status, 200);
  EXPECT_EQ(js.headers.at("content-type"), "text/javascript; charset=utf-8");
  EXPECT_NE(js.body.find("/api/locks"), std::string::npos);
  EXPECT_EQ(request(port, "GET", "/style.css").status, 200);
  EXPECT_EQ(request(port, "GET", "/metrics").status, 200);  // still there
}

TEST_F(DashboardCli, ListsHeldLocksWithHolderTtlAndFence) {
  auto client = make_client();
  auto locks = LockService::create(*client);
  auto held = locks->acquire("invoice:7", {.ttl = 30s, .fence = true});
  ASSERT_TRUE(held);
  const auto port = serve(false);
  const auto r = request(port, "GET", "/api/locks");
  ASSERT_EQ(r.status, 200) << r.body;
  const auto j = json::parse(r.body);
  ASSERT_EQ(j.at("count"), 1);
  EXPECT_EQ(j.at("truncated"), false);
  const auto& l = j.at("locks").at(0);
  EXPECT_EQ(l.at("resource"), "invoice:7");
  EXPECT_EQ(l.at("holder"), token_owner(held->token()));
  EXPECT_GT(l.at("ttl_left_ms").get<std::int64_t>(), 25000);
  EXPECT_EQ(l.at("fence").get<std::int64_t>(), *held->fence());
  EXPECT_GE(j.at("scan_calls").get<int>(), 1);

  EXPECT_EQ(json::parse(request(port, "GET", "/api/locks?prefix=other:").body).at("count"), 0);
  const auto one = json::parse(request(port, "GET", "/api/lock?resource=invoice%3A7").body);
  EXPECT_EQ(one.at("held"), true);
  EXPECT_EQ(one.at("queue"), json::array());
}

TEST_F(DashboardCli, ALocksDetailShowsItsFairQueueInOrder) {
  auto client = make_client();
  auto locks = LockService::create(*client);
  auto held = locks->acquire("invoice:11", {.ttl = 30s, .fair = true});
  ASSERT_TRUE(held);
  auto waiter_client = make_client();
  auto waiter_locks = LockService::create(*waiter_client);
  std::optional<Lock> got;
  std::thread waiter([&] { got = waiter_locks->acquire("invoice:11", {.ttl = 30s, .wait = 10s, .fair = true}); });
  const auto port = serve(false);
  json detail;
  EXPECT_TRUE(eventually([&] {
    detail = json::parse(request(port, "GET", "/api/lock?resource=invoice:11").body);
    return detail.at("queue").size() == 1;
  }, 5s)) << detail.dump();
  EXPECT_EQ(detail.at("waiters"), 1);
  const std::string owner = detail.at("queue").at(0);
  EXPECT_EQ(owner.rfind(token_owner(held->token()).substr(0, token_owner(held->token()).find('/')), 0), 0u) << owner;
  EXPECT_EQ(owner.find(' '), std::string::npos) << "the queue entry's ttl/fence/channel are not the owner: " << owner;
  held->release();
  waiter.join();
  ASSERT_TRUE(got);
  EXPECT_EQ(owner, token_owner(got->token()));
}

TEST_F(DashboardCli, BadQueryParametersAreAOneLine400) {
  const auto port = serve(false);
  for (const std::string target : {"/api/locks?limit=abc", "/api/locks?limit=0", "/api/locks?limt=5",
                                   "/api/locks?prefix=a&prefix=b", "/api/locks?prefix=%zz", "/api/classes?window=7m",
                                   "/api/incidents?limit=-1", "/api/lock", "/api/lock?resource=a%7Bb",
                                   "/api/locks?class=x"}) {
    const auto r = request(port, "GET", target);
    EXPECT_EQ(r.status, 400) << target << ": " << r.body;
    EXPECT_FALSE(error_of(r).empty()) << target;
  }
  EXPECT_NE(error_of(request(port, "GET", "/api/locks?limt=5")).find("unknown parameter \"limt\""), std::string::npos);
  EXPECT_EQ(request(port, "GET", "/api/dead?stream=nope&id=1-1").status, 404);
  EXPECT_EQ(request(port, "DELETE", "/api/locks").status, 405);
  EXPECT_EQ(request(port, "GET", "/api/locks/release").status, 405);  // actions are POSTs only
}

TEST_F(DashboardCli, ReadOnlyServerRefusesActionsEvenWithAToken) {
  auto client = make_client();
  auto locks = LockService::create(*client);
  auto held = locks->acquire("invoice:8", {.ttl = 30s});
  ASSERT_TRUE(held);
  const auto port = serve(false);
  const auto r = request(port, "POST", "/api/locks/release", "resource=invoice:8&reason=test", kToken);
  EXPECT_EQ(r.status, 403);
  EXPECT_NE(error_of(r).find("read-only"), std::string::npos);
  EXPECT_EQ(request(port, "POST", "/api/jobs/retry", "stream=jobs&id=1-1&reason=x", kToken).status, 403);
  EXPECT_TRUE(locks->inspect("invoice:8").held);
  EXPECT_EQ(json::parse(request(port, "GET", "/api/config").body).at("actions"), false);
}

TEST_F(DashboardCli, ForceReleaseNeedsTheTokenAndAReasonAndIsAudited) {
  auto client = make_client();
  auto locks = LockService::create(*client);
  auto held = locks->acquire("invoice:9", {.ttl = 30s, .fence = true});
  ASSERT_TRUE(held);
  const auto port = serve(true);
  const std::string body = "resource=invoice%3A9&reason=host+web-3+is+gone";
  auto r = request(port, "POST", "/api/locks/release", body);
  EXPECT_EQ(r.status, 401);
  EXPECT_NE(error_of(r).find("Authorization: Bearer"), std::string::npos);
  r = request(port, "POST", "/api/locks/release", body, kToken + "x");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(error_of(r), "wrong admin token");
  r = request(port, "POST", "/api/locks/release", body, kToken.substr(0, kToken.size() - 1));
  EXPECT_EQ(r.status, 401);
  r = request(port, "POST", "/api/locks/release", "resource=invoice%3A9", kToken);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(error_of(r), "parameter \"reason\" is required");
  r = request(port, "POST", "/api/locks/release", "resource=invoice%3A9&reason=x&force=1", kToken);
  EXPECT_EQ(r.status, 400);
  r = request(port, "POST", "/api/locks/release", "resource=invoice%3A9&reason=x&holder=someone/1/else", kToken);
  EXPECT_EQ(r.status, 409);  // the holder changed since the page showed it: nothing released
  ASSERT_TRUE(locks->inspect("invoice:9").held) << "a refused action released the lock";

  r = request(port, "POST", "/api/locks/release", body, kToken);
  ASSERT_EQ(r.status, 200) << r.body;
  const auto j = json::parse(r.body);
  EXPECT_EQ(j.at("outcome"), "released");
  EXPECT_GT(j.at("fence").get<std::int64_t>(), *held->fence());
  EXPECT_FALSE(locks->inspect("invoice:9").held);

  const auto audit = admin::read_audit(*locks, 10);
  ASSERT_EQ(audit.size(), 1u);
  EXPECT_EQ(audit[0].resource, "invoice:9");
  EXPECT_EQ(audit[0].reason, "host web-3 is gone");
  EXPECT_NE(audit[0].who.find("via dashboard"), std::string::npos);
  const auto inc = json::parse(request(port, "GET", "/api/incidents").body).at("incidents");
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_EQ(inc[0].at("kind"), "force_release");
  EXPECT_EQ(inc[0].at("key"), "invoice:9");
  EXPECT_EQ(inc[0].at("job"), token_owner(held->token()));
}

TEST_F(DashboardCli, DeadLetterFieldsAndRetry) {
  auto client = make_client();
  client->exec(redis::Command{"XGROUP", "CREATE", "jobs", "jobguard", "0", "MKSTREAM"});
  const std::string dead = client->exec(redis::Command{"XADD", "jobs:dead", "*", "source_id", "1-1", "attempts", "5",
                                                       "last_error", "exit status 3", "id", "invoice-42"})
                               .str;
  const std::string taken = client->exec(redis::Command{"XADD", "jobs", "*", "id", "invoice-43"}).str;
  client->exec(redis::Command{"XREADGROUP", "GROUP", "jobguard", "worker-1", "COUNT", "1", "STREAMS", "jobs", ">"});
  const auto port = serve(true);
  const auto jobs = json::parse(request(port, "GET", "/api/jobs").body).at("streams").at(0);
  EXPECT_EQ(jobs.at("stream"), "jobs");
  EXPECT_EQ(jobs.at("length"), 1);
  EXPECT_EQ(jobs.at("pending_count"), 1);
  EXPECT_EQ(jobs.at("pending").at(0).at("id"), taken);
  EXPECT_EQ(jobs.at("pending").at(0).at("consumer"), "worker-1");
  EXPECT_EQ(jobs.at("pending").at(0).at("deliveries"), 1);
  EXPECT_TRUE(jobs.at("error").is_null());
  EXPECT_EQ(jobs.at("dead_count"), 1);
  EXPECT_EQ(jobs.at("dead").at(0).at("last_error"), "exit status 3");
  const auto d = json::parse(request(port, "GET", "/api/dead?stream=jobs&id=" + dead).body);
  EXPECT_EQ(d.at("fields").at("id"), "invoice-42");

  EXPECT_EQ(request(port, "POST", "/api/jobs/retry", "stream=jobs&id=" + dead).status, 401);
  EXPECT_EQ(request(port, "POST", "/api/jobs/retry", "stream=jobs&id=" + dead, kToken).status, 400);  // no reason
  EXPECT_EQ(request(port, "POST", "/api/jobs/retry", "stream=other&id=" + dead + "&reason=x", kToken).status, 404);
  auto r = request(port, "POST", "/api/jobs/retry", "stream=jobs&id=" + dead + "&reason=card+fixed", kToken);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string new_id = json::parse(r.body).at("new_id");
  EXPECT_EQ(client->exec(redis::Command{"XLEN", "jobs:dead"}).integer, 0);
  const auto entry = client->exec(redis::Command{"XRANGE", "jobs", new_id, new_id});
  ASSERT_EQ(entry.elements.size(), 1u);
  EXPECT_EQ(entry.elements[0].elements[1].elements[1].str, "invoice-42");
  // Retried once: a second retry of the same dead letter finds nothing.
  EXPECT_EQ(request(port, "POST", "/api/jobs/retry", "stream=jobs&id=" + dead + "&reason=again", kToken).status, 404);
  const auto inc = json::parse(request(port, "GET", "/api/incidents").body).at("incidents");
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_EQ(inc[0].at("kind"), "retry_dead_letter");
  EXPECT_EQ(inc[0].at("job"), dead + " -> " + new_id);
}

TEST_F(DashboardCli, ALostLeaseIsOnTheTimelineWithItsKeyAndHolder) {
  auto client = make_client();
  auto locks = LockService::create(*client);
  auto leases = LeaseScheduler::create(locks);
  auto lease = leases->acquire("invoice:10", {.ttl = 600ms, .fence = true});
  ASSERT_TRUE(lease);
  admin::ForceReleaseOptions fo;
  fo.reason = "test: take it away";
  ASSERT_EQ(admin::force_release(*locks, "invoice:10", fo).outcome, admin::ForceReleaseResult::Outcome::released);
  // Its next renewal (ttl/3) finds the key gone.
  ASSERT_TRUE(eventually([&] { return lease->lost(); }, 5s));
  const auto port = serve(false);
  json lost;
  ASSERT_TRUE(eventually([&] {
    const auto all = json::parse(request(port, "GET", "/api/incidents").body);
    for (const auto& i : all.at("incidents"))
      if (i.at("kind") == "lease_lost") lost = i;
    return !lost.is_null();
  }, 5s));
  EXPECT_EQ(lost.at("key"), "invoice:10");
  EXPECT_EQ(lost.at("job"), token_owner(lease->token()));
  EXPECT_NE(lost.at("detail").get<std::string>().find("lost"), std::string::npos);
  // The force release that caused it is there too, older.
  const auto inc = json::parse(request(port, "GET", "/api/incidents").body).at("incidents");
  ASSERT_EQ(inc.size(), 2u);
  EXPECT_EQ(inc[1].at("kind"), "force_release");
}

TEST(DashboardCliUsage, AShortOrUnreadableTokenFileIsAUsageError) {
  const std::string dir = ::testing::TempDir();
  const std::string short_file = dir + "/jobguard-short-token";
  std::ofstream(short_file) << "abc\n";
  for (const auto& f : {short_file, dir + "/jobguard-no-such-token-file"}) {
    const auto r = run_jobguard({"--redis", "redis://127.0.0.1:1/0", "serve", "--listen", "127.0.0.1:0",
                                 "--admin-token-file", f},
                                10s);
    EXPECT_EQ(r.status, 64) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.find("abc"), std::string::npos) << "the token's bytes must not be printed";
  }
}

}  // namespace
}  // namespace jobguard::test
