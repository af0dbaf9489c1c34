// The shipped alert rules and dashboard against the real stack: a private
// redis-server, the real `jobguard serve` (with a lock catalog), real
// `jobguard run` workers, and a real Prometheus server (the Debian package)
// started with a generated config that scrapes serve and evaluates a copy of
// deploy/prometheus/jobguard-alerts.yml every second.
//
// The copy differs from the shipped file in durations only: every `for:` is
// 1s and every range `[...]` is 15s, because the shipped minutes would
// outlast any test. The expressions, labels and thresholds are the shipped
// ones.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "integration/ops/http_client.hpp"
#include "jobguard/testing/embedded_redis.hpp"
#include "support/cli_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;
using nlohmann::json;

std::string source_file(const std::string& rel) { return std::string(JOBGUARD_SOURCE_DIR) + "/" + rel; }

std::string url_encode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') out += static_cast<char>(c);
    else out += fmt::format("%{:02X}", c);
  }
  return out;
}

// Go's server answers a larger body chunked: undo it.
std::string dechunk(const HttpResponse& r) {
  auto it = r.headers.find("transfer-encoding");
  if (it == r.headers.end() || it->second.find("chunked") == std::string::npos) return r.body;
  std::string out;
  std::size_t pos = 0;
  for (;;) {
    const auto eol = r.body.find("\r\n", pos);
    if (eol == std::string::npos) throw std::runtime_error("truncated chunked body");
    const auto n = std::stoul(r.body.substr(pos, eol - pos), nullptr, 16);
    if (n == 0) return out;
    out += r.body.substr(eol + 2, n);
    pos = eol + 2 + n + 2;
  }
}

class Alerts : public CliTest {
 protected:
  Args jg(const Args& rest) const {
    Args a{jobguard_binary(), "--redis", url()};
    a.insert(a.end(), rest.begin(), rest.end());
    return a;
  }

