// `jobguard bench --contention` as users run it: the real binary, a real
// redis-server per test. No assertion about speed: the machine is shared.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "support/redis_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;

class BenchCli : public RedisTest {
 protected:
  std::string url() const { return fmt::format("redis://{}:{}/0", server->host(), server->port()); }

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
