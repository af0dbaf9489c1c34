// The acceptance of the fleet numbers: several real `jobguard run` workers
// (one holding a key, two answered busy on it, one whose lease is taken from
// under it) and a library worker in this process all use lock class "run";
// then the real `jobguard serve` is scraped and `jobguard stats --json` read,
// and the counts equal what happened.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "integration/ops/exposition_parser.hpp"
#include "integration/ops/http_client.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/fleet.hpp"
#include "jobguard/redis/client.hpp"
#include "support/cli_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;

class FleetCli : public CliTest {
 protected:
  Args jg(const Args& rest) const {
    Args a{jobguard_binary(), "--redis", url()};
    a.insert(a.end(), rest.begin(), rest.end());
    return a;
  }
  // A shell command that writes `marker`, then waits until `go` exists.
  static Args wait_for_go(const std::string& marker, const std::string& go) {
    return {"sh", "-c", "echo started > \"$0\"; while [ ! -e \"$1\" ]; do sleep 0.01; done", marker, go};
  }
  static bool exists(const std::string& p) { return std::filesystem::exists(p); }
};

TEST_F(FleetCli, ServeAndStatsCountWhatRunWorkersAndALibraryWorkerDid) {
  // 1. A holder, and two workers answered busy while it holds the key.
  const auto held = file("held"), go = file("go");
  {
    Args a = jg({"run", "--key", "fleet:shared", "--ttl", "10s", "--"});
    const auto cmd = wait_for_go(held, go);
    a.insert(a.end(), cmd.begin(), cmd.end());
    Subprocess h(a);
    ASSERT_TRUE(eventually([&] { return exists(held); }, 20s)) << h.err();
    for (int i = 0; i < 2; ++i) {
      const auto r = run_jobguard({"--redis", url(), "run", "--key", "fleet:shared", "--", "true"});
      EXPECT_EQ(r.status, 75) << r.err;
    }
    std::ofstream(go) << "go\n";
    const auto r = h.wait_or_kill(30s);
    EXPECT_EQ(r.status, 0) << r.err;
  }

  // 2. A worker whose lease is lost: its key is deleted while CMD runs.
  {
    const auto started = file("lost-started");
    Subprocess w(jg({"run", "--key", "fleet:lost", "--ttl", "1s", "--", "sh", "-c",
                     "echo started > \"$0\"; sleep 30", started}));
    ASSERT_TRUE(eventually([&] { return exists(started); }, 20s)) << w.err();
    EXPECT_EQ(admin("DEL jobguard:lock:{fleet:lost}"), "1");
    const auto r = w.wait_or_kill(30s);
    EXPECT_EQ(r.status, 70) << r.err;
  }

  // 3. A library worker in this process, same class, three short holds.
  {
    auto client = make_client();
    observe::FleetPublisherOptions po;
    po.interval = 0ms;  // only the final batch, when `fleet` goes out of scope
    observe::FleetPublisher fleet(*client, po);
    auto svc = LockService::create(*client);
    LockOptions lo;
    lo.lock_class = "run";
    for (int i = 0; i < 3; ++i) {
      auto lock = svc->acquire(fmt::format("fleet:lib:{}", i), lo);
      ASSERT_TRUE(lock);
      EXPECT_TRUE(lock->release());
    }
    // Two locks that run out under their holder: one key gone (expired,
    // here deleted), one taken by another client; each release finds it so.
    auto gone = svc->acquire("fleet:lib:gone", lo);
    ASSERT_TRUE(gone);
    EXPECT_EQ(admin("DEL jobguard:lock:{fleet:lib:gone}"), "1");
    EXPECT_FALSE(gone->release());
    auto taken = svc->acquire("fleet:lib:taken", lo);
    ASSERT_TRUE(taken);
    EXPECT_EQ(admin("SET jobguard:lock:{fleet:lib:taken} other-host/1/x#00 PX 30000"), "OK");
    EXPECT_FALSE(taken->release());
  }

  // What happened to class "run": 9 acquire calls, 7 granted (holder, lost
  // worker, 5 library), 2 busy, 1 lease lost, 4 releases by the owner, 2
  // releases that found the key gone or taken, so 3 expired locks; 7 holds.
  // 4. serve, scraped.
  Subprocess serve(jg({"--json", "serve", "--listen", "127.0.0.1:0"}));
  std::uint16_t port = 0;
  ASSERT_TRUE(eventually(
      [&] {
        const auto out = serve.out();
        if (out.find('\n') == std::string::npos) return false;
        port = nlohmann::json::parse(out.substr(0, out.find('\n'))).at("port").get<std::uint16_t>();
        return true;
      },
      20s))
      << serve.err();
  // The first scrape waits for serve's first read of Redis only briefly: on
  // a loaded machine a later scrape has them.
  HttpResponse res;
  ASSERT_TRUE(eventually(
      [&] {
        res = http_request(port, "GET", "/metrics");
        return res.status == 200 && res.body.find("jobguard_fleet_up 1\n") != std::string::npos;
      },
      20s))
      << res.body;
  const auto e = parse_exposition(res.body);
  EXPECT_TRUE(e.problems.empty()) << ::testing::PrintToString(e.problems);
  auto sample = [&](const std::string& name) {
    const auto it = e.samples.find(name + "{class=\"run\"}");
    return it == e.samples.end() ? -1.0 : it->second;
  };
  EXPECT_EQ(e.samples.at("jobguard_fleet_up"), 1);
  EXPECT_EQ(sample("jobguard_fleet_lock_attempts_total"), 9) << res.body;
  EXPECT_EQ(sample("jobguard_fleet_lock_acquisitions_total"), 7);
  EXPECT_EQ(sample("jobguard_fleet_lock_busy_total"), 2);
  EXPECT_EQ(sample("jobguard_fleet_lock_contended_total"), 2);
  EXPECT_EQ(sample("jobguard_fleet_lock_leases_lost_total"), 1);
  EXPECT_EQ(sample("jobguard_fleet_lock_released_not_owner_total"), 2);
  EXPECT_EQ(sample("jobguard_fleet_lock_expired_total"), 3);
  EXPECT_EQ(sample("jobguard_fleet_lock_releases_total"), 4);
  EXPECT_EQ(sample("jobguard_fleet_lock_hold_seconds_count"), 7);
  EXPECT_GT(sample("jobguard_fleet_lock_hold_seconds_sum"), 0);
  EXPECT_EQ(e.type.at("jobguard_fleet_lock_hold_seconds"), "histogram");
  // The process's own families are still there, next to the fleet's.
  EXPECT_TRUE(e.type.count("jobguard_lock_acquisitions_total"));
  serve.signal(SIGTERM);
  EXPECT_EQ(serve.wait_or_kill(10s).status, 0);

  // 5. stats --json.
  const auto st = run_jobguard({"--redis", url(), "--json", "stats", "--window", "5m"});
  ASSERT_EQ(st.status, 0) << st.err;
  const auto j = nlohmann::json::parse(st.out);
  const nlohmann::json* run = nullptr;
  for (const auto& c : j.at("classes"))
    if (c.at("class") == "run") run = &c;
  ASSERT_NE(run, nullptr) << st.out;
  EXPECT_EQ(run->at("attempts"), 9);
  EXPECT_EQ(run->at("acquisitions"), 7);
  EXPECT_EQ(run->at("busy"), 2);
  EXPECT_EQ(run->at("leases_lost"), 1);
  EXPECT_EQ(run->at("released_not_owner"), 2);
  EXPECT_EQ(run->at("releases"), 4);
  EXPECT_EQ(run->at("expired"), 3);
  EXPECT_EQ(run->at("hold_count"), 7);
  EXPECT_NEAR(run->at("contention_ratio").get<double>(), 2.0 / 9.0, 1e-9);
  EXPECT_GT(run->at("acquisitions_per_second").get<double>(), 0);
  EXPECT_FALSE(run->at("hold_p99_seconds").is_null());
  EXPECT_GT(run->at("expired_per_minute").get<double>(), 0);

  const auto table = run_jobguard({"--redis", url(), "stats", "--window", "1h"});
  EXPECT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find("\nrun "), std::string::npos) << table.out;
}

