// `jobguard run --shared|--exclusive`: the real binary holding a reader's or
// the writer's place of a read-write lock (docs/rwlock.md), against a private
// redis-server.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/cli_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;

class RunRw : public CliTest {
 protected:
  std::string resource() const {
    return fmt::format("t:{}", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  std::string readers_key() const { return "jobguard:rwr:{" + resource() + "}"; }
  std::string writer_key() const { return "jobguard:rww:{" + resource() + "}"; }
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
            "printf '%s %s %s %s\\n' \"$JOBGUARD_KEY\" \"$JOBGUARD_TOKEN\" \"$JOBGUARD_LOCK_MODE\" "
            "\"${JOBGUARD_FENCE:-0}\" > \"$0.tmp\"; mv \"$0.tmp\" \"$0\"; "
            "while [ ! -e \"$1\" ]; do sleep 0.01; done",
            out, go};
  }
  struct Told {
    std::string key, token, mode;
    long long fence = 0;
  };
  Told told(const std::string& path) const {
    std::istringstream in(read_file(path));
    Told t;
    in >> t.key >> t.token >> t.mode >> t.fence;
    return t;
  }
  bool exists(const std::string& p) const { return std::filesystem::exists(p); }
  void touch(const std::string& p) const { std::ofstream(p) << "go\n"; }
};

TEST_F(RunRw, ReadersRunTogetherAndAWriterAfterThem) {
  const auto go = file("go");
  Subprocess a(args({"--shared", "--fence", "--job-id", "reader-a"}, holder(file("a"), go)));
  Subprocess b(args({"--shared", "--fence"}, holder(file("b"), go)));
  ASSERT_TRUE(eventually([&] { return exists(file("a")) && exists(file("b")); }, 10s)) << a.err() << b.err();
  const auto ta = told(file("a")), tb = told(file("b"));
  EXPECT_EQ(ta.key, readers_key());
  EXPECT_EQ(ta.mode, "shared");
  EXPECT_NE(ta.token, tb.token);
  EXPECT_EQ(admin("ZCARD " + readers_key()), "2");

  // A writer that does not wait is busy, naming the readers.
  Subprocess busy(args({"--exclusive"}, {"true"}));
  auto rc = busy.wait_or_kill(30s);
  EXPECT_EQ(rc.status, 75) << rc.err;
  EXPECT_NE(rc.err.find("has 2 readers"), std::string::npos) << rc.err;
  EXPECT_NE(rc.err.find("reader-a"), std::string::npos) << rc.err;

  // One that waits is granted once both readers are done, fenced after them.
  Subprocess w(args({"--exclusive", "--fence", "--wait", "30s"}, holder(file("w"), file("go-w"))));
  ASSERT_TRUE(eventually([&] { return admin("ZCARD jobguard:rwqw:{" + resource() + "}") == "1"; }, 10s)) << w.err();
  // Meanwhile a new reader does not get in (writer preference).
  Subprocess late(args({"--shared"}, {"true"}));
  auto rl = late.wait_or_kill(30s);
  EXPECT_EQ(rl.status, 75) << rl.err;
  EXPECT_NE(rl.err.find("1 writer(s) waiting"), std::string::npos) << rl.err;
  // locks show lists the readers and the waiting writer.
  Subprocess show({jobguard_binary(), "--redis", url(), "locks", "show", resource()});
  auto rs = show.wait_or_kill(30s);
  EXPECT_EQ(rs.status, 0) << rs.err;
  EXPECT_NE(rs.out.find("read-write lock: 2 readers, no writer, 1 waiting (1 writer)"), std::string::npos) << rs.out;
  EXPECT_NE(rs.out.find("reader  "), std::string::npos) << rs.out;
  EXPECT_FALSE(exists(file("w")));
  touch(go);
  EXPECT_EQ(a.wait_or_kill(30s).status, 0);
  EXPECT_EQ(b.wait_or_kill(30s).status, 0);
  ASSERT_TRUE(eventually([&] { return exists(file("w")); }, 20s)) << w.err();
  const auto tw = told(file("w"));
  EXPECT_EQ(tw.key, writer_key());
  EXPECT_EQ(tw.mode, "exclusive");
  EXPECT_GT(tw.fence, ta.fence);
  EXPECT_GT(tw.fence, tb.fence);
  Subprocess js({jobguard_binary(), "--redis", url(), "--json", "locks", "show", resource()});
  auto rj = js.wait_or_kill(30s);
  EXPECT_EQ(rj.status, 0) << rj.err;
  EXPECT_NE(rj.out.find("\"rwlock\":{"), std::string::npos) << rj.out;
  EXPECT_NE(rj.out.find("\"writer\":{"), std::string::npos) << rj.out;
  touch(file("go-w"));
  EXPECT_EQ(w.wait_or_kill(30s).status, 0);
  EXPECT_EQ(admin("EXISTS " + writer_key()), "0");
}

