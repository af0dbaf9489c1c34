// `jobguard server trust` at the binary: a server started a moment earlier is
// refused with a message naming the way forward, trusted by the one command,
// then serves `run` at once; a server with signs of having served locks is
// refused unless --force, and every trust leaves its audit in the record and
// one log line. The same on a 3-primary cluster and a Sentinel-managed primary,
// with `run`, `bench` and `serve`.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>

#include "integration/ops/http_client.hpp"
#include "support/cli_fixture.hpp"
#include "support/cluster_redis.hpp"
#include "support/sentinel_redis.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

std::size_t lines(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

class ServerTrust : public CliTest {
 protected:
  void SetUp() override {
    trust_new_server_ = false;  // a server as a user meets it: never seen by jobguard
    CliTest::SetUp();
  }
  SubprocessResult run_touch(const std::string& marker) {
    return run_jobguard({"--redis", url(), "run", "--key", "invoice:48291", "--ttl", "30s", "--fence", "--", "touch",
                         marker},
                        30s);
  }
  std::string record(const std::string& field) const { return admin("HGET jobguard:epoch " + field); }
};

TEST_F(ServerTrust, AFreshServerIsRefusedWithTheWayForwardThenTrustedThenRuns) {
  const auto marker = file("ran");
  auto refused = run_touch(marker);
  EXPECT_EQ(refused.status, 69) << refused.err;
  EXPECT_EQ(lines(refused.err), 1u) << refused.err;
  EXPECT_NE(refused.err.find("no lock-state record"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("`jobguard server trust --redis " + url() + "`"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("else wait 60 s"), std::string::npos) << refused.err;
  EXPECT_FALSE(std::filesystem::exists(marker));

  // The refused run left the quarantine in the record; the trust lifts it
  // (only a missing record was found, on this very server process).
  auto t = run_jobguard({"--redis", url(), "server", "trust", "--reason", "new box for billing"}, 30s);
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.out.find(fmt::format("trusted {}:{} as new: epoch ", server->host(), server->port())),
            std::string::npos)
      << t.out;
  // The audit: one log line, and the same who/when/why in the record.
  EXPECT_EQ(lines(t.err), 1u) << t.err;
  EXPECT_NE(t.err.find("server_trusted"), std::string::npos) << t.err;
  EXPECT_NE(t.err.find(" pid "), std::string::npos) << t.err;
  EXPECT_NE(t.err.find("reason=\"new box for billing\""), std::string::npos) << t.err;
  EXPECT_EQ(record("trusted_why"), "new box for billing");
  EXPECT_NE(record("trusted_by").find("@"), std::string::npos) << record("trusted_by");
  EXPECT_NE(record("trusted_by").find(" pid "), std::string::npos) << record("trusted_by");
  // The server's clock, in ms (this host's: the server runs here).
  const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LE(std::llabs(std::stoll(record("trusted_at")) - now_ms), 60000) << record("trusted_at");
  EXPECT_EQ(record("until"), "0");
  EXPECT_EQ(record("trusted_forced"), "");

  auto ok = run_touch(marker);
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_TRUE(std::filesystem::exists(marker));

  // Idempotent: the record says intact (and a lock key now exists, which is
  // what an intact server in use has): nothing written, exit 0.
  const auto epoch = record("id");
  auto again = run_jobguard({"--redis", url(), "--json", "server", "trust"}, 30s);
  ASSERT_EQ(again.status, 0) << again.err;
  const auto j = json::parse(again.out);
  EXPECT_FALSE(j.at("refused").get<bool>());
  ASSERT_EQ(j.at("servers").size(), 1u);
  EXPECT_EQ(j["servers"][0].at("outcome"), "already");
  EXPECT_EQ(j["servers"][0].at("epoch"), epoch);
  EXPECT_EQ(j["servers"][0].at("reason"), "new box for billing");
  EXPECT_EQ(record("id"), epoch);
}

TEST_F(ServerTrust, BenchOnAFreshServerIsRefusedWithTheWayForwardInsteadOfMeasuringRefusals) {
  auto r = run_jobguard({"--redis", url(), "bench", "--workers", "2", "--seconds", "0.2", "--rounds", "1"}, 60s);
  EXPECT_EQ(r.status, 69) << r.err;
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("`jobguard server trust --redis " + url() + "`"), std::string::npos) << r.err;
  ASSERT_EQ(run_jobguard({"--redis", url(), "server", "trust"}, 30s).status, 0);
  auto ok = run_jobguard({"--redis", url(), "--json", "bench", "--workers", "2", "--seconds", "0.2", "--rounds", "1"},
                         60s);
  ASSERT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(json::parse(ok.out)["lock"]["errors"].get<std::uint64_t>(), 0u) << ok.out;
}

TEST_F(ServerTrust, KeysUnderThePrefixAreRefusedUnlessForcedAndTheForceIsRecorded) {
  admin("SET jobguard:lock:{invoice:1} someone");
  admin("SET other:thing 1");  // not under the prefix: no sign
  auto r = run_jobguard({"--redis", url(), "server", "trust", "--reason", "new"}, 30s);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("signs of having served locks"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1 keys under prefix 'jobguard:' (jobguard:lock:{invoice:1})"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("pass --force if you know no holder is alive"), std::string::npos) << r.err;
  EXPECT_EQ(admin("EXISTS jobguard:epoch"), "0") << "a refusal writes nothing";

  auto f = run_jobguard({"--redis", url(), "server", "trust", "--force", "--reason", "holder host decommissioned"}, 30s);
  ASSERT_EQ(f.status, 0) << f.err;
  EXPECT_NE(f.err.find("outcome=forced"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("forced_over=\"1 keys under prefix"), std::string::npos) << f.err;
  EXPECT_NE(record("trusted_forced").find("1 keys under prefix 'jobguard:'"), std::string::npos);
  EXPECT_EQ(record("trusted_why"), "holder host decommissioned");
  auto ok = run_jobguard({"--redis", url(), "run", "--key", "invoice:2", "--", "true"}, 30s);
  EXPECT_EQ(ok.status, 0) << ok.err;
}

TEST_F(ServerTrust, OtherKeyPrefixesAreJudgedByTheirOwnPrefix) {
  admin("SET billing:lock:{x} someone");
  auto r = run_jobguard({"--redis", url(), "server", "trust", "--key-prefix", "billing"}, 30s);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("1 keys under prefix 'billing:'"), std::string::npos) << r.err;
  auto bad = run_jobguard({"--redis", url(), "server", "trust", "--key-prefix", "a{b"}, 30s);
  EXPECT_EQ(bad.status, 64) << bad.err;
  EXPECT_EQ(lines(bad.err), 1u) << bad.err;
  EXPECT_NE(bad.err.find("key prefix"), std::string::npos) << bad.err;
}

TEST_F(ServerTrust, ARecordOfAnotherServerProcessIsRefusedAndItsQuarantineGetsNoTrustHint) {
  // What a restart leaves when the record survived in a snapshot: the gate
  // quarantines it, and the message must not suggest trusting it.
  admin("HSET jobguard:epoch run_id 0123456789abcdef0123456789abcdef01234567 evicted 0 until 0 id old.1.2 reason x");
  auto r = run_jobguard({"--redis", url(), "server", "trust"}, 30s);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("a lock-state record written by another server process (run_id 01234567"), std::string::npos)
      << r.err;

  auto run = run_jobguard({"--redis", url(), "run", "--key", "k", "--", "true"}, 30s);
  EXPECT_EQ(run.status, 69) << run.err;
  EXPECT_NE(run.err.find("a different server process"), std::string::npos) << run.err;
  EXPECT_EQ(run.err.find("server trust"), std::string::npos) << run.err;

  // The run's check rewrote the record for this process, with the restart's
  // quarantine in it: still a sign.
  auto after = run_jobguard({"--redis", url(), "server", "trust"}, 30s);
  EXPECT_EQ(after.status, 1) << after.err;
  EXPECT_NE(after.err.find("a lock-state quarantine of this server process (a different server process"),
            std::string::npos)
      << after.err;
}

TEST_F(ServerTrust, FlushallInTheCommandStatsIsASign) {
  admin("FLUSHALL");
  auto r = run_jobguard({"--redis", url(), "--json", "server", "trust"}, 30s);
  EXPECT_EQ(r.status, 1) << r.err;
  const auto j = json::parse(r.out);
  EXPECT_TRUE(j.at("refused").get<bool>());
  EXPECT_EQ(j["servers"][0].at("outcome"), "refused");
  EXPECT_EQ(j["servers"][0].at("signs").dump(), R"x(["FLUSHALL ran 1 times (INFO commandstats)"])x");
}

TEST_F(ServerTrust, AReplicaIsAUsageErrorAndAnUnreachableServerIs69) {
  admin("REPLICAOF 127.0.0.1 1");
  auto r = run_jobguard({"--redis", url(), "server", "trust"}, 30s);
  EXPECT_EQ(r.status, 64) << r.err;
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("is a slave: only a primary can be trusted as new"), std::string::npos) << r.err;
  admin("REPLICAOF NO ONE");

  auto down = run_jobguard({"--redis", "redis://127.0.0.1:1/0?connect_timeout=200ms", "server", "trust"}, 30s);
  EXPECT_EQ(down.status, 69) << down.err;
  EXPECT_NE(down.err.find("cannot reach Redis"), std::string::npos) << down.err;
}