  // GET on Prometheus' API; the parsed JSON, or null when it did not answer
  // (yet) or answered with an error.
  json api(const std::string& target) const {
    try {
      const auto r = http_request(prom_port, "GET", target, 5s);
      if (r.status != 200) return nullptr;
      auto j = json::parse(dechunk(r));
      return j.value("status", "") == "success" ? j : json(nullptr);
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  json query(const std::string& promql) const { return api("/api/v1/query?query=" + url_encode(promql)); }
  // The state of alert `name` (with label class=`cls` when given): "firing",
  // "pending" or "" when Prometheus has no such alert.
  std::string alert_state(const std::string& name, const std::string& cls = {}) const {
    const auto j = api("/api/v1/alerts");
    if (j.is_null()) return "?";
    for (const auto& a : j["data"]["alerts"]) {
      const auto& l = a["labels"];
      if (l.value("alertname", "") != name) continue;
      if (!cls.empty() && l.value("class", "") != cls) continue;
      return a.value("state", "");
    }
    return "";
  }
  std::string alerts_text() const {
    const auto j = api("/api/v1/alerts");
    return j.is_null() ? "(no answer)" : j["data"]["alerts"].dump();
  }

  std::uint16_t prom_port = 0;
};

TEST_F(Alerts, RulesFireAndResolveOnRealFaultsAndEveryPanelQueryHasData) {
  const auto t0 = std::chrono::steady_clock::now();
  // A catalog: class billing, TTL 1 s (the runs below use the same).
  const auto catalog = file("catalog.yaml");
  std::ofstream(catalog) << "classes:\n"
                            "  - name: billing\n"
                            "    key: \"billing:{id}\"\n"
                            "    owner: test\n"
                            "    protects: nothing\n"
                            "    consequence: low\n"
                            "    ttl: 1s\n"
                            "    renewal: false\n"
                            "    hard_timeout: none\n"
                            "    fencing: false\n"
                            "    on_redis_down: fail-closed\n"
                            "    fallback: none\n";

  Subprocess serve(jg({"--json", "serve", "--listen", "127.0.0.1:0", "--catalog", catalog, "--redis-check-interval",
                       "1s"}));
  std::uint16_t serve_port = 0;
  ASSERT_TRUE(eventually(
      [&] {
        const auto out = serve.out();
        if (out.find('\n') == std::string::npos) return false;
        serve_port = json::parse(out.substr(0, out.find('\n'))).at("port").get<std::uint16_t>();
        return true;
      },
      20s))
      << serve.err();

  // The rules, with the durations of a test (see the top of this file).
  std::ifstream in(source_file("deploy/prometheus/jobguard-alerts.yml"));
  ASSERT_TRUE(in) << "cannot read the shipped rules";
  std::stringstream ss;
  ss << in.rdbuf();
  std::string rules = std::regex_replace(ss.str(), std::regex(R"(for: \d+[smh])"), "for: 1s");
  rules = std::regex_replace(rules, std::regex(R"(\[\d+[smh]\])"), "[15s]");
  ASSERT_NE(rules.find("for: 1s"), std::string::npos);
  ASSERT_EQ(rules.find("[10m]"), std::string::npos);
  std::ofstream(file("rules.yml")) << rules;

  prom_port = pick_free_port();
  std::ofstream(file("prometheus.yml")) << fmt::format(
      "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      "rule_files: [\"{}\"]\n"
      "scrape_configs:\n  - job_name: jobguard\n    static_configs:\n      - targets: [\"127.0.0.1:{}\"]\n",
      file("rules.yml"), serve_port);
  Subprocess prom({JOBGUARD_PROMETHEUS_BIN, "--config.file=" + file("prometheus.yml"), "--storage.tsdb.path=" + file("tsdb"),
                   fmt::format("--web.listen-address=127.0.0.1:{}", prom_port), "--log.level=warn"});
  ASSERT_TRUE(eventually(
      [&] {
        try {
          return http_request(prom_port, "GET", "/-/ready", 2s).status == 200;
        } catch (const std::exception&) {
          return false;
        }
      },
      30s))
      << prom.err();

  // Healthy work of class billing, so its series exist (at 0 expired)
  // before the fault: Prometheus counts an increase only within a series.
  for (int i = 0; i < 3; ++i) {
    const auto r = run_jobguard({"--redis", url(), "run", "--class", "billing", "--ttl", "1s", "--key",
                                 fmt::format("billing:{}", i), "--", "true"});
    ASSERT_EQ(r.status, 0) << r.err;
  }
  ASSERT_TRUE(eventually(
      [&] {
        const auto j = query("jobguard_fleet_lock_expired_total{class=\"billing\"}");
        return !j.is_null() && j["data"]["result"].size() == 1;
      },
      30s))
      << prom.err();
  EXPECT_EQ(alert_state("JobguardLocksExpiredUnderHolder", "billing"), "") << alerts_text();
  EXPECT_EQ(alert_state("JobguardHoldTimeNearTTL", "billing"), "") << alerts_text();

  // Fault 1: a holder stopped past its TTL. Its key expires while it cannot
  // renew; resumed, it finds its lease lost, stops CMD and exits 70, and its
  // last batch carries the loss to the fleet's numbers.
  const auto started = file("started");
  Subprocess holder(jg({"run", "--class", "billing", "--ttl", "1s", "--key", "billing:stopped", "--", "sh", "-c",
                        "echo started > \"$0\"; sleep 60", started}));
  ASSERT_TRUE(eventually([&] { return std::filesystem::exists(started); }, 20s)) << holder.err();
  holder.signal(SIGSTOP);
  ASSERT_TRUE(eventually([&] { return admin("EXISTS jobguard:lock:{billing:stopped}") == "0"; }, 20s));
  holder.signal(SIGCONT);
  const auto hr = holder.wait_or_kill(30s);
  EXPECT_EQ(hr.status, 70) << hr.err;
  // Two alerts come of it: the expired lease, and the hold time (the stopped
  // holder held its lock past the catalog's 1 s TTL, grant to loss, so the
  // class's p99 hold time is over 80 % of it). Both look at the same 15 s
  // window, so they are watched together: waiting for one, then the other,
  // can outlast the window on a loaded host, and the second then never fires.
  bool expired_fired = false;
  bool near_ttl_fired = false;
  ASSERT_TRUE(eventually(
      [&] {
        expired_fired = expired_fired || alert_state("JobguardLocksExpiredUnderHolder", "billing") == "firing";
        near_ttl_fired = near_ttl_fired || alert_state("JobguardHoldTimeNearTTL", "billing") == "firing";
        return expired_fired && near_ttl_fired;
      },
      30s))
      << "JobguardLocksExpiredUnderHolder fired: " << expired_fired
      << ", JobguardHoldTimeNearTTL fired: " << near_ttl_fired << "; " << alerts_text();

  // Fault 2, while fault 1's window runs out: the lock Redis made evicting.
  EXPECT_EQ(alert_state("JobguardLockRedisEvicting"), "") << alerts_text();
  ASSERT_EQ(admin("CONFIG SET maxmemory 1gb"), "OK");
  ASSERT_EQ(admin("CONFIG SET maxmemory-policy allkeys-lru"), "OK");
  ASSERT_TRUE(eventually([&] { return alert_state("JobguardLockRedisEvicting") == "firing"; }, 30s)) << alerts_text();

  // Every panel query of the dashboard, with the variables Grafana would
  // fill in, returns data.
  {
    std::ifstream d(source_file("deploy/grafana/jobguard-dashboard.json"));
    ASSERT_TRUE(d) << "cannot read the dashboard";
    const auto dash = json::parse(d);
    int n = 0;
    for (const auto& p : dash.at("panels")) {
      if (!p.contains("targets")) continue;
      for (const auto& t : p.at("targets")) {
        std::string expr = t.at("expr").get<std::string>();
        expr = std::regex_replace(expr, std::regex(R"(\$__rate_interval)"), "30s");
        expr = std::regex_replace(expr, std::regex(R"(\$class)"), ".*");
        ++n;
        json j;
        EXPECT_TRUE(eventually(
            [&] {
              j = query(expr);
              return !j.is_null() && !j["data"]["result"].empty();
            },
            10s))
            << p.at("title") << ": " << expr << " -> " << j.dump();
      }
    }
    EXPECT_GE(n, 20);
  }

  // The fixture's redis-server runs without persistence (no RDB save
  // points, no AOF): a third real condition.
  EXPECT_TRUE(eventually([&] { return alert_state("JobguardLockRedisNotPersistent") == "firing"; }, 30s))
      << alerts_text();

  // The faults end; the alerts resolve.
  ASSERT_EQ(admin("CONFIG SET maxmemory-policy noeviction"), "OK");
  ASSERT_EQ(admin("CONFIG SET maxmemory 0"), "OK");
  ASSERT_EQ(admin("CONFIG SET appendonly yes"), "OK");
  EXPECT_TRUE(eventually([&] { return alert_state("JobguardLockRedisEvicting").empty(); }, 30s)) << alerts_text();
  EXPECT_TRUE(eventually([&] { return alert_state("JobguardLockRedisNotPersistent").empty(); }, 30s))
      << alerts_text();
  EXPECT_TRUE(eventually([&] { return alert_state("JobguardLocksExpiredUnderHolder", "billing").empty(); }, 40s))
      << alerts_text();
  EXPECT_TRUE(eventually([&] { return alert_state("JobguardHoldTimeNearTTL", "billing").empty(); }, 40s))
      << alerts_text();
  // The alerts whose condition this test does not create stay quiet (no
  // replicas are required, the server kept its lock state and evicted
  // nothing, no class is fail-open).
  for (const char* quiet : {"JobguardLockRedisUnreachable", "JobguardLockStateLost", "JobguardLockRedisEvictedKeys",
                            "JobguardLockRedisReplicaShortfall", "JobguardFailOpenRuns"})
    EXPECT_EQ(alert_state(quiet), "") << quiet << ": " << alerts_text();

  prom.signal(SIGTERM);
  EXPECT_EQ(prom.wait_or_kill(20s).status, 0) << prom.err();
  serve.signal(SIGTERM);
  EXPECT_EQ(serve.wait_or_kill(10s).status, 0) << serve.err();
  std::cout << "alerts test took "
            << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count()
            << " ms\n";
}

}  // namespace
}  // namespace jobguard::test
