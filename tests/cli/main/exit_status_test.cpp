// The exit-status table (apps/jobguard/exit_status.hpp): every errc has one
// row that agrees with its next step, and the real binary exits with it
// against a real redis-server that refuses a password, a command, a key's
// type, or is not there; usage errors are found before any connection.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "exit_status.hpp"
#include "jobguard/error.hpp"
#include "support/cli_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;
namespace ec = cli::exit_code;

// Every code the category knows: its message is not the unknown one.
std::vector<errc> every_errc() {
  const std::string unknown = make_error_code(static_cast<errc>(9999)).message();
  std::vector<errc> out;
  for (int v = 1; v < 256; ++v)
    if (make_error_code(static_cast<errc>(v)).message() != unknown) out.push_back(static_cast<errc>(v));
  return out;
}

TEST(ExitStatusTable, EveryErrcHasExactlyOneRow) {
  const auto codes = every_errc();
  ASSERT_GE(codes.size(), 18u);
  for (errc c : codes) {
    const auto n = std::count_if(cli::kExitTable.begin(), cli::kExitTable.end(),
                                 [c](const cli::ExitRow& r) { return r.code == c; });
    EXPECT_EQ(n, 1) << make_error_code(c).message();
  }
  EXPECT_EQ(cli::kExitTable.size(), codes.size()) << "a row for a code the category does not know";
}

TEST(ExitStatusTable, StatusFollowsTheNextStep) {
  for (errc c : every_errc()) {
    const int status = cli::exit_status_for(make_error_code(c));
    const std::string what = make_error_code(c).message();
    switch (next_step_for(c)) {
      case next_step::retry_call: EXPECT_EQ(status, ec::unavailable) << what; break;
      case next_step::restart_attempt: EXPECT_EQ(status, ec::lease_lost) << what; break;
      case next_step::check_record: EXPECT_EQ(status, ec::in_doubt) << what; break;
      case next_step::stop:
        // Who must fix it: the command line, the server's data, the ACL
        // user's rights, or the configuration; shutdown is the one stop
        // that is "not now".
        if (c == errc::shutdown) EXPECT_EQ(status, ec::unavailable) << what;
        else
          EXPECT_TRUE(status == ec::usage || status == ec::server_error || status == ec::permission ||
                      status == ec::config)
              << what << ": " << status;
        break;
      case next_step::none: ADD_FAILURE() << what; break;
    }
  }
  EXPECT_EQ(cli::exit_status_for(make_error_code(errc::auth_failed)), ec::config);
  EXPECT_EQ(cli::exit_status_for(make_error_code(errc::tls_error)), ec::config);
  EXPECT_EQ(cli::exit_status_for(make_error_code(errc::permission_denied)), ec::permission);
  EXPECT_EQ(cli::exit_status_for(make_error_code(errc::server_error)), ec::server_error);
  EXPECT_EQ(cli::exit_status_for(make_error_code(errc::script_error)), ec::server_error);
  EXPECT_EQ(cli::exit_status_for(make_error_code(errc::invalid_url)), ec::usage);
  EXPECT_EQ(cli::exit_status_for(make_error_code(errc::in_doubt)), ec::in_doubt);
  // Foreign codes by their next step.
  EXPECT_EQ(cli::exit_status_for(std::make_error_code(std::errc::connection_refused)), ec::unavailable);
  EXPECT_EQ(cli::exit_status_for(std::error_code{}), ec::ok);
}

TEST(ExitStatusTable, NoStatusMeansTwoThings) {
  std::set<int> seen;
  for (int s : {ec::usage, ec::data, ec::unavailable, ec::lease_lost, ec::in_doubt, ec::busy, ec::server_error,
                ec::permission, ec::config, ec::timeout})
    EXPECT_TRUE(seen.insert(s).second) << s;
}

class ExitStatusCli : public CliTest {
 protected:
  SubprocessResult jg(const std::string& redis_url, const Args& args) {
    Args a{jobguard_binary(), "--redis", redis_url};
    a.insert(a.end(), args.begin(), args.end());
    Subprocess p(a);
    return p.wait_or_kill(60s);
  }
  std::string url_as(const std::string& user, const std::string& password) const {
    return fmt::format("redis://{}:{}@{}:{}/0", user, password, server->host(), server->port());
  }
  static int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }
};

// A lock key of the default prefix, so `locks ls` finds one to inspect.
const std::string kLockKey = "jobguard:lock:{inv:1}";

