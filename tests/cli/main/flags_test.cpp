// The flags every subcommand shares, checked over every subcommand at the
// real binary: --help ends with the subcommand's own exit statuses, the key
// prefix is spelled --key-prefix, --json is honoured (JSON on stdout) or
// refused (one line, exit 64), and $JOBGUARD_REDIS_URL / $JOBGUARD_POSTGRES_URL
// are what a subcommand connects to when no flag names a server.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "jobguard/lock.hpp"
#include "support/cli_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;
using Env = std::vector<std::pair<std::string, std::string>>;

std::string joined(const Args& a) {
  std::string s;
  for (const auto& w : a) s += (s.empty() ? "" : " ") + w;
  return s;
}

// The subcommand names a --help text lists under "Subcommands:".
Args subcommands_in(const std::string& help) {
  Args out;
  const auto at = help.find("\nSubcommands:\n");
  if (at == std::string::npos) return out;
  std::istringstream in(help.substr(at + 14));
  std::string line;
  while (std::getline(in, line) && line.rfind("  ", 0) == 0) {
    std::istringstream words(line);
    std::string name;
    words >> name;
    out.push_back(name);
  }
  return out;
}

// Every subcommand path, groups and leaves, found by walking the --help texts
// (a new subcommand is covered without being listed here).
std::vector<Args> every_subcommand() {
  std::vector<Args> paths, todo{{}};
  while (!todo.empty()) {
    Args path = todo.back();
    todo.pop_back();
    Args argv = path;
    argv.push_back("--help");
    const auto r = run_jobguard(argv);
    EXPECT_EQ(r.status, 0) << joined(argv) << "\n" << r.err;
    for (const auto& name : subcommands_in(r.out)) {
      Args child = path;
      child.push_back(name);
      paths.push_back(child);
      todo.push_back(child);
    }
  }
  return paths;
}

TEST(CliFlags, EveryHelpEndsWithItsOwnExitStatuses) {
  const auto paths = every_subcommand();
  // The walk found the tree: a sample of groups and leaves at each depth.
  for (const Args& want : std::vector<Args>{{"run"}, {"jobs", "work"}, {"locks", "ls"}, {"pg", "migrate"},
                                            {"policy", "doc"}, {"server", "trust"}, {"bench"}, {"serve"}})
    EXPECT_NE(std::find(paths.begin(), paths.end(), want), paths.end()) << joined(want);
  EXPECT_GE(paths.size(), 22u);
  for (const auto& path : paths) {
    Args argv = path;
    argv.push_back("--help");
    const auto r = run_jobguard(argv);
    ASSERT_EQ(r.status, 0) << joined(argv);
    EXPECT_NE(r.out.find("Exit status:"), std::string::npos) << joined(argv) << ":\n" << r.out;
    // The root's summary points to the subcommands' own: it is not one.
    EXPECT_EQ(r.out.find("each subcommand's --help says which it uses"), std::string::npos) << joined(argv);
    // And the statuses any subcommand may exit with.
    EXPECT_NE(r.out.find("Any subcommand: 64 usage"), std::string::npos) << joined(argv);
  }
}

TEST(CliFlags, TheKeyPrefixIsSpelledKeyPrefixEverywhere) {
  const std::vector<Args> with_prefix{{"stats"},         {"serve"},         {"doctor"},         {"server", "trust"},
                                      {"locks"},         {"locks", "ls"},   {"locks", "show"},  {"locks", "release"},
                                      {"locks", "audit"}, {"policy", "lint"}};
  for (const auto& path : every_subcommand()) {
    Args argv = path;
    argv.push_back("--help");
    const auto r = run_jobguard(argv);
    // No other spelling is taught: --prefix is an old, hidden alias.
    EXPECT_EQ(r.out.find("--prefix"), std::string::npos) << joined(argv) << ":\n" << r.out;
    const bool uses = std::find(with_prefix.begin(), with_prefix.end(), path) != with_prefix.end();
    if (uses) {
      EXPECT_NE(r.out.find("--key-prefix TEXT=jobguard"), std::string::npos) << joined(argv) << ":\n" << r.out;
    }
  }
}

// One row: the subcommand and its arguments (no --redis, no --json: the test
// adds them), and the statuses it may end with.
struct Row {
  Args args;
  bool honours_json = true;
  std::vector<int> ok{0};
};

class CliFlagsLive : public CliTest {
 protected:
  std::string catalog() const { return std::string(JOBGUARD_SOURCE_DIR) + "/docs/catalog.example.yaml"; }

  std::vector<Row> rows() const {
    return {
        {{"run", "--key", "flags:k", "--", "true"}, false},
        {{"jobs", "add", "--stream", "flags:s", "id=1"}},
        {{"jobs", "ls", "--stream", "flags:s"}},
        {{"jobs", "dead", "--stream", "flags:s"}},
        {{"jobs", "retry", "--stream", "flags:s", "--all"}},
        {{"jobs", "work", "--stream", "flags:s", "--class", "flags", "--max-jobs", "1", "--exit-when-idle", "2s",
          "--", "true"}},
        {{"bench", "--workers", "2", "--seconds", "0.1", "--rounds", "1"}},
        {{"stats"}},
        {{"locks", "ls"}},
        {{"locks", "show", "flags:k"}},
        {{"locks", "release", "flags:k", "--reason", "flags test"}},
        {{"locks", "audit"}},
        {{"doctor"}, true, {0, 1, 2}},
        {{"policy", "lint", catalog()}},
        {{"policy", "doc", catalog()}, false},
        // Keys exist by now: refused (1), still reported as JSON.
        {{"server", "trust", "--reason", "flags test"}, true, {0, 1}},
    };
  }
};

