// `jobguard bench --contention` as users run it: the real binary, a real
// redis-server per test. No assertion about speed: the machine is shared.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "jobguard/redis/client.hpp"
#include "jobguard/testing/embedded_redis.hpp"
#include "support/cli_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;

class BenchCli : public CliTest {
 protected:

  nlohmann::json contention(std::vector<std::string> flags) {
    std::vector<std::string> args{"--redis", url(), "--json", "bench", "--contention", "--seconds", "1"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = run_jobguard(args, 60s);
    EXPECT_EQ(r.status, 0) << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.out;
    return j;
  }

  static void expect_every_worker_served(const nlohmann::json& j, int workers) {
    ASSERT_TRUE(j.contains("contention")) << j.dump();
    const auto& c = j["contention"];
    for (const char* k : {"workers", "fair", "cs_per_s", "shares", "max_share_deviation_pct", "handoff_p50_us",
                          "handoff_p99_us", "wait_p99_ms", "wait_max_ms", "self_handoff_pct"})
      EXPECT_TRUE(c.contains(k)) << "missing contention." << k << " in " << c.dump();
    EXPECT_EQ(c["workers"].get<int>(), workers);
    ASSERT_EQ(c["shares"].size(), static_cast<std::size_t>(workers));
    ASSERT_EQ(c["counts"].size(), static_cast<std::size_t>(workers));
    double sum = 0;
    for (const auto& s : c["shares"]) sum += s.get<double>();
    EXPECT_NEAR(sum, 1.0, 0.01);
    for (std::size_t i = 0; i < c["counts"].size(); ++i)
      EXPECT_GE(c["counts"][i].get<std::uint64_t>(), 1u) << "worker " << i << " never got the lock: " << c.dump();
    EXPECT_GT(c["cs_per_s"].get<double>(), 0);
    EXPECT_GE(c["self_handoff_pct"].get<double>(), 0);
    EXPECT_LE(c["self_handoff_pct"].get<double>(), 100);
    EXPECT_LE(c["handoff_p50_us"].get<double>(), c["handoff_p99_us"].get<double>());
    EXPECT_LE(c["wait_p99_ms"].get<double>(), c["wait_max_ms"].get<double>());
    EXPECT_EQ(c["overlaps"].get<std::uint64_t>(), 0u) << "two holders at once";
    EXPECT_EQ(c["errors"].get<std::uint64_t>(), 0u);
  }
};

TEST_F(BenchCli, ThroughputJsonHasRawLockRatioAndTheAlternatingRounds) {
  auto r = run_jobguard({"--redis", url(), "--json", "bench", "--workers", "4", "--seconds", "0.2", "--rounds", "3",
                         "--connections", "2"},
                        60s);
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  for (const char* half : {"raw", "raw_pair", "lock"}) {
    ASSERT_TRUE(j.contains(half)) << j.dump();
    for (const char* k : {"ops_per_s", "p50_us", "p99_us", "errors"})
      EXPECT_TRUE(j[half].contains(k)) << half << "." << k << " missing: " << j.dump();
    EXPECT_GT(j[half]["ops_per_s"].get<double>(), 0) << half;
    EXPECT_EQ(j[half]["errors"].get<std::uint64_t>(), 0u) << half;
    EXPECT_LE(j[half]["p50_us"].get<double>(), j[half]["p99_us"].get<double>()) << half;
  }
  EXPECT_EQ(j["connections"].get<int>(), 2);
  ASSERT_EQ(j["rounds"].size(), 3u);
  std::vector<double> ratios;
  for (const auto& round : j["rounds"]) ratios.push_back(round["ratio"].get<double>());
  std::sort(ratios.begin(), ratios.end());
  EXPECT_DOUBLE_EQ(j["ratio"].get<double>(), ratios[1]) << "the ratio is the median round's";
  // The server's own CPU per phase (INFO cpu): ops per server CPU-second,
  // the lock's the median of its rounds.
  EXPECT_EQ(j["server_nodes"].get<int>(), 1);
  for (const char* half : {"raw_pair", "lock"}) {
    EXPECT_GT(j[half]["server_cpu_s"].get<double>(), 0) << half;
    EXPECT_NEAR(j[half]["ops_per_server_cpu_s"].get<double>(),
                j[half]["ops"].get<double>() / j[half]["server_cpu_s"].get<double>(), 1e-6 * j[half]["ops"].get<double>())
        << half;
  }
  std::vector<double> per_cpu;
  for (const auto& round : j["rounds"]) per_cpu.push_back(round["lock_ops_per_server_cpu_s"].get<double>());
  std::sort(per_cpu.begin(), per_cpu.end());
  EXPECT_DOUBLE_EQ(j["lock_ops_per_server_cpu_s"].get<double>(), per_cpu[1]);
}

TEST_F(BenchCli, BadRoundsIsAUsageError) {
  auto r = run_jobguard({"--redis", url(), "bench", "--rounds", "0"}, 30s);
  EXPECT_EQ(r.status, 64);
  EXPECT_NE(r.err.find("--rounds"), std::string::npos) << r.err;
}

// A cluster node that serves no slot (never created) answers the bench's
// script load with CLUSTERDOWN: one line and exit 69, not an abort from a
// loop thread left running when the setup threw (it did, rc 134).
TEST_F(BenchCli, AClusterThatServesNoSlotIsOneLineAndUnavailable) {
  EmbeddedRedisOptions o;
  o.extra_args = {"--cluster-enabled", "yes", "--cluster-port", std::to_string(pick_free_port())};
  EmbeddedRedis node(o);
  node.start();
  const std::string u = fmt::format("redis://127.0.0.1:{}/0?cluster=yes", node.port());
  auto r = run_jobguard({"--redis", u, "--json", "bench", "--workers", "4", "--seconds", "0.2", "--rounds", "1"}, 60s);
  EXPECT_EQ(r.status, 69) << r.err;
  EXPECT_NE(r.err.find("CLUSTERDOWN"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST_F(BenchCli, FairContentionServesEveryWorkerAndReportsTheShape) {
  auto j = contention({"--fair"});
  expect_every_worker_served(j, 8);
  EXPECT_TRUE(j["contention"]["fair"].get<bool>());
}

TEST_F(BenchCli, ContentionTakesWorkersAndHold) {
  auto j = contention({"--fair", "--workers", "3", "--hold", "2ms"});
  expect_every_worker_served(j, 3);
  EXPECT_EQ(j["contention"]["hold_us"].get<int>(), 2000);
}

TEST_F(BenchCli, ContentionFlagsWithoutContentionAreAUsageError) {
  auto r = run_jobguard({"--redis", url(), "bench", "--fair"}, 30s);
  EXPECT_EQ(r.status, 64) << r.err;
  EXPECT_NE(r.err.find("--contention"), std::string::npos) << r.err;
}

TEST_F(BenchCli, BadHoldIsAUsageErrorNamingTheOption) {
  auto r = run_jobguard({"--redis", url(), "bench", "--contention", "--hold", "3x"}, 30s);
  EXPECT_EQ(r.status, 64) << r.err;
  EXPECT_NE(r.err.find("--hold"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace jobguard::test

namespace jobguard::test {
namespace {

TEST_F(BenchCli, JobsJsonHasTheGuardedAndBareRunsAtEachConcurrency) {
  auto r = run_jobguard({"--redis", url(), "--json", "bench", "--jobs", "300", "--concurrency", "1,8"}, 120s);
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  for (const char* run : {"guarded", "bare"}) {
    ASSERT_TRUE(j.contains(run)) << j.dump();
    EXPECT_GT(j[run]["jobs_per_s"].get<double>(), 0) << run;
    EXPECT_EQ(j[run]["concurrency"].get<int>(), 8) << run << ": the last concurrency is the headline";
    EXPECT_EQ(j[run]["jobs"].get<int>(), 300) << run;
    EXPECT_LE(j[run]["enqueue_to_ack_p50_ms"].get<double>(), j[run]["enqueue_to_ack_p99_ms"].get<double>()) << run;
    // The server's CPU during the phase, and per job.
    const double server_s = j[run]["server_cpu_s"].get<double>();
    EXPECT_GE(server_s, 0) << run;
    EXPECT_NEAR(j[run]["server_us_per_job"].get<double>(), server_s * 1e6 / 300, 1e-6) << run;
    // And this process's, the client's.
    const double client_s = j[run]["client_cpu_s"].get<double>();
    EXPECT_GE(client_s, 0) << run;
    EXPECT_NEAR(j[run]["client_us_per_job"].get<double>(), client_s * 1e6 / 300, 1e-6) << run;
  }
  // 300 guarded jobs cost the server and the client tens of milliseconds:
  // more than the kernel's accounting tick, so never zero.
  EXPECT_GT(j["guarded"]["server_cpu_s"].get<double>(), 0);
  EXPECT_GT(j["guarded"]["client_cpu_s"].get<double>(), 0);
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["concurrency"].get<int>(), 1);
  // Every guarded job was acknowledged: none errored, none left behind.
  for (const auto& run : j["runs"]) EXPECT_EQ(run["errors"].get<std::int64_t>(), 0) << run.dump();
  EXPECT_GT(j["guarded_over_bare"].get<double>(), 0);
}

// --unique: the guarded jobs go in as unique jobs, and every unique lock is
// released by its job's ack (none left for a reaper); without --jobs it is
// a usage error.
TEST_F(BenchCli, JobsUniqueAcksEveryJobAndLeavesNoUniqueLock) {
  auto r = run_jobguard({"--redis", url(), "--json", "bench", "--jobs", "200", "--concurrency", "8", "--unique"}, 120s);
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_TRUE(j["unique"].get<bool>());
  EXPECT_EQ(j["guarded"]["jobs"].get<int>(), 200);
  EXPECT_EQ(j["guarded"]["errors"].get<std::int64_t>(), 0);
  auto client = make_client();
  EXPECT_EQ(client->exec(redis::Command{"EVAL", "return #redis.call('keys', '*unique*')", "0"}).integer, 0)
      << "unique locks left behind";
  const auto bad = run_jobguard({"--redis", url(), "bench", "--unique"}, 30s);
  EXPECT_EQ(bad.status, 64) << bad.err;
  EXPECT_NE(bad.err.find("--unique goes with --jobs M"), std::string::npos) << bad.err;
}

// --rate: the limiter's cost runs (each kind twice) ack every job, and the
// pace run starts the whole periods' jobs, never more than the limit in one
// period (plus slack: a start is taken when the effect begins, a claim's
// round trip after the limit let it go). Bad spellings are usage errors.
TEST_F(BenchCli, JobsRateAcksEveryJobAndKeepsThePace) {
  auto r = run_jobguard(
      {"--redis", url(), "--json", "bench", "--jobs", "100", "--concurrency", "8", "--rate", "20/s", "--seconds", "1"},
      120s);
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["overhead"].size(), 1u) << j.dump();
  const auto& o = j["overhead"][0];
  EXPECT_EQ(o["concurrency"].get<int>(), 8);
  for (const char* kind : {"unlimited", "limited", "limited_per_key"}) {
    EXPECT_EQ(o[kind]["jobs"].get<int>(), 200) << kind << ": two runs of 100";
    EXPECT_EQ(o[kind]["errors"].get<std::int64_t>(), 0) << kind;
    EXPECT_GT(o[kind]["jobs_per_s"].get<double>(), 0) << kind;
  }
  EXPECT_EQ(o["unlimited"]["rate_limited"].get<std::int64_t>(), 0);
  const auto& a = j["accuracy"];
  EXPECT_EQ(a["starts"].get<int>(), 21) << "20/s over one whole period: 20 x 1 + 1";
  EXPECT_EQ(a["run"]["jobs"].get<int>(), 21);
  EXPECT_EQ(a["run"]["errors"].get<std::int64_t>(), 0);
  EXPECT_GT(a["run"]["rate_limited"].get<std::int64_t>(), 0) << "a backlog under 20/s never waited";
  EXPECT_LE(a["peak_in_period"].get<int>(), 24) << a.dump();
  EXPECT_GT(a["achieved_per_s"].get<double>(), 0);
  EXPECT_EQ(j["rate"].get<std::string>(), "20/s");
  for (const auto& [flags, words] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--rate", "5/s"}, "--rate goes with --jobs M"},
           {{"--jobs", "10", "--unique", "--rate", "5/s"}, "--rate goes with --jobs M, without --unique"},
           {{"--jobs", "10", "--rate", "0/s"}, "--rate: rate \"0/s\": the count must be at least 1"}}) {
    std::vector<std::string> args{"--redis", "redis://127.0.0.1:1/0", "bench"};
    args.insert(args.end(), flags.begin(), flags.end());
    const auto bad = run_jobguard(args, 30s);
    EXPECT_EQ(bad.status, 64) << bad.err;
    EXPECT_NE(bad.err.find(words), std::string::npos) << bad.err;
  }
}

TEST_F(BenchCli, LeasesHoldsThemAllRenewedAndReportsCpu) {
  // TTL 30 s: renewals every ~10 s, so a 1 s hold may renew none; what must
  // hold is that none is lost and the numbers are there.
  auto r = run_jobguard({"--redis", url(), "--json", "bench", "--leases", "500", "--seconds", "1"}, 120s);
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["leases"].get<int>(), 500);
  EXPECT_EQ(j["lost"].get<std::uint64_t>(), 0u);
  EXPECT_GE(j["client_cpu_pct"].get<double>(), 0);
  EXPECT_GE(j["server_cpu_pct"].get<double>(), 0);
  EXPECT_GE(j["seconds"].get<double>(), 1.0);
  // Released at the end: no lease key is left.
  auto client = make_client();
  EXPECT_EQ(client->exec(redis::Command{"EVAL", "return #redis.call('keys', 'bench:*')", "0"}).integer, 0);
}

TEST_F(BenchCli, JobsLeasesAndContentionAreSeparateBenchmarks) {
  for (const std::vector<std::string>& flags : {std::vector<std::string>{"--jobs", "10", "--leases", "10"},
                                                std::vector<std::string>{"--jobs", "10", "--contention"},
                                                std::vector<std::string>{"--jobs", "10", "--concurrency", "0"}}) {
    std::vector<std::string> args{"--redis", url(), "bench"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = run_jobguard(args, 30s);
    EXPECT_EQ(r.status, 64) << r.err;
  }
}

TEST_F(BenchCli, PermitsMeasuresOneSemaphoreAndRefusesBadCounts) {
  auto r = run_jobguard({"--redis", url(), "--json", "bench", "--permits", "4", "--workers", "8", "--seconds", "0.5"},
                        60s);
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["permits"]["permits"].get<int>(), 4);
  EXPECT_EQ(j["permits"]["workers"].get<int>(), 8);
  EXPECT_GT(j["permits"]["ops"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(j["permits"]["errors"].get<std::uint64_t>(), 0u);
  // Every permit was given back.
  auto client = make_client();
  EXPECT_EQ(client->exec(redis::Command{"EXISTS", "jobguard:sem:{bench:semaphore}"}).integer, 0);
  for (const std::vector<std::string>& flags : {std::vector<std::string>{"--permits", "0"},
                                                std::vector<std::string>{"--permits", "2", "--contention"},
                                                std::vector<std::string>{"--permits", "2", "--fair"}}) {
    std::vector<std::string> args{"--redis", url(), "bench"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto bad = run_jobguard(args, 30s);
    EXPECT_EQ(bad.status, 64) << bad.err;
  }
}

TEST_F(BenchCli, SharedMeasuresReadPairsAgainstMutexPairs) {
  auto r = run_jobguard({"--redis", url(), "--json", "bench", "--shared", "--workers", "4", "--seconds", "0.6",
                         "--rounds", "2"},
                        60s);
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  const auto& s = j["shared"];
  EXPECT_EQ(s["workers"].get<int>(), 4);
  EXPECT_EQ(s["rounds"].size(), 2u);
  EXPECT_GT(s["read_pairs_per_s"].get<double>(), 0.0);
  EXPECT_GT(s["mutex_pairs_per_s"].get<double>(), 0.0);
  EXPECT_GT(s["ratio"].get<double>(), 0.0);
  EXPECT_EQ(s["errors"].get<std::uint64_t>(), 0u);
  // Every reader was let go.
  auto client = make_client();
  EXPECT_EQ(client->exec(redis::Command{"EXISTS", "jobguard:rwr:{bench:rwlock}"}).integer, 0);
  for (const std::vector<std::string>& flags : {std::vector<std::string>{"--shared", "--permits", "2"},
                                                std::vector<std::string>{"--shared", "--contention"},
                                                std::vector<std::string>{"--shared", "--fair"}}) {
    std::vector<std::string> args{"--redis", url(), "bench"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto bad = run_jobguard(args, 30s);
    EXPECT_EQ(bad.status, 64) << bad.err;
    EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  }
}

}  // namespace
}  // namespace jobguard::test