TEST_F(ExitStatusCli, WrongPasswordIs78EverywhereNot69) {
  ASSERT_EQ(admin("ACL SETUSER alice on >right ~* &* +@all"), "OK");
  const auto bad = url_as("alice", "not-the-password");
  for (const Args& args : std::vector<Args>{{"locks", "ls"},
                                            {"locks", "show", "inv:1"},
                                            {"jobs", "ls", "--stream", "q"},
                                            {"run", "--key", "k", "--", "true"},
                                            {"jobs", "work", "--stream", "q", "--class", "t", "--", "true"}}) {
    const auto r = jg(bad, args);
    EXPECT_EQ(r.status, ec::config) << args[0] << " " << args[1] << ": " << r.err;
    EXPECT_NE(r.err.find("WRONGPASS"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("\"alice\""), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("not-the-password"), std::string::npos) << "the password leaked: " << r.err;
  }
}

TEST_F(ExitStatusCli, AclRefusalIs77WithTheServersWordsTheCommandAndTheKey) {
  admin("SET " + kLockKey + " some-token PX 60000");
  ASSERT_EQ(admin("ACL SETUSER noscript on >pw ~* &* +@all -evalsha -eval"), "OK");
  ASSERT_EQ(admin("ACL SETUSER noscan on >pw ~* &* +@all -scan"), "OK");
  struct Case {
    std::string user;
    Args args;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases{
      {"noscript", {"locks", "show", "inv:1"}, {"NOPERM", "evalsha", kLockKey}},
      {"noscript", {"locks", "ls"}, {"NOPERM", "evalsha", kLockKey}},
      {"noscan", {"locks", "ls"}, {"NOPERM", "scan", "SCAN"}},
  };
  for (const auto& c : cases) {
    const auto r = jg(url_as(c.user, "pw"), c.args);
    const std::string what = c.user + " " + c.args[1];
    EXPECT_EQ(r.status, ec::permission) << what << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("permission denied"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("authentication failed"), std::string::npos) << r.err;
    for (const auto& s : c.says) EXPECT_NE(r.err.find(s), std::string::npos) << what << ": no " << s << " in " << r.err;
  }
}

TEST_F(ExitStatusCli, WrongTypeOnTheLockKeyIs76WithTheServersWords) {
  admin("HSET " + kLockKey + " not a-lock");
  for (const Args& args : std::vector<Args>{{"locks", "show", "inv:1"}, {"locks", "ls"}}) {
    const auto r = jg(url(), args);
    EXPECT_EQ(r.status, ec::server_error) << args[1] << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("WRONGTYPE"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(kLockKey), std::string::npos) << r.err;
  }
}

TEST_F(ExitStatusCli, UsageErrorsAre64BeforeAnyConnectionWithRedisDown) {
  server->stop();
  const std::vector<Args> cases{
      {"jobs", "work", "--stream", "q", "--class", "t", "--concurrency", "0", "--", "true"},
      {"jobs", "work", "--stream", "q", "--class", "t", "--max-attempts", "0", "--", "true"},
      {"jobs", "work", "--stream", "q", "--class", "t", "--claim-idle", "0ms", "--", "true"},
      {"jobs", "add", "--stream", "q"},
      {"jobs", "retry", "--stream", "q"},
      {"locks", "show", "bad}key"},
      {"locks", "release", "inv:1", "--reason", ""},
      {"locks", "ls", "--class", "c"},
      {"run", "--key", "k", "--ttl", "soon", "--", "true"},
      {"stats", "--window", "7m"},
      {"policy", "lint", "/nonexistent", "--window", "7m"},
  };
  for (const auto& args : cases) {
    const auto r = jg(url(), args);
    EXPECT_EQ(r.status, ec::usage) << fmt::format("{}", fmt::join(args, " ")) << ": " << r.err;
    EXPECT_EQ(r.err.find("cannot reach Redis"), std::string::npos) << "connected first: " << r.err;
  }
}

TEST_F(ExitStatusCli, RedisDownIs69) {
  server->stop();
  for (const Args& args : std::vector<Args>{{"locks", "ls"},
                                            {"locks", "show", "inv:1"},
                                            {"jobs", "ls", "--stream", "q"},
                                            {"run", "--key", "k", "--", "true"},
                                            {"stats"}}) {
    const auto r = jg(url(), args);
    EXPECT_EQ(r.status, ec::unavailable) << args[0] << ": " << r.err;
  }
}

TEST(ExitStatusHelp, EverySubcommandsHelpListsTheStatuses) {
  const std::vector<Args> subs{{"run"},          {"jobs"},          {"jobs", "add"},    {"jobs", "ls"},
                               {"jobs", "dead"}, {"jobs", "retry"}, {"jobs", "work"},   {"pg"},
                               {"pg", "migrate"}, {"demo"},         {"bench"},          {"serve"},
                               {"stats"},        {"locks"},         {"locks", "ls"},    {"locks", "show"},
                               {"locks", "release"}, {"locks", "audit"}, {"doctor"},   {"policy"},
                               {"policy", "lint"}, {"policy", "doc"}};
  for (auto args : subs) {
    const std::string name = fmt::format("{}", fmt::join(args, " "));
    args.push_back("--help");
    const auto r = run_jobguard(args);
    ASSERT_EQ(r.status, 0) << name << ": " << r.err;
    EXPECT_NE(r.out.find("Exit status"), std::string::npos) << name << ":\n" << r.out;
    for (int s : {ec::usage, ec::unavailable, ec::in_doubt, ec::server_error, ec::permission, ec::config})
      EXPECT_NE(r.out.find(std::to_string(s) + " "), std::string::npos) << name << " lacks " << s << ":\n" << r.out;
  }
}

}  // namespace
}  // namespace jobguard::test
