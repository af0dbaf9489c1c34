// `jobguard run --permits N`: the real binary holding one of N permits of a
// counting semaphore (docs/semaphore.md), against a private redis-server.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "support/cli_fixture.hpp"
#include "support/subprocess.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;

class RunPermits : public CliTest {
 protected:
  std::string resource() const {
    return fmt::format("t:{}", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  std::string holders_key() const { return "jobguard:sem:{" + resource() + "}"; }
  Args args(const Args& flags, const Args& cmd) const {
    Args a{jobguard_binary(), "--redis", url(), "run", "--key", resource()};
    a.insert(a.end(), flags.begin(), flags.end());
    a.push_back("--");
    a.insert(a.end(), cmd.begin(), cmd.end());
    return a;
  }
  // Writes what CMD was told to `out`, then waits for `go`.
  Args holder(const std::string& out, const std::string& go) const {
    return {"sh", "-c",
            "printf '%s %s %s %s %s\\n' \"$JOBGUARD_KEY\" \"$JOBGUARD_TOKEN\" \"$JOBGUARD_PERMITS\" "
            "\"$JOBGUARD_PERMIT_SLOT\" \"$JOBGUARD_FENCE\" > \"$0.tmp\"; mv \"$0.tmp\" \"$0\"; "
            "while [ ! -e \"$1\" ]; do sleep 0.01; done",
            out, go};
  }
  struct Told {
    std::string key, token;
    int permits = 0, slot = -1;
    long long fence = 0;
  };
  Told told(const std::string& path) const {
    std::istringstream in(read_file(path));
    Told t;
    in >> t.key >> t.token >> t.permits >> t.slot >> t.fence;
    return t;
  }
  bool exists(const std::string& p) const { return std::filesystem::exists(p); }
  void touch(const std::string& p) const { std::ofstream(p) << "go\n"; }
};

TEST_F(RunPermits, NRunsHoldAtOnceAndTheNextIsBusy) {
  const auto go = file("go");
  Subprocess a(args({"--permits", "2", "--fence"}, holder(file("a"), go)));
  Subprocess b(args({"--permits", "2", "--fence"}, holder(file("b"), go)));
  ASSERT_TRUE(eventually([&] { return exists(file("a")) && exists(file("b")); }, 10s)) << a.err() << b.err();
  const auto ta = told(file("a")), tb = told(file("b"));
  EXPECT_EQ(ta.key, holders_key());
  EXPECT_EQ(ta.permits, 2);
  EXPECT_EQ((std::set<int>{ta.slot, tb.slot}), (std::set<int>{0, 1}));
  EXPECT_GT(ta.fence, 0);
  EXPECT_NE(ta.fence, tb.fence);
  // The token CMD was told is the holder in Redis, with its slot.
  auto client = make_client();
  for (const auto& t : {ta, tb})
    EXPECT_TRUE(client->exec(redis::Command{"ZSCORE", holders_key(), fmt::format("{} {}", t.token, t.slot)}).is_string())
        << t.token;
  EXPECT_EQ(admin("ZCARD " + holders_key()), "2");

  Subprocess c(args({"--permits", "2"}, {"true"}));
  auto rc = c.wait_or_kill(30s);
  EXPECT_EQ(rc.status, 75) << rc.err;
  EXPECT_NE(rc.err.find("no permit free"), std::string::npos) << rc.err;
  EXPECT_NE(rc.err.find("has 2 holders"), std::string::npos) << rc.err;

  touch(go);
  EXPECT_EQ(a.wait_or_kill(30s).status, 0);
  EXPECT_EQ(b.wait_or_kill(30s).status, 0);
  EXPECT_EQ(admin("EXISTS " + holders_key()), "0");  // both released
}

TEST_F(RunPermits, AWaitingRunIsGrantedWhenAHolderFinishes) {
  const auto go = file("go");
  Subprocess a(args({"--permits", "1"}, holder(file("a"), go)));
  ASSERT_TRUE(eventually([&] { return exists(file("a")); }, 10s)) << a.err();
  Subprocess w(args({"--permits", "1", "--wait", "30s"}, holder(file("w"), file("go-w"))));
  ASSERT_TRUE(eventually([&] { return admin("ZCARD jobguard:semq:{" + resource() + "}") == "1"; }, 10s)) << w.err();
  EXPECT_FALSE(exists(file("w")));
  touch(go);
  EXPECT_EQ(a.wait_or_kill(30s).status, 0);
  ASSERT_TRUE(eventually([&] { return exists(file("w")); }, 20s)) << w.err();
  EXPECT_EQ(told(file("w")).slot, 0);
  touch(file("go-w"));
  EXPECT_EQ(w.wait_or_kill(30s).status, 0);
}

TEST_F(RunPermits, ARunWhosePermitIsTakenAwayIsStoppedWithExit70) {
  Subprocess a(args({"--permits", "1", "--ttl", "600ms", "--grace", "200ms"}, holder(file("a"), file("never"))));
  ASSERT_TRUE(eventually([&] { return exists(file("a")); }, 10s)) << a.err();
  admin("DEL " + holders_key());
  auto rc = a.wait_or_kill(30s);
  EXPECT_EQ(rc.status, 70) << rc.err;
}

TEST_F(RunPermits, LocksShowListsThePermitHolders) {
  const auto go = file("go");
  Subprocess a(args({"--permits", "2", "--job-id", "holder-a"}, holder(file("a"), go)));
  ASSERT_TRUE(eventually([&] { return exists(file("a")); }, 10s)) << a.err();
  Subprocess show({jobguard_binary(), "--redis", url(), "locks", "show", resource()});
  auto rc = show.wait_or_kill(30s);
  EXPECT_EQ(rc.status, 0) << rc.err;
  EXPECT_NE(rc.out.find("permits: 1 held in " + holders_key() + ", 0 waiting"), std::string::npos) << rc.out;
  EXPECT_NE(rc.out.find("slot 0"), std::string::npos) << rc.out;
  EXPECT_NE(rc.out.find("holder-a"), std::string::npos) << rc.out;
  Subprocess js({jobguard_binary(), "--redis", url(), "--json", "locks", "show", resource()});
  auto rj = js.wait_or_kill(30s);
  EXPECT_EQ(rj.status, 0) << rj.err;
  EXPECT_NE(rj.out.find("\"permits\":{"), std::string::npos) << rj.out;
  EXPECT_NE(rj.out.find("\"slot\":0"), std::string::npos) << rj.out;
  touch(go);
  EXPECT_EQ(a.wait_or_kill(30s).status, 0);
}

TEST_F(RunPermits, LocksLsListsTheSemaphoreAndReleaseFreesOnePermitAudited) {
  const auto go = file("go");
  Subprocess a(args({"--permits", "2", "--ttl", "2s", "--grace", "200ms", "--job-id", "holder-a"},
                    holder(file("a"), go)));
  ASSERT_TRUE(eventually([&] { return exists(file("a")); }, 10s)) << a.err();
  Subprocess b(args({"--permits", "2", "--ttl", "2s", "--job-id", "holder-b"}, holder(file("b"), go)));
  ASSERT_TRUE(eventually([&] { return exists(file("b")); }, 10s)) << b.err();
  const int slot_a = told(file("a")).slot, slot_b = told(file("b")).slot;
  const auto locks = [&](const Args& more) {
    Args x{jobguard_binary(), "--redis", url()};
    x.insert(x.end(), more.begin(), more.end());
    Subprocess p(x);
    return p.wait_or_kill(30s);
  };
  auto ls = locks({"locks", "ls"});
  EXPECT_EQ(ls.status, 0) << ls.err;
  EXPECT_NE(ls.out.find("SEMAPHORE"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find(resource()), std::string::npos) << ls.out;
  auto lj = locks({"--json", "locks", "ls"});
  EXPECT_NE(lj.out.find("\"holders\":2"), std::string::npos) << lj.out;
  // Bad requests: which permit, and a slot in range.
  auto none = locks({"locks", "release", resource(), "--reason", "x", "--permit"});
  EXPECT_EQ(none.status, 64) << none.err;
  EXPECT_NE(none.err.find("--slot N or --holder OWNER"), std::string::npos) << none.err;
  EXPECT_EQ(locks({"locks", "release", resource(), "--reason", "x", "--slot", "-1"}).status, 64);
  // The slot is someone else's: left alone, exit 75.
  auto wrong = locks({"locks", "release", resource(), "--reason", "x", "--slot", std::to_string(slot_b), "--holder",
                      told(file("a")).token.substr(0, told(file("a")).token.rfind('#'))});
  EXPECT_EQ(wrong.status, 75) << wrong.out << wrong.err;
  EXPECT_EQ(admin("ZCARD " + holders_key()), "2");
  // a's permit: released, its run stopped with 70 (its renewal finds it gone),
  // b untouched, the slot free for the next run.
  auto rel = locks({"locks", "release", resource(), "--reason", "stuck vendor call", "--slot", std::to_string(slot_a)});
  EXPECT_EQ(rel.status, 0) << rel.err;
  EXPECT_NE(rel.out.find("in slot " + std::to_string(slot_a)), std::string::npos) << rel.out;
  EXPECT_EQ(a.wait_or_kill(30s).status, 70);
  auto audit = locks({"locks", "audit"});
  EXPECT_NE(audit.out.find("holder-a (slot " + std::to_string(slot_a) + ")"), std::string::npos) << audit.out;
  EXPECT_NE(audit.out.find("stuck vendor call"), std::string::npos) << audit.out;
  Subprocess c(args({"--permits", "2", "--job-id", "holder-c"}, holder(file("c"), go)));
  ASSERT_TRUE(eventually([&] { return exists(file("c")); }, 10s)) << c.err();
  EXPECT_EQ(told(file("c")).slot, slot_a);
  // Nothing matches any more: exit 0, nothing released.
  auto again = locks({"locks", "release", resource(), "--reason", "x", "--permit", "--holder", "nobody/1/x"});
  EXPECT_EQ(again.status, 0) << again.err;
  EXPECT_NE(again.out.find("nothing released"), std::string::npos) << again.out;
  touch(go);
  EXPECT_EQ(b.wait_or_kill(30s).status, 0);
  EXPECT_EQ(c.wait_or_kill(30s).status, 0);
}

// --catalog: the class's permits, ttl and fencing, not flags.
TEST_F(RunPermits, ACatalogClassWithPermitsMakesTheRunAPermitHolder) {
  const auto cat = file("catalog.yaml");
  std::ofstream(cat) << fmt::format(R"(classes:
  - {{name: provider, key: "{}", owner: o, protects: p, consequence: low, ttl: 7s, renewal: false,
     hard_timeout: none, fencing: true, on_redis_down: fail-closed, fallback: f, permits: 3}}
  - {{name: plain, key: "{}", owner: o, protects: p, consequence: low, ttl: 7s, renewal: false,
     hard_timeout: none, fencing: false, on_redis_down: fail-closed, fallback: f}}
)", resource(), resource());
  const auto go = file("go");
  Subprocess a(args({"--catalog", cat, "--class", "provider"}, holder(file("a"), go)));
  ASSERT_TRUE(eventually([&] { return exists(file("a")); }, 10s)) << a.err();
  const auto t = told(file("a"));
  EXPECT_EQ(t.key, holders_key());
  EXPECT_EQ(t.permits, 3);
  EXPECT_GT(t.fence, 0);  // fencing: true
  const auto pttl = std::stoll(admin("PTTL " + holders_key()));
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 7000);  // ttl: 7s
  touch(go);
  EXPECT_EQ(a.wait_or_kill(30s).status, 0);

  for (const auto& [flags, want] : std::vector<std::pair<Args, std::string>>{
           {{"--catalog", cat, "--class", "provider", "--permits", "2"}, "--permits with --catalog: class 'provider'"},
           {{"--catalog", cat, "--class", "provider", "--ttl", "3s"}, "--ttl with --catalog"},
           {{"--catalog", cat, "--class", "plain", "--shared"}, "--shared with --catalog: class 'plain'"},
           {{"--catalog", cat, "--class", "nope"}, "no class 'nope' (it has: provider, plain)"},
           {{"--catalog", file("missing.yaml"), "--class", "provider"}, "cannot read the file"}}) {
    Subprocess p(args(flags, {"true"}));
    auto rc = p.wait_or_kill(30s);
    EXPECT_EQ(rc.status, 64) << flags.back() << ": " << rc.err;
    EXPECT_NE(rc.err.find(want), std::string::npos) << rc.err;
    EXPECT_EQ(std::count(rc.err.begin(), rc.err.end(), '\n'), 1) << rc.err;
  }
}

TEST_F(RunPermits, BadPermitCountsAreUsageErrors) {
  for (const auto& [flags, want] :
       std::vector<std::pair<Args, std::string>>{{{"--permits", "0"}, "--permits 0: must be a whole number in 1..10000"},
                                                 {{"--permits", "two"}, "--permits two: must be a whole number"},
                                                 {{"--permits", "10001"}, "--permits 10001"},
                                                 {{"--permits", "2", "--fair"}, "--permits with --fair"}}) {
    Subprocess p(args(flags, {"true"}));
    auto rc = p.wait_or_kill(30s);
    EXPECT_EQ(rc.status, 64) << flags[1] << ": " << rc.err;
    EXPECT_NE(rc.err.find(want), std::string::npos) << rc.err;
    EXPECT_EQ(std::count(rc.err.begin(), rc.err.end(), '\n'), 1) << rc.err;
  }
}

}  // namespace
}  // namespace jobguard::test