TEST_F(FleetCli, StatsRefusesAnUnknownWindowWithUsageStatus) {
  const auto r = run_jobguard({"--redis", url(), "stats", "--window", "7m"});
  EXPECT_EQ(r.status, 64);
  EXPECT_NE(r.err.find("7m"), std::string::npos) << r.err;
}

TEST_F(FleetCli, StatsWithNothingPublishedSaysSo) {
  const auto r = run_jobguard({"--redis", url(), "stats"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("no lock class"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace jobguard::test

namespace jobguard::test {
namespace {

// A worker's limits reach the fleet's numbers: `jobs work` with a per-key
// concurrency of 1 and a rate limit runs three jobs of one key; what its own
// --json says it waited is what `serve` (/metrics and the dashboard's
// /api/classes) and `stats --json` read back from Redis.
TEST_F(FleetCli, ServeStatsAndTheDashboardShowAWorkersLimits) {
  const std::string stream = key("lim");
  for (int i = 0; i < 3; ++i) admin(fmt::format("XADD {} * id job{} customer acme", stream, i));
  // Three slots: the three jobs are read together, the first takes the one
  // permit, and the two others find it taken (each counted once).
  const auto w = run_jobguard({"--redis", url(), "--json", "jobs", "work", "--stream", stream, "--class", "lim",
                               "--concurrency", "3", "--concurrency-per", "customer=1", "--rate", "customer=2/s",
                               "--max-jobs", "3", "--", "sleep", "0.3"});
  ASSERT_EQ(w.status, 0) << w.err;
  const auto ws = nlohmann::json::parse(w.out);
  EXPECT_EQ(ws.at("completed"), 3) << w.out;
  EXPECT_EQ(ws.at("concurrency_limited"), 2) << w.out;
  const double conc_wait = ws.at("concurrency_wait_ms").get<double>() / 1000;
  const double rate_wait = ws.at("rate_wait_ms").get<double>() / 1000;
  EXPECT_GT(conc_wait, 0);

  Subprocess serve(jg({"--json", "serve", "--listen", "127.0.0.1:0"}));
  std::uint16_t port = 0;
  ASSERT_TRUE(eventually(
      [&] {
        const auto out = serve.out();
        if (out.find('\n') == std::string::npos) return false;
        port = nlohmann::json::parse(out.substr(0, out.find('\n'))).at("port").get<std::uint16_t>();
        return true;
      },
      20s))
      << serve.err();
  HttpResponse res;
  ASSERT_TRUE(eventually(
      [&] {
        res = http_request(port, "GET", "/metrics");
        return res.status == 200 && res.body.find("jobguard_fleet_job_concurrency_limited_total{class=\"lim\"}") !=
                                        std::string::npos;
      },
      20s))
      << res.body;
  const auto e = parse_exposition(res.body);
  EXPECT_TRUE(e.problems.empty()) << ::testing::PrintToString(e.problems);
  const auto sample = [&](const std::string& name) { return e.samples.at(name + "{class=\"lim\"}"); };
  EXPECT_EQ(sample("jobguard_fleet_job_concurrency_limited_total"), 2) << res.body;
  EXPECT_NEAR(sample("jobguard_fleet_job_concurrency_limit_wait_seconds_total"), conc_wait, 1e-9);
  EXPECT_EQ(sample("jobguard_fleet_job_rate_limited_total"), ws.at("rate_limited").get<double>());
  EXPECT_NEAR(sample("jobguard_fleet_job_rate_limit_wait_seconds_total"), rate_wait, 1e-9);
  EXPECT_EQ(e.type.at("jobguard_fleet_job_concurrency_limited_total"), "counter");

  const auto api = http_request(port, "GET", "/api/classes?window=5m");
  ASSERT_EQ(api.status, 200) << api.body;
  const nlohmann::json* lim = nullptr;
  const auto classes = nlohmann::json::parse(api.body);
  for (const auto& c : classes.at("classes"))
    if (c.at("class") == "lim") lim = &c;
  ASSERT_NE(lim, nullptr) << api.body;
  EXPECT_EQ(lim->at("concurrency_limited"), 2);
  EXPECT_NEAR(lim->at("concurrency_limit_wait_seconds").get<double>(), conc_wait, 1e-9);
  EXPECT_EQ(lim->at("rate_limited"), ws.at("rate_limited"));
  EXPECT_NEAR(lim->at("rate_limit_wait_seconds").get<double>(), rate_wait, 1e-9);
  serve.signal(SIGTERM);
  EXPECT_EQ(serve.wait_or_kill(10s).status, 0);

  const auto st = run_jobguard({"--redis", url(), "--json", "stats", "--window", "5m"});
  ASSERT_EQ(st.status, 0) << st.err;
  const nlohmann::json* s = nullptr;
  const auto j = nlohmann::json::parse(st.out);
  for (const auto& c : j.at("classes"))
    if (c.at("class") == "lim") s = &c;
  ASSERT_NE(s, nullptr) << st.out;
  EXPECT_EQ(s->at("concurrency_limited"), 2);
  EXPECT_EQ(s->at("rate_limited"), ws.at("rate_limited"));
}

}  // namespace
}  // namespace jobguard::test
