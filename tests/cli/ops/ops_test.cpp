// `jobguard locks`, `doctor`, `policy` and `jobs work --catalog` as operators
// run them: the real binary, a real redis-server per test.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "jobguard/testing/embedded_redis.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/fleet.hpp"
#include "support/cli_fixture.hpp"
#ifndef JOBGUARD_TESTS_WITHOUT_POSTGRES
#include "support/postgres_fixture.hpp"
#endif
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;
using nlohmann::json;

const std::string kExample = std::string(JOBGUARD_SOURCE_DIR) + "/docs/catalog.example.yaml";

class OpsCli : public CliTest {
 protected:
  SubprocessResult jg(const Args& args, const std::string& redis_url = {}) {
    Args a{jobguard_binary(), "--redis", redis_url.empty() ? url() : redis_url};
    a.insert(a.end(), args.begin(), args.end());
    Subprocess p(a);
    return p.wait_or_kill(60s);
  }
  // `jobguard run` holding `resource` until the file `go` exists.
  std::unique_ptr<Subprocess> hold(const std::string& resource, const Args& flags, const std::string& started,
                                   const std::string& go) {
    Args a{jobguard_binary(), "--redis", url(), "run", "--key", resource};
    a.insert(a.end(), flags.begin(), flags.end());
    a.insert(a.end(), {"--", "sh", "-c", "echo started > \"$0\"; while [ ! -e \"$1\" ]; do sleep 0.01; done", started,
                       go});
    auto p = std::make_unique<Subprocess>(a);
    EXPECT_TRUE(eventually([&] { return std::filesystem::exists(started); }, 15s)) << p->err();
    return p;
  }
  void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
  // One catalog entry with every field: a low, unfenced, non-renewing class
  // whose key pattern is "<name>:{id}".
  static std::string yaml_class(const std::string& name, const std::string& ttl) {
    return fmt::format(R"(  - name: {}
    key: "{}:{{id}}"
    owner: ops
    protects: a test resource
    consequence: low
    ttl: {}
    renewal: false
    hard_timeout: none
    fencing: false
    on_redis_down: fail-closed
    fallback: none
)", name, name, ttl);
  }
};