// `run`, a short `bench` and `serve` against a deployment created a moment
// earlier, after `server trust`: no quarantine anywhere.
void run_bench_and_serve(const std::string& url) {
  const auto marker = (std::filesystem::temp_directory_path() / fmt::format("jobguard-trust-{}-ran", ::getpid())).string();
  std::filesystem::remove(marker);
  auto run = run_jobguard({"--redis", url, "run", "--key", "invoice:48291", "--ttl", "30s", "--fence", "--", "touch",
                           marker},
                          30s);
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_TRUE(std::filesystem::exists(marker));
  std::filesystem::remove(marker);

  auto bench = run_jobguard({"--redis", url, "--json", "bench", "--workers", "4", "--seconds", "0.3", "--rounds", "1"},
                            120s);
  ASSERT_EQ(bench.status, 0) << bench.err;
  const auto b = json::parse(bench.out);
  EXPECT_GT(b["lock"]["ops_per_s"].get<double>(), 0) << bench.out;
  EXPECT_EQ(b["lock"]["errors"].get<std::uint64_t>(), 0u) << bench.out;

  // serve lists a lock a `run` holds while it is asked.
  Subprocess holder({jobguard_binary(), "--redis", url, "run", "--key", "held:1", "--ttl", "30s", "--", "sleep", "20"});
  Subprocess serve({jobguard_binary(), "--json", "--redis", url, "serve", "--listen", "127.0.0.1:0"});
  ASSERT_TRUE(eventually([&] { return serve.out().find('\n') != std::string::npos; }, 10s)) << serve.err();
  const auto port = json::parse(serve.out().substr(0, serve.out().find('\n'))).at("port").get<std::uint16_t>();
  auto get = [&](const std::string& target) {
    TcpConn c(port, 5s);
    c.send_all("GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    return parse_http_response(c.read_to_eof(10s));
  };
  EXPECT_EQ(get("/healthz").status, 200);
  EXPECT_TRUE(eventually(
      [&] {
        const auto r = get("/api/locks");
        return r.status == 200 && r.body.find("held:1") != std::string::npos;
      },
      15s))
      << "serve never listed the lock `run` holds; run: " << holder.err();
  holder.signal(SIGTERM);
  holder.wait_or_kill(10s);
  serve.signal(SIGTERM);
  const auto s = serve.wait_or_kill(10s);
  EXPECT_EQ(s.status, 0) << s.err;
}

TEST(ServerTrustCluster, AClusterCreatedAMomentAgoIsTrustedOnEveryPrimaryThenRunBenchServeWork) {
  ClusterRedis cluster(3, 0);
  cluster.start();
  auto refused = run_jobguard({"--redis", cluster.url(), "run", "--key", "k", "--", "true"}, 30s);
  EXPECT_EQ(refused.status, 69) << refused.err;
  EXPECT_EQ(lines(refused.err), 1u) << refused.err;
  EXPECT_NE(refused.err.find("`jobguard server trust --redis " + cluster.url() + "`"), std::string::npos)
      << refused.err;

  auto t = run_jobguard({"--redis", cluster.url(), "server", "trust", "--reason", "new cluster"}, 60s);
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_EQ(lines(t.out), 3u) << t.out;
  EXPECT_EQ(lines(t.err), 3u) << "one audit line per primary: " << t.err;
  run_bench_and_serve(cluster.url());

  auto again = run_jobguard({"--redis", cluster.url(), "--json", "server", "trust"}, 60s);
  ASSERT_EQ(again.status, 0) << again.err;  // every record already says intact
  // Named: a range-for over .at() of a temporary would read it after it is gone.
  const auto report = json::parse(again.out);
  for (const auto& s : report.at("servers")) EXPECT_EQ(s.at("outcome"), "already") << again.out;
}

TEST(ServerTrustCluster, OneShardWithSignsRefusesEveryShard) {
  ClusterRedis cluster(3, 0);
  cluster.start();
  // A sign on one primary only: a FLUSHALL in its command stats.
  cluster.on(cluster.primary_of(0), "FLUSHALL");
  auto r = run_jobguard({"--redis", cluster.url(), "--json", "server", "trust"}, 60s);
  EXPECT_EQ(r.status, 1) << r.err;
  const auto j = json::parse(r.out);
  ASSERT_EQ(j.at("servers").size(), 3u) << r.out;
  int with_signs = 0;
  for (const auto& s : j["servers"]) {
    EXPECT_EQ(s.at("outcome"), "refused") << r.out;
    with_signs += s.at("signs").empty() ? 0 : 1;
  }
  EXPECT_EQ(with_signs, 1) << r.out;
  for (std::size_t i = 0; i < cluster.size(); ++i)
    EXPECT_EQ(cluster.on(cluster.node(i).port(), "DBSIZE"), "0") << "a refusal writes no shard's record";
}

TEST(ServerTrustSentinel, ASentinelManagedPrimaryCreatedAMomentAgoIsTrustedThenRunBenchServeWork) {
  SentinelRedis dep(1, 3);
  dep.down_after(30s);  // nothing here fails over: a starved primary must not be
  dep.start();
  auto refused = run_jobguard({"--redis", dep.url(), "run", "--key", "k", "--", "true"}, 30s);
  EXPECT_EQ(refused.status, 69) << refused.err;
  EXPECT_NE(refused.err.find("`jobguard server trust --redis " + dep.url() + "/0`"), std::string::npos) << refused.err;

  auto t = run_jobguard({"--redis", dep.url(), "server", "trust", "--reason", "new sentinel set"}, 60s);
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.out.find(fmt::format("trusted 127.0.0.1:{} as new", dep.primary_port())), std::string::npos) << t.out;
  run_bench_and_serve(dep.url());
}

}  // namespace
}  // namespace jobguard::test