// Every row runs with the server named by $JOBGUARD_REDIS_URL alone: a
// subcommand that read anything else would find no server there.
TEST_F(CliFlagsLive, JsonIsHonouredOrRefusedAndTheEnvironmentUrlIsUsed) {
  const Env env{{"JOBGUARD_REDIS_URL", url()}};
  for (const auto& row : rows()) {
    Args argv{"--json"};
    argv.insert(argv.end(), row.args.begin(), row.args.end());
    const auto r = run_jobguard(argv, 60s, env);
    const std::string what = joined(argv) + "\nstdout: " + r.out + "\nstderr: " + r.err;
    if (!row.honours_json) {
      EXPECT_EQ(r.status, 64) << what;
      EXPECT_EQ(r.out, "") << what;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << what;
      EXPECT_NE(r.err.find("--json: "), std::string::npos) << what;
      continue;
    }
    EXPECT_NE(std::find(row.ok.begin(), row.ok.end(), r.status), row.ok.end()) << what;
    ASSERT_FALSE(r.out.empty()) << what;
    EXPECT_FALSE(nlohmann::json::parse(r.out, nullptr, false).is_discarded()) << what;
  }
}

TEST_F(CliFlagsLive, ServeHonoursJsonAndReadsTheEnvironmentUrl) {
  Subprocess serve({jobguard_binary(), "--json", "serve", "--listen", "127.0.0.1:0"}, {{"JOBGUARD_REDIS_URL", url()}});
  for (int i = 0; i < 200 && serve.out().find('\n') == std::string::npos && serve.running(); ++i)
    std::this_thread::sleep_for(50ms);
  const auto line = serve.out().substr(0, serve.out().find('\n'));
  const auto j = nlohmann::json::parse(line, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << serve.out() << serve.err();
  EXPECT_TRUE(j.contains("listening")) << line;
  serve.signal(SIGTERM);
  EXPECT_EQ(serve.wait_or_kill(10s).status, 0) << serve.err();
}

TEST_F(CliFlagsLive, TheOldPrefixSpellingsStillWork) {
  auto client = make_client();
  auto locks = LockService::create(*client);
  auto held = locks->acquire("invoice:1", LockOptions{.ttl = 30s});
  ASSERT_TRUE(held);
  auto other = locks->acquire("order:1", LockOptions{.ttl = 30s});
  ASSERT_TRUE(other);
  // locks ls --prefix: the resource filter it always was, as --resource-prefix.
  for (const char* flag : {"--resource-prefix", "--prefix"}) {
    const auto r = run_jobguard({"--redis", url(), "--json", "locks", "ls", flag, "invoice:"});
    ASSERT_EQ(r.status, 0) << flag << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["locks"].size(), 1u) << flag << r.out;
    EXPECT_EQ(j["locks"][0]["resource"], "invoice:1") << flag;
  }
  // stats --prefix: the key prefix, as --key-prefix (a bad one is refused
  // by both, naming the value).
  for (const char* flag : {"--key-prefix", "--prefix"}) {
    const auto r = run_jobguard({"--redis", url(), "stats", flag, "bad prefix"});
    EXPECT_EQ(r.status, 64) << flag << r.err;
    EXPECT_NE(r.err.find("bad prefix"), std::string::npos) << flag << r.err;
  }
  held->release();
  other->release();
}

// Each subcommand that takes --redis, given only $JOBGUARD_REDIS_URL naming a
// port nobody listens on: it goes there (exit 69, the port named) rather than
// to the default, or to a private server of its own (demo), or nowhere
// (policy lint's optional checks).
TEST(CliFlagsEnv, EverySubcommandConnectsToTheEnvironmentUrls) {
  const std::string dead = "redis://127.0.0.1:1/0?connect_timeout=300ms";
  const std::vector<Args> redis_rows{
      {"run", "--key", "k", "--", "true"},
      {"jobs", "add", "--stream", "s", "id=1"},
      {"jobs", "ls", "--stream", "s"},
      {"jobs", "dead", "--stream", "s"},
      {"jobs", "retry", "--stream", "s", "--all"},
      {"jobs", "work", "--stream", "s", "--class", "c", "--", "true"},
      {"bench", "--seconds", "0.1"},
      {"stats"},
      {"locks", "ls"},
      {"locks", "show", "k"},
      {"locks", "release", "k", "--reason", "r"},
      {"locks", "audit"},
      {"doctor"},
      {"policy", "lint", std::string(JOBGUARD_SOURCE_DIR) + "/docs/catalog.example.yaml"},
      {"server", "trust"},
      {"demo", "--completions", "memory", "--subscriptions", "10"},
  };
  for (const auto& args : redis_rows) {
    const auto r = run_jobguard(args, 60s, {{"JOBGUARD_REDIS_URL", dead}});
    EXPECT_EQ(r.status, 69) << joined(args) << "\n" << r.out << r.err;
    // doctor reports its failed connection check on stdout, the others on stderr.
    EXPECT_NE((r.out + r.err).find("127.0.0.1:1"), std::string::npos) << joined(args) << "\n" << r.out << r.err;
  }
#ifndef JOBGUARD_TESTS_WITHOUT_POSTGRES  // a Redis-only build refuses it (main_test.cpp)
  const std::string dead_pg = "postgresql://postgres@127.0.0.1:1/postgres";
  for (const Args& args : std::vector<Args>{{"pg", "migrate"}}) {
    const auto r = run_jobguard(args, 60s, {{"JOBGUARD_POSTGRES_URL", dead_pg}});
    EXPECT_EQ(r.status, 69) << joined(args) << "\n" << r.err;
    EXPECT_NE(r.err.find("127.0.0.1"), std::string::npos) << joined(args) << "\n" << r.err;
  }
#endif
}

}  // namespace
}  // namespace jobguard::test