TEST_F(OpsCli, LocksLsAndShowNameTheHolderOfARun) {
  auto p = hold("inv:1", {"--fence", "--ttl", "30s", "--job-id", "nightly"}, file("started"), file("go"));
  auto r = jg({"locks", "ls"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("RESOURCE"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("inv:1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/nightly"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 lock ("), std::string::npos) << r.out;

  r = jg({"--json", "locks", "ls"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = json::parse(r.out);
  ASSERT_EQ(j.at("locks").size(), 1u);
  const auto& l = j["locks"][0];
  EXPECT_EQ(l.at("resource"), "inv:1");
  EXPECT_EQ(l.at("key"), "jobguard:lock:{inv:1}");
  const auto token = admin("GET jobguard:lock:{inv:1}");
  EXPECT_EQ(l.at("holder").get<std::string>(), token.substr(0, token.rfind('#')));
  EXPECT_GT(l.at("ttl_left_ms").get<std::int64_t>(), 0);
  EXPECT_FALSE(l.at("fence").is_null());
  EXPECT_FALSE(l.at("fence_age_ms").is_null());

  r = jg({"locks", "show", "jobguard:lock:{inv:1}"});  // the Redis key works as well as the resource
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("/nightly"), std::string::npos) << r.out;
  r = jg({"locks", "show", "inv:2"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("not held"), std::string::npos) << r.out;
  std::ofstream(file("go")) << "go\n";
  EXPECT_EQ(p->wait_or_kill(30s).status, 0);
}

TEST_F(OpsCli, ForceReleaseStopsTheRunRecordsTheAuditAndAdvancesTheFence) {
  auto p = hold("inv:9", {"--fence", "--ttl", "3s", "--job-id", "stuck"}, file("started"), file("go"));
  const auto old_fence = std::stoll(admin("GET jobguard:fence:{inv:9}"));
  auto r = jg({"--json", "locks", "release", "inv:9", "--reason", "host is dead"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = json::parse(r.out);
  EXPECT_EQ(j.at("outcome"), "released");
  EXPECT_NE(j.at("holder").get<std::string>().find("/stuck"), std::string::npos);
  EXPECT_GT(j.at("fence").get<std::int64_t>(), old_fence);
  EXPECT_EQ(admin("EXISTS jobguard:lock:{inv:9}"), "0");
  // The run's next renewal finds its token gone: CMD is stopped, exit 70.
  const auto done = p->wait_or_kill(30s);
  EXPECT_EQ(done.status, 70) << done.err;

  r = jg({"--json", "locks", "audit"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto a = json::parse(r.out).at("releases");
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].at("resource"), "inv:9");
  EXPECT_EQ(a[0].at("reason"), "host is dead");
  EXPECT_NE(a[0].at("who").get<std::string>().find('@'), std::string::npos);
  EXPECT_EQ(a[0].at("fence"), j.at("fence"));
  r = jg({"locks", "audit"});
  EXPECT_NE(r.out.find("host is dead"), std::string::npos) << r.out;

  // Nothing held any more: releasing again is a no-op, exit 0.
  r = jg({"locks", "release", "inv:9", "--reason", "again"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("not held"), std::string::npos);
}

TEST_F(OpsCli, ReleaseOfAnotherHoldersLockIsBusyAndReleaseNeedsAReason) {
  admin("SET jobguard:lock:{inv:3} web-9/77/new#00ff PX 30000");
  auto r = jg({"locks", "release", "inv:3", "--reason", "x", "--holder", "web-3/12/old"});
  EXPECT_EQ(r.status, 75) << r.err;
  EXPECT_NE(r.err.find("web-9/77/new"), std::string::npos) << r.err;
  EXPECT_EQ(admin("EXISTS jobguard:lock:{inv:3}"), "1");
  EXPECT_EQ(jg({"locks", "release", "inv:3"}).status, 64);
  EXPECT_EQ(jg({"locks", "release", "bad key", "--reason", "x"}).status, 64);
}

TEST_F(OpsCli, LsByClassUsesTheCatalogsKeyPatterns) {
  admin("SET jobguard:lock:{invoice:1} a/1/x#00 PX 30000");
  admin("SET jobguard:lock:{tenant:acme:sync} b/2/y#00 PX 30000");
  auto r = jg({"--json", "locks", "ls", "--class", "tenant-sync", "--catalog", kExample});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = json::parse(r.out);
  ASSERT_EQ(j.at("locks").size(), 1u);
  EXPECT_EQ(j["locks"][0].at("resource"), "tenant:acme:sync");
  EXPECT_EQ(j["locks"][0].at("class"), "tenant-sync");
  EXPECT_EQ(jg({"locks", "ls", "--class", "tenant-sync"}).status, 64);  // no catalog
  r = jg({"locks", "ls", "--class", "nope", "--catalog", kExample});
  EXPECT_EQ(r.status, 64);
  EXPECT_NE(r.err.find("no class 'nope'"), std::string::npos) << r.err;
}

TEST_F(OpsCli, LocksAgainstAnUnreachableRedisIsUnavailable) {
  const auto r = jg({"locks", "ls"}, fmt::format("redis://127.0.0.1:{}/0?timeout=300ms&connect_timeout=300ms",
                                                 pick_free_port()));
  EXPECT_EQ(r.status, 69) << r.err;
}

TEST_F(OpsCli, DoctorExitStatusFollowsTheWorstFinding) {
  // The fixture's server has no persistence: a warning, nothing failing.
  auto r = jg({"doctor"});
  // The latency check fails a PING of 200 ms or more, which this binary's
  // client can meet on a loaded host (a sanitizer build beside other tests):
  // then the worst finding is that FAIL. Any other FAIL fails the test.
  const bool slow = r.out.find("FAIL latency:") != std::string::npos;
  EXPECT_EQ(r.status, slow ? 2 : 1) << r.out << r.err;
  int fails = 0;
  for (auto at = r.out.find("FAIL "); at != std::string::npos; at = r.out.find("FAIL ", at + 1)) ++fails;
  EXPECT_EQ(fails, slow ? 1 : 0) << r.out;
  EXPECT_NE(r.out.find("WARN persistence:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("OK   eviction:"), std::string::npos) << r.out;

  EmbeddedRedisOptions o;
  o.extra_args = {"--maxmemory", "50mb", "--maxmemory-policy", "allkeys-lru"};
  EmbeddedRedis evicting(o);
  evicting.start();
  r = jg({"--json", "doctor"}, evicting.url());
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  const auto j = json::parse(r.out);
  EXPECT_EQ(j.at("status"), "FAIL");
  bool eviction_failed = false;
  for (const auto& c : j.at("checks"))
    if (c.at("check") == "eviction") eviction_failed = c.at("status") == "FAIL";
  EXPECT_TRUE(eviction_failed) << r.out;

  r = jg({"doctor"}, fmt::format("redis://127.0.0.1:{}/0?timeout=300ms&connect_timeout=300ms", pick_free_port()));
  EXPECT_EQ(r.status, 69) << r.out << r.err;
  EXPECT_NE(r.out.find("FAIL connection:"), std::string::npos) << r.out;
  EXPECT_EQ(jg({"doctor"}, "redis://host:99999").status, 64);
}

TEST_F(OpsCli, DoctorWithACatalogJudgesSemaphoresByTheirClass) {
  auto client = make_client();
  auto svc = LockService::create(*client);
  std::vector<Lock> held;
  for (int i = 0; i < 6; ++i) {
    auto l = svc->acquire("psp:acme-pay", {.ttl = 30s, .permits = 6});
    ASSERT_TRUE(l) << i;
    held.push_back(std::move(*l));
  }
  auto r = jg({"doctor"});
  EXPECT_NE(r.out.find("OK   semaphores: 1 semaphore with live permits, 6 permits held"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("OK   rwlocks: 0 read-write locks held"), std::string::npos) << r.out;
  r = jg({"doctor", "--catalog", kExample});  // payment-provider declares 5
  EXPECT_NE(r.out.find("WARN semaphores: 1 semaphore with live permits, 6 permits held: psp:acme-pay: 6 holders, "
                       "above the 5 permits class 'payment-provider' declares"),
            std::string::npos)
      << r.out;
  r = jg({"doctor", "--catalog", file("missing.yaml")});
  EXPECT_EQ(r.status, 64) << r.out << r.err;
  EXPECT_NE(r.err.find("cannot read the file"), std::string::npos) << r.err;
}

#ifndef JOBGUARD_TESTS_WITHOUT_POSTGRES
TEST_F(OpsCli, DoctorWithPostgresChecksItTooAndAnUnmigratedDatabaseFails) {
  // A fresh cluster of this test binary: jobguard's tables not created yet.
  const auto pg = shared_postgres().url();
  auto r = jg({"--postgres", pg, "--json", "doctor"});
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  auto status_of = [](const json& j, const std::string& check) {
    for (const auto& c : j.at("checks"))
      if (c.at("check") == check) return c.at("status").get<std::string>();
    return std::string("missing");
  };
  auto j = json::parse(r.out);
  EXPECT_EQ(status_of(j, "pg_connection"), "OK") << r.out;
  EXPECT_EQ(status_of(j, "pg_role"), "OK") << r.out;
  EXPECT_EQ(status_of(j, "pg_schema"), "FAIL") << r.out;
  EXPECT_EQ(jg({"--postgres", pg, "pg", "migrate"}).status, 0);
  r = jg({"--postgres", pg, "--json", "doctor"});
  j = json::parse(r.out);
  EXPECT_EQ(status_of(j, "pg_schema"), "OK") << r.out;
  EXPECT_EQ(status_of(j, "pg_role"), "OK") << r.out;
}
#endif

TEST_F(OpsCli, PolicyLintPassesTheExampleCatalog) {
  const auto r = jg({"policy", "lint", kExample});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("7 classes OK"), std::string::npos) << r.out;
}

TEST_F(OpsCli, PolicyLintPrintsOneLinePerFindingAndExits65) {
  const auto path = file("bad.yaml");
  write(path, R"(classes:
  - name: charge
    key: "charge:{id}"
    owner: billing
    protects: a charge
    consequence: high
    ttl: 30s
    renewal: false
    hard_timeout: none
    fencing: false
    on_redis_down: fail-closed
    fallback: queued
  - name: export
    key: "export:{id}"
    protects: an export
    consequence: low
    ttl: 30s
    renewal: true
    hard_timeout: none
    fencing: false
    on_redis_down: fail-open
    fallback: tomorrow
)");
  const auto r = jg({"policy", "lint", path});
  EXPECT_EQ(r.status, 65) << r.out << r.err;
  EXPECT_NE(r.out.find(path + ":2: error: class 'charge': consequence high needs fencing"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(path + ":13: error: class 'export': missing field 'owner'"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
  EXPECT_EQ(jg({"policy", "lint", file("missing.yaml")}).status, 65);
}

TEST_F(OpsCli, PolicyLintJudgesTtlsByTheFleetsObservedHoldTimes) {
  // 24 holders per class, each holding its lock for 300 ms, published to the
  // fleet as any library user's process publishes.
  auto client = make_client();
  {
    observe::FleetPublisher fleet(*client, observe::FleetPublisherOptions{.interval = 0ms});
    auto svc = LockService::create(*client);
    std::vector<std::thread> holders;
    for (int i = 0; i < 24; ++i)
      holders.emplace_back([&svc, i] {
        std::vector<Lock> held;
        for (const char* cls : {"lint-hot", "lint-cold", "lint-fine"}) {
          auto l = svc->acquire(fmt::format("{}:{}", cls, i), LockOptions{.ttl = 60s, .lock_class = cls});
          if (l) held.push_back(std::move(*l));
        }
        std::this_thread::sleep_for(300ms);
        for (auto& l : held) l.release();
      });
    for (auto& t : holders) t.join();
    ASSERT_TRUE(fleet.flush());
  }
  const auto cat = file("fleet.yaml");
  std::string yaml = "classes:\n";
  for (auto [name, ttl] : {std::pair{"lint-hot", "400ms"}, {"lint-cold", "60s"}, {"lint-fine", "3s"}})
    yaml += yaml_class(name, ttl);
  write(cat, yaml);
  // Without --redis only the declarations are judged: all fine.
  Subprocess offline({jobguard_binary(), "policy", "lint", cat});
  const auto off = offline.wait_or_kill(30s);
  EXPECT_EQ(off.status, 0) << off.out << off.err;

  const auto r = jg({"policy", "lint", cat, "--window", "5m"});
  EXPECT_EQ(r.status, 65) << r.out << r.err;
  EXPECT_NE(r.out.find(cat + ":2: error: class 'lint-hot': ttl 400ms is too close to the observed p99 hold time"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(cat + ":13: warning: class 'lint-cold': ttl 1m is over 20x the observed p99"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("lint-fine"), std::string::npos) << r.out;
  EXPECT_EQ(jg({"policy", "lint", cat, "--window", "7m"}).status, 64);
}

TEST_F(OpsCli, PolicyLintWithRedisRefusesATtlAboveTheUrlsMaxTtl) {
  const auto cat = file("long.yaml");
  write(cat, "classes:\n" + yaml_class("report", "2m"));
  // The URL's max_ttl defaults to 60s: every acquire of this class is refused.
  auto r = jg({"policy", "lint", cat});
  EXPECT_EQ(r.status, 65) << r.out << r.err;
  EXPECT_NE(r.out.find(cat + ":2: error: class 'report': ttl 2m is above the lock Redis's max TTL 1m"),
            std::string::npos)
      << r.out;
  r = jg({"policy", "lint", cat}, url() + "?max_ttl=5m");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
}

TEST_F(OpsCli, PolicyDocRendersMarkdownAndHtml) {
  auto r = jg({"policy", "doc", kExample});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("# Lock catalog"), std::string::npos);
  EXPECT_NE(r.out.find("## tenant-sync"), std::string::npos);
  r = jg({"policy", "doc", kExample, "--format", "html", "-o", file("c.html")});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto html = read_file(file("c.html"));
  EXPECT_NE(html.find("<h2 id=\"ledger-post\">"), std::string::npos);
  EXPECT_EQ(jg({"policy", "doc", kExample, "--format", "pdf"}).status, 64);
}

TEST_F(OpsCli, JobsWorkTakesItsClassFromTheCatalog) {
  const auto cat = file("cat.yaml");
  write(cat, R"(classes:
  - name: thumb
    key: "img:{id}:thumb"
    owner: media
    protects: one render
    consequence: low
    ttl: 7s
    renewal: false
    hard_timeout: none
    fencing: true
    on_redis_down: fail-closed
    fallback: rendered later
)");
  auto r = jg({"jobs", "add", "--stream", "q", "id=42"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto out = file("env");
  r = jg({"jobs", "work", "--stream", "q", "--class", "thumb", "--catalog", cat, "--max-jobs", "1", "--", "sh", "-c",
          "printf '%s %s\\n' \"$JOBGUARD_KEY\" \"$JOBGUARD_FENCE\" >> \"$0\"", out});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto env = read_file(out);
  EXPECT_EQ(env.rfind("jobguard:lock:{img:42:thumb} ", 0), 0u) << env;
  EXPECT_GT(env.size(), std::string("jobguard:lock:{img:42:thumb} \n").size()) << env;  // a fence: the class is fenced
  r = jg({"jobs", "work", "--stream", "q", "--class", "nope", "--catalog", cat, "--", "true"});
  EXPECT_EQ(r.status, 64) << r.err;
}

}  // namespace
}  // namespace jobguard::test
