// `jobguard run --key A --key B`: the real binary holding several locks, all
// or none (docs/multilock.md), against a private redis-server: what CMD is
// told, a busy key leaving none held, the loss of one key stopping CMD, and
// every usage error as one line with exit 64.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "jobguard/redis/client.hpp"
#include "support/cli_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;

class RunMulti : public CliTest {
 protected:
  std::string res(const std::string& s) const {
    return fmt::format("t:{}:{}", ::testing::UnitTest::GetInstance()->current_test_info()->name(), s);
  }
  static std::string lock_key(const std::string& r) { return "jobguard:lock:{" + r + "}"; }
  Args args(const Args& flags, const Args& cmd) const {
    Args a{jobguard_binary(), "--redis", url(), "run"};
    a.insert(a.end(), flags.begin(), flags.end());
    a.push_back("--");
    a.insert(a.end(), cmd.begin(), cmd.end());
    return a;
  }
  // Writes what CMD was told to `out` (one variable a line), then waits for `go`.
  static Args holder(const std::string& out, const std::string& go) {
    return {"sh", "-c",
            "printf '%s\\n%s\\n%s\\n%s\\n%s\\n' \"$JOBGUARD_RESOURCES\" \"$JOBGUARD_KEYS\" \"$JOBGUARD_TOKENS\" "
            "\"$JOBGUARD_FENCES\" \"${JOBGUARD_KEY-unset}\" > \"$0.tmp\"; mv \"$0.tmp\" \"$0\"; "
            "while [ ! -e \"$1\" ]; do sleep 0.01; done",
            out, go};
  }
  static std::vector<std::string> words(const std::string& line) {
    std::istringstream in(line);
    std::vector<std::string> out;
    for (std::string w; in >> w;) out.push_back(w);
    return out;
  }
  void expect_usage(const Args& flags, const std::string& words_in_error) {
    Subprocess p(args(flags, {"true"}));
    auto rc = p.wait_or_kill(30s);
    EXPECT_EQ(rc.status, 64) << rc.err;
    EXPECT_NE(rc.err.find(words_in_error), std::string::npos) << rc.err;
    EXPECT_EQ(std::count(rc.err.begin(), rc.err.end(), '\n'), 1) << rc.err;
  }
};

TEST_F(RunMulti, HoldsEveryKeyAndTellsCmdEachTokenAndFenceInCanonicalOrder) {
  const auto a = res("a"), b = res("b");
  const auto go = file("go"), out = file("out");
  Subprocess p(args({"--key", b, "--key", a, "--fence"}, holder(out, go)));
  ASSERT_TRUE(eventually([&] { return std::filesystem::exists(out); }, 10s)) << p.err();
  std::istringstream in(read_file(out));
  std::string lines[5];
  for (auto& l : lines) std::getline(in, l);
  EXPECT_EQ(words(lines[0]), (std::vector<std::string>{a, b}));
  EXPECT_EQ(words(lines[1]), (std::vector<std::string>{lock_key(a), lock_key(b)}));
  const auto tokens = words(lines[2]);
  ASSERT_EQ(tokens.size(), 2u);
  EXPECT_EQ(admin("GET " + lock_key(a)), tokens[0]);
  EXPECT_EQ(admin("GET " + lock_key(b)), tokens[1]);
  const auto fences = words(lines[3]);
  ASSERT_EQ(fences.size(), 2u);
  EXPECT_EQ(admin("GET jobguard:fence:{" + a + "}"), fences[0]);
  EXPECT_EQ(admin("GET jobguard:fence:{" + b + "}"), fences[1]);
  EXPECT_EQ(lines[4], "unset");  // the single-key variables are not set
  std::ofstream(go) << "go\n";
  auto rc = p.wait_or_kill(30s);
  EXPECT_EQ(rc.status, 0) << rc.err;
  EXPECT_EQ(admin("EXISTS " + lock_key(a) + " " + lock_key(b)), "0");
}

TEST_F(RunMulti, ABusyKeyIsExit75AndLeavesNoneOfTheOthersHeld) {
  const auto a = res("a"), m = res("m"), z = res("z");
  admin("SET " + lock_key(m) + " someone-else PX 30000");
  Subprocess p(args({"--key", z, "--key", m, "--key", a}, {"true"}));
  auto rc = p.wait_or_kill(30s);
  EXPECT_EQ(rc.status, 75) << rc.err;
  EXPECT_NE(rc.err.find(lock_key(m) + " is held by someone-else"), std::string::npos) << rc.err;
  EXPECT_NE(rc.err.find("none of"), std::string::npos) << rc.err;
  EXPECT_EQ(admin("EXISTS " + lock_key(a) + " " + lock_key(z)), "0");
  EXPECT_EQ(admin("GET " + lock_key(m)), "someone-else");
}

TEST_F(RunMulti, LosingOneKeyStopsCmdWithExit70) {
  const auto a = res("a"), b = res("b");
  const auto go = file("go"), out = file("out");
  Subprocess p(args({"--key", a, "--key", b, "--ttl", "600ms", "--grace", "1s"}, holder(out, go)));
  ASSERT_TRUE(eventually([&] { return std::filesystem::exists(out); }, 10s)) << p.err();
  admin("SET " + lock_key(b) + " intruder PX 30000");
  auto rc = p.wait_or_kill(30s);
  EXPECT_EQ(rc.status, 70) << rc.err;
  EXPECT_NE(rc.err.find(lock_key(b) + " is gone or held by another owner"), std::string::npos) << rc.err;
  // The key still ours is given back at once, not at its TTL.
  EXPECT_EQ(admin("EXISTS " + lock_key(a)), "0");
  EXPECT_EQ(admin("GET " + lock_key(b)), "intruder");
}

TEST_F(RunMulti, UsageErrorsAreOneLineAndExit64) {
  const auto a = res("a"), b = res("b");
  expect_usage({"--key", a, "--key", b, "--key", a}, "--key " + a + " given twice");
  expect_usage({"--key", a, "--key", b, "--permits", "2"}, "--permits with several --key");
  expect_usage({"--key", a, "--key", b, "--fair"}, "--fair with several --key");
  expect_usage({"--key", a, "--key", b, "--once", "r1"}, "--once with several --key");
  expect_usage({"--key", a, "--key", b, "--shared"}, "--shared with several --key");
  expect_usage({"--key", a, "--key", b, "--exclusive"}, "--exclusive with several --key");
  expect_usage({"--key", a, "--key", "bad{brace"}, "bad{brace");
  expect_usage({"--ttl", "1s"}, "--key");
  EXPECT_EQ(admin("EXISTS " + lock_key(a) + " " + lock_key(b)), "0");
}

}  // namespace
}  // namespace jobguard::test