TEST_F(RunRw, AReaderWhosePlaceIsTakenAwayIsStoppedWithExit70) {
  Subprocess a(args({"--shared", "--ttl", "600ms", "--grace", "200ms"}, holder(file("a"), file("never"))));
  ASSERT_TRUE(eventually([&] { return exists(file("a")); }, 10s)) << a.err();
  admin("DEL " + readers_key());
  auto rc = a.wait_or_kill(30s);
  EXPECT_EQ(rc.status, 70) << rc.err;
}

TEST_F(RunRw, LocksReleaseRwRemovesOneReaderAuditedAndItsRunIsStopped) {
  const auto go = file("go");
  Subprocess a(args({"--shared", "--ttl", "900ms", "--grace", "200ms", "--fence", "--job-id", "reader-a"},
                    holder(file("a"), file("never"))));
  Subprocess b(args({"--shared", "--job-id", "reader-b"}, holder(file("b"), go)));
  ASSERT_TRUE(eventually([&] { return exists(file("a")) && exists(file("b")); }, 10s)) << a.err() << b.err();
  const auto ta = told(file("a"));
  const std::string owner = ta.token.substr(0, ta.token.rfind('#'));
  // Someone who holds nothing: exit 75, nothing removed.
  Subprocess wrong({jobguard_binary(), "--redis", url(), "locks", "release", resource(), "--rw", "--reason", "test",
                    "--holder", "nobody/1/x"});
  auto rw = wrong.wait_or_kill(30s);
  EXPECT_EQ(rw.status, 75) << rw.err;
  EXPECT_EQ(admin("ZCARD " + readers_key()), "2");
  Subprocess rel({jobguard_binary(), "--redis", url(), "locks", "release", resource(), "--rw", "--reason",
                  "stuck reader", "--holder", owner});
  auto rr = rel.wait_or_kill(30s);
  EXPECT_EQ(rr.status, 0) << rr.err;
  EXPECT_NE(rr.out.find("reader " + owner), std::string::npos) << rr.out;
  EXPECT_EQ(admin("ZCARD " + readers_key()), "1");  // reader-b stays
  // Reader a's run learns it at its next renewal and is stopped.
  auto ra = a.wait_or_kill(30s);
  EXPECT_EQ(ra.status, 70) << ra.err;
  // The fence moved past reader a's, and the release is in the audit.
  EXPECT_GT(std::stoll(admin("GET jobguard:fence:{" + resource() + "}")), ta.fence);
  Subprocess audit({jobguard_binary(), "--redis", url(), "locks", "audit"});
  auto au = audit.wait_or_kill(30s);
  EXPECT_EQ(au.status, 0) << au.err;
  EXPECT_NE(au.out.find("stuck reader"), std::string::npos) << au.out;
  touch(go);
  EXPECT_EQ(b.wait_or_kill(30s).status, 0);
}

TEST_F(RunRw, ConflictingModesAreUsageErrors) {
  for (const auto& [flags, want] : std::vector<std::pair<Args, std::string>>{
           {{"--shared", "--permits", "2"}, "--shared with --permits"},
           {{"--exclusive", "--permits", "2"}, "--exclusive with --permits"},
           {{"--shared", "--exclusive"}, "--shared with --exclusive"},
           {{"--shared", "--fair"}, "--shared with --fair"}}) {
    Subprocess p(args(flags, {"true"}));
    auto rc = p.wait_or_kill(30s);
    EXPECT_EQ(rc.status, 64) << flags[0] << " " << flags[1] << ": " << rc.err;
    EXPECT_NE(rc.err.find(want), std::string::npos) << rc.err;
    EXPECT_EQ(std::count(rc.err.begin(), rc.err.end(), '\n'), 1) << rc.err;
  }
  // Refused before touching the network: nothing written.
  EXPECT_EQ(admin("EXISTS " + readers_key() + " " + writer_key()), "0");
}

TEST_F(RunRw, HelpDocumentsTheModes) {
  Subprocess p({jobguard_binary(), "run", "--help"});
  auto rc = p.wait_or_kill(30s);
  EXPECT_EQ(rc.status, 0);
  EXPECT_NE(rc.out.find("--shared"), std::string::npos) << rc.out;
  EXPECT_NE(rc.out.find("--exclusive"), std::string::npos) << rc.out;
  EXPECT_NE(rc.out.find("JOBGUARD_LOCK_MODE"), std::string::npos) << rc.out;
}

}  // namespace
}  // namespace jobguard::test
