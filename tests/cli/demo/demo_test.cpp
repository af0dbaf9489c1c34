// `jobguard demo` as a user runs it: the real binary, which starts its own
// redis-server and PostgreSQL unless told otherwise. What it must leave
// behind is nothing: no server process, no temporary directory, also when it
// is stopped by a signal halfway.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "support/postgres_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;

// Small enough to finish in seconds, large enough for every fault to land.
const std::vector<std::string> kSmall = {"--subscriptions", "2000", "--workers", "4"};

std::vector<std::string> demo_args(std::vector<std::string> head, const std::vector<std::string>& tail = kSmall) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

// The embedded PostgreSQL's temporary directory, as the demo announced it.
std::string announced_dir(const std::string& err) {
  std::smatch m;
  if (!std::regex_search(err, m, std::regex(R"(starting a private PostgreSQL .*\(initdb in (\S+)\))"))) return "";
  return m[1];
}

void expect_nothing_left(const std::string& dir) {
  ASSERT_FALSE(dir.empty());
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir << " was left behind";
  // The postmaster runs with -D <dir>/data; its backends are its children
  // and die with it. A child that lingers in /proc unreaped does not match.
  EXPECT_EQ(processes_naming(dir), std::vector<std::string>{}) << "a server of " << dir << " is still running";
}

TEST(DemoCli, ByDefaultTheCompletionRecordsAreInAPrivatePostgresThatIsGoneAfterwards) {
  auto r = run_jobguard(demo_args({"demo"}), 180s);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const std::string dir = announced_dir(r.err);
  ASSERT_FALSE(dir.empty()) << "the demo did not say it started a PostgreSQL: " << r.err;
  EXPECT_NE(r.out.find("completion records in PostgreSQL (a private server the demo started on 127.0.0.1:"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("stand-in"), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(double charges\s+0\s+[1-9])"))) << r.out;
  expect_nothing_left(dir);
}

TEST(DemoCli, JsonNamesTheEmbeddedPostgresAndTheGuardedRunIsExact) {
  auto r = run_jobguard(demo_args({"--json", "demo"}), 180s);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["completion_store"], "postgres");
  EXPECT_EQ(j["postgres"], "embedded");
  EXPECT_EQ(j["guarded"]["double_charges"].get<int>(), 0);
  EXPECT_EQ(j["guarded"]["missing"].get<int>(), 0);
  EXPECT_GT(j["naive"]["double_charges"].get<int>(), 0);
  expect_nothing_left(announced_dir(r.err));
}

TEST(DemoCli, TheStandInIsThereWhenAskedFor) {
  auto r = run_jobguard(demo_args({"--json", "demo", "--completions", "memory"}), 180s);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["completion_store"], "memory");
  EXPECT_EQ(j["postgres"], "none");
  EXPECT_EQ(j["guarded"]["double_charges"].get<int>(), 0);
  EXPECT_EQ(announced_dir(r.err), "") << "started a PostgreSQL it does not use: " << r.err;

  auto human = run_jobguard(demo_args({"demo", "--completions", "memory"}), 180s);
  ASSERT_EQ(human.status, 0) << human.out << human.err;
  EXPECT_NE(human.out.find("completion records in an in-process stand-in for PostgreSQL (--completions memory"),
            std::string::npos)
      << human.out;
}

TEST(DemoCli, AGivenPostgresIsUsedAndNoneIsStarted) {
  auto r = run_jobguard(demo_args({"--json", "--postgres", shared_postgres().url(), "demo"}), 180s);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["completion_store"], "postgres");
  EXPECT_EQ(j["postgres"], "given");
  EXPECT_EQ(j["guarded"]["double_charges"].get<int>(), 0);
  EXPECT_EQ(announced_dir(r.err), "") << r.err;
}

TEST(DemoCli, BadCompletionsValuesAreUsageErrors) {
  auto r = run_jobguard({"demo", "--completions", "sqlite"});
  EXPECT_EQ(r.status, 64) << r.out << r.err;
  EXPECT_NE(r.err.find("--completions"), std::string::npos) << r.err;
  EXPECT_EQ(announced_dir(r.err), "") << r.err;

  auto both = run_jobguard({"--postgres", "postgresql://postgres@127.0.0.1:1/postgres", "demo", "--completions", "memory"});
  EXPECT_EQ(both.status, 64) << both.out << both.err;
  EXPECT_NE(both.err.find("--completions memory and --postgres exclude each other"), std::string::npos) << both.err;
}

// Stopped halfway by SIGINT (Ctrl-C) or SIGTERM (a supervisor), the demo
// still stops both servers and removes their directories, and exits as the
// signal would have.
class DemoSignal : public ::testing::TestWithParam<int> {};

TEST_P(DemoSignal, InterruptedTheDemoLeavesNoServerAndNoDirectory) {
  const int sig = GetParam();
  // Long enough that the signal lands mid-run.
  Subprocess p({jobguard_binary(), "demo", "--subscriptions", "200000", "--workers", "2", "--scale", "0.05"});
  std::string dir;
  const auto until = std::chrono::steady_clock::now() + 60s;
  // Mid-run: the PostgreSQL is up (its postmaster.pid exists) and the runs
  // have begun (the demo has migrated its completion table).
  while (std::chrono::steady_clock::now() < until && p.running()) {
    dir = announced_dir(p.err());
    if (!dir.empty() && std::filesystem::exists(dir + "/data/postmaster.pid") &&
        !processes_naming(dir).empty())
      break;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_FALSE(dir.empty()) << p.err();
  ASSERT_TRUE(p.running()) << p.err();
  std::this_thread::sleep_for(1s);
  ASSERT_TRUE(p.running()) << p.err();
  p.signal(sig);
  auto r = p.wait_or_kill(60s);
  EXPECT_EQ(r.status, 128 + sig) << r.out << r.err;
  EXPECT_NE(r.err.find("interrupted; stopping and removing the embedded servers"), std::string::npos) << r.err;
  expect_nothing_left(dir);
}

INSTANTIATE_TEST_SUITE_P(Signals, DemoSignal, ::testing::Values(SIGINT, SIGTERM),
                         [](const ::testing::TestParamInfo<int>& p) { return p.param == SIGINT ? "SIGINT" : "SIGTERM"; });

}  // namespace
}  // namespace jobguard::test
