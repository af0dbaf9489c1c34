// `jobguard run` as users run it: the real binary, a real redis-server per
// test, real child processes and signals. Each exit status `jobguard run --help` lists
// has a test here.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#ifndef JOBGUARD_TESTS_WITHOUT_POSTGRES
#include "jobguard/guard/postgres.hpp"
#include "support/postgres_fixture.hpp"
#endif
#include "support/cli_fixture.hpp"
#include "support/subprocess.hpp"
#include "integration/ops/http_client.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;

class RunCli : public CliTest {
 protected:
  // A resource name unique to this test.
  std::string resource() const {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return fmt::format("t:{}", info->name());
  }
  std::string lock_key() const { return "jobguard:lock:{" + resource() + "}"; }

  // jobguard --redis URL [globals] run FLAGS -- CMD
  Args args(const Args& flags, const Args& cmd, const Args& globals = {}) const {
    Args a{jobguard_binary(), "--redis", url()};
    a.insert(a.end(), globals.begin(), globals.end());
    a.push_back("run");
    a.insert(a.end(), flags.begin(), flags.end());
    a.push_back("--");
    a.insert(a.end(), cmd.begin(), cmd.end());
    return a;
  }
  SubprocessResult run(const Args& flags, const Args& cmd, const Args& globals = {}) {
    Subprocess p(args(flags, cmd, globals));
    return p.wait_or_kill(30s);
  }
  // A shell command that writes `marker`, then waits until `go` exists.
  Args wait_for_go(const std::string& marker, const std::string& go, const std::string& then = "true") const {
    return {"sh", "-c", "echo started > \"$0\"; while [ ! -e \"$1\" ]; do sleep 0.01; done; " + then, marker, go};
  }
  void touch(const std::string& path) { std::ofstream(path) << "go\n"; }
  bool exists(const std::string& path) const { return std::filesystem::exists(path); }
};

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST_F(RunCli, CmdSeesKeyTokenAndFenceWhileTheLockHoldsTheToken) {
  const auto env = file("env"), go = file("go");
  Subprocess p(args({"--key", resource(), "--fence"},
                    {"sh", "-c",
                     "printf '%s\\n%s\\n%s\\n' \"$JOBGUARD_KEY\" \"$JOBGUARD_TOKEN\" \"$JOBGUARD_FENCE\" > \"$0.tmp\"; "
                     "mv \"$0.tmp\" \"$0\"; while [ ! -e \"$1\" ]; do sleep 0.01; done",
                     env, go}));
  ASSERT_TRUE(eventually([&] { return exists(env); }, 10s)) << p.err();
  std::istringstream in(read_file(env));
  std::string key, token, fence;
  std::getline(in, key);
  std::getline(in, token);
  std::getline(in, fence);
  EXPECT_EQ(key, lock_key());
  EXPECT_EQ(admin("GET " + key), token);  // the value CMD was told is the one in Redis
  EXPECT_FALSE(token.empty());
  ASSERT_FALSE(fence.empty());
  EXPECT_GT(std::stoll(fence), 0);
  touch(go);
  const auto r = p.wait_or_kill(30s);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");  // quiet on success
  EXPECT_EQ(admin("EXISTS " + key), "0");  // released when CMD ended
}

TEST_F(RunCli, NoFenceVariableWithoutFenceFlag) {
  const auto r = run({"--key", resource()}, {"sh", "-c", "[ -z \"${JOBGUARD_FENCE+set}\" ] && [ -n \"$JOBGUARD_TOKEN\" ]"});
  EXPECT_EQ(r.status, 0) << r.err;
}

// CLI11 reads "[b,c]" as a list; CMD must get its words untouched.
TEST_F(RunCli, CmdArgumentsReachCmdVerbatim) {
  const auto r = run({"--key", resource()}, {"printf", "%s|", "a", "[b,c]", "--key", "--", "-x", "[ x ]"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "a|[b,c]|--key|--|-x|[ x ]|");
}

TEST_F(RunCli, ExitsWithCmdsOwnStatus) {
  auto r = run({"--key", resource()}, {"sh", "-c", "exit 7"});
  EXPECT_EQ(r.status, 7) << r.err;
  r = run({"--key", resource()}, {"sh", "-c", "kill -USR1 $$"});
  EXPECT_EQ(r.status, 128 + SIGUSR1) << r.err;  // like a shell reports a signal death
  EXPECT_FALSE(r.signaled);
  EXPECT_EQ(admin("EXISTS " + lock_key()), "0");
}

TEST_F(RunCli, MissingCommandIs127AndReleasesTheLock) {
  const auto r = run({"--key", resource()}, {"jobguard-no-such-command-xyz"});
  EXPECT_EQ(r.status, 127) << r.err;
  EXPECT_NE(r.err.find("jobguard-no-such-command-xyz"), std::string::npos) << r.err;
  EXPECT_EQ(admin("EXISTS " + lock_key()), "0");
}

TEST_F(RunCli, SecondRunIsBusyWithoutWaitAndRunsAfterTheFirstWithWait) {
  const auto log = file("log"), started = file("started"), go = file("go");
  Subprocess holder(args({"--key", resource()}, wait_for_go(started, go, "echo first-end >> " + log)));
  ASSERT_TRUE(eventually([&] { return exists(started); }, 10s)) << holder.err();

  const auto busy = run({"--key", resource()}, {"sh", "-c", "echo second >> " + log});
  EXPECT_EQ(busy.status, 75) << busy.err;
  EXPECT_NE(busy.err.find("busy"), std::string::npos) << busy.err;
  EXPECT_EQ(count_lines(busy.err), 1) << busy.err;
  EXPECT_EQ(read_file(log), "");  // its CMD never ran

  Subprocess waiter(args({"--key", resource(), "--wait", "20s"}, {"sh", "-c", "echo third >> " + log}));
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(waiter.running());
  EXPECT_EQ(read_file(log), "");  // still excluded while the holder runs
  touch(go);
  const auto h = holder.wait_or_kill(30s);
  const auto w = waiter.wait_or_kill(30s);
  EXPECT_EQ(h.status, 0) << h.err;
  EXPECT_EQ(w.status, 0) << w.err;
  EXPECT_EQ(read_file(log), "first-end\nthird\n");
}

TEST_F(RunCli, WaitThatRunsOutIsBusy) {
  const auto started = file("started"), go = file("go");
  Subprocess holder(args({"--key", resource()}, wait_for_go(started, go)));
  ASSERT_TRUE(eventually([&] { return exists(started); }, 10s)) << holder.err();
  const auto r = run({"--key", resource(), "--wait", "200ms"}, {"true"});
  EXPECT_EQ(r.status, 75) << r.err;
  touch(go);
  EXPECT_EQ(holder.wait_or_kill(30s).status, 0);
}

TEST_F(RunCli, UsageErrorsAre64WithOneLineNamingTheProblem) {
  struct Case {
    Args argv;
    std::string names;
  };
  const std::vector<Case> cases{
      {{jobguard_binary(), "--redis", url(), "run", "--", "true"}, "--key"},
      {{jobguard_binary(), "--redis", url(), "run", "--key", "k"}, "CMD"},
      {{jobguard_binary(), "--redis", url(), "run", "--key", "k", "--ttl", "3x", "--", "true"}, "--ttl"},
      {{jobguard_binary(), "--redis", url(), "run", "--key", "k", "--wait", "soon", "--", "true"}, "--wait"},
      {{jobguard_binary(), "--redis", url(), "run", "--key", "k", "--ttl", "1ms", "--", "true"}, "--ttl"},
      {{jobguard_binary(), "--redis", "redis://127.0.0.1:99999", "run", "--key", "k", "--", "true"}, "99999"},
      {{jobguard_binary(), "--redis", url(), "run", "--key", "bad{key", "--", "true"}, "bad{key"},
      {{jobguard_binary(), "--redis", url(), "run", "--key", "k", "--class", "billing nightly", "--", "true"}, "--class"},
      {{jobguard_binary(), "--redis", url(), "run", "--key", "k", "--class", "a\nb", "--", "true"}, "a\\nb"},
      {{jobguard_binary(), "--redis", url(), "run", "--key", "k", "--class", "", "--", "true"}, "empty name"},
      {{jobguard_binary(), "--redis", url(), "run", "--key", "k", "--class", std::string(65, 'c'), "--", "true"},
       "longer than 64"},
  };
  for (const auto& c : cases) {
    Subprocess p(c.argv);
    const auto r = p.wait_or_kill(30s);
    EXPECT_EQ(r.status, 64) << c.names << ": " << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(c.names), std::string::npos) << r.err;
  }
}

// --class names the lock class the run's numbers are published under: the
// fleet's numbers that `jobguard stats` and `jobguard serve` report carry it,
// and the default class "run" got nothing from these runs.
TEST_F(RunCli, ClassNamesTheFleetNumbersThatStatsAndServeReport) {
  const auto started = file("started"), go = file("go");
  Subprocess holder(args({"--key", resource(), "--class", "billing-nightly.v2"}, wait_for_go(started, go)));
  ASSERT_TRUE(eventually([&] { return exists(started); }, 10s)) << holder.err();
  const auto busy = run({"--key", resource(), "--class", "billing-nightly.v2"}, {"true"}, {"--log-format", "json"});
  EXPECT_EQ(busy.status, 75) << busy.err;
  EXPECT_EQ(nlohmann::json::parse(busy.err).at("lock_class"), "billing-nightly.v2") << busy.err;
  touch(go);
  ASSERT_EQ(holder.wait_or_kill(30s).status, 0);

  const auto st = run_jobguard({"--redis", url(), "--json", "stats", "--window", "5m"});
  ASSERT_EQ(st.status, 0) << st.err;
  const auto j = nlohmann::json::parse(st.out);
  ASSERT_EQ(j.at("classes").size(), 1u) << st.out;
  const auto& c = j.at("classes").at(0);
  EXPECT_EQ(c.at("class"), "billing-nightly.v2");
  EXPECT_EQ(c.at("acquisitions"), 1);
  EXPECT_EQ(c.at("attempts"), 2);
  EXPECT_EQ(c.at("contended"), 1);
  EXPECT_EQ(c.at("releases"), 1);

  Subprocess serve({jobguard_binary(), "--redis", url(), "--json", "serve", "--listen", "127.0.0.1:0"});
  std::uint16_t port = 0;
  ASSERT_TRUE(eventually(
      [&] {
        const auto out = serve.out();
        if (out.find('\n') == std::string::npos) return false;
        port = nlohmann::json::parse(out.substr(0, out.find('\n'))).at("port").get<std::uint16_t>();
        return true;
      },
      20s))
      << serve.err();
  HttpResponse res;
  ASSERT_TRUE(eventually(
      [&] {
        res = http_request(port, "GET", "/metrics");
        return res.status == 200 && res.body.find("jobguard_fleet_up 1\n") != std::string::npos;
      },
      20s))
      << res.body;
  EXPECT_NE(res.body.find("jobguard_fleet_lock_acquisitions_total{class=\"billing-nightly.v2\"} 1\n"), std::string::npos)
      << res.body;
  EXPECT_NE(res.body.find("jobguard_fleet_lock_contended_total{class=\"billing-nightly.v2\"} 1\n"), std::string::npos);
  EXPECT_EQ(res.body.find("class=\"run\""), std::string::npos) << res.body;
  serve.signal(SIGTERM);
  EXPECT_EQ(serve.wait_or_kill(10s).status, 0);
}

TEST_F(RunCli, RedisDownIsUnavailableAndCmdDoesNotRun) {
  const auto marker = file("ran");
  const auto u = url();
  server->stop();
  Subprocess p({jobguard_binary(), "--redis", u, "run", "--key", resource(), "--", "sh", "-c", "echo > " + marker});
  const auto r = p.wait_or_kill(20s);
  EXPECT_EQ(r.status, 69) << r.err;
  EXPECT_NE(r.err.find("fail-closed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("refused"), std::string::npos) << r.err;  // says why
  EXPECT_FALSE(exists(marker));
}

TEST_F(RunCli, SigtermToJobguardReachesCmdWhichChoosesItsStatus) {
  const auto started = file("started");
  Subprocess p(args({"--key", resource()},
                    {"sh", "-c", "trap 'exit 3' TERM; echo > \"$0\"; while :; do sleep 0.05; done", started}));
  ASSERT_TRUE(eventually([&] { return exists(started); }, 10s)) << p.err();
  p.signal(SIGTERM);
  const auto r = p.wait_or_kill(30s);
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_EQ(admin("EXISTS " + lock_key()), "0");
}

TEST_F(RunCli, SigintToJobguardKillsAnUntrappingCmdAs130) {
  const auto started = file("started");
  Subprocess p(args({"--key", resource()}, {"sh", "-c", "echo > \"$0\"; exec sleep 30", started}));
  ASSERT_TRUE(eventually([&] { return exists(started); }, 10s)) << p.err();
  std::this_thread::sleep_for(50ms);  // let sh exec sleep
  p.signal(SIGINT);
  const auto r = p.wait_or_kill(30s);
  EXPECT_EQ(r.status, 128 + SIGINT) << r.err;
}

TEST_F(RunCli, LostLeaseKillsAGroupThatIgnoresSigterm) {
  const auto pidfile = file("pid");
  Subprocess p(args({"--key", resource(), "--ttl", "600ms", "--grace", "300ms"},
                    {"sh", "-c", "trap '' TERM; sleep 60 & echo $! > \"$0.tmp\"; mv \"$0.tmp\" \"$0\"; wait", pidfile}));
  ASSERT_TRUE(eventually([&] { return exists(pidfile); }, 10s)) << p.err();
  const pid_t sleeper = std::stoi(read_file(pidfile));
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(p.running());
  EXPECT_EQ(admin("DEL " + lock_key()), "1");  // someone force-released it
  // Renewal period (200ms) + grace (300ms) plus slack; CMD alone would run 60 s.
  const auto r = p.wait_or_kill(10s);
  EXPECT_EQ(r.status, 70) << r.err;
  EXPECT_NE(r.err.find("lost"), std::string::npos) << r.err;
  EXPECT_TRUE(eventually([&] { return process_gone(sleeper); }, 2s)) << "sleep " << sleeper << " survived";
}

TEST_F(RunCli, StoppedPastTheTtlReportsTheLeaseLostOnResume) {
  const auto started = file("started");
  Subprocess p(args({"--key", resource(), "--ttl", "500ms", "--grace", "1s"},
                    {"sh", "-c", "echo > \"$0\"; exec sleep 30", started}));
  ASSERT_TRUE(eventually([&] { return exists(started); }, 10s)) << p.err();
  p.signal(SIGSTOP);
  // The key expires while jobguard cannot renew it.
  EXPECT_TRUE(eventually([&] { return admin("EXISTS " + lock_key()) == "0"; }, 5s));
  std::this_thread::sleep_for(200ms);
  p.signal(SIGCONT);
  const auto r = p.wait_or_kill(10s);  // not after CMD's 30 s
  EXPECT_EQ(r.status, 70) << r.err;
  EXPECT_NE(r.err.find("lost"), std::string::npos) << r.err;
}

TEST_F(RunCli, HardTimeoutIs124) {
  const auto r = run({"--key", resource(), "--timeout", "300ms", "--grace", "200ms"}, {"sleep", "30"});
  EXPECT_EQ(r.status, 124) << r.err;
  EXPECT_NE(r.err.find("timeout"), std::string::npos) << r.err;
  EXPECT_EQ(admin("EXISTS " + lock_key()), "0");
}

TEST_F(RunCli, HardTimeoutKillsACmdThatIgnoresSigtermAfterGrace) {
  const auto r = run({"--key", resource(), "--timeout", "200ms", "--grace", "200ms"},
                     {"sh", "-c", "trap '' TERM; sleep 30 & wait"});
  EXPECT_EQ(r.status, 124) << r.err;
}

TEST_F(RunCli, OnceRunsCmdOnceAndSkipsTheRepeat) {
  const auto count = file("count");
  const Args cmd{"sh", "-c", "echo ran >> " + count};
  auto r = run({"--key", resource(), "--once", "run-1"}, cmd);
  EXPECT_EQ(r.status, 0) << r.err;
  r = run({"--key", resource(), "--once", "run-1"}, cmd);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("already done"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(count), "ran\n");
  // Another run id is another unit of work.
  r = run({"--key", resource(), "--once", "run-2"}, cmd);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_file(count), "ran\nran\n");
}

TEST_F(RunCli, OnceRecordsNothingWhenCmdFails) {
  const auto count = file("count");
  auto r = run({"--key", resource(), "--once", "r"}, {"sh", "-c", "echo try >> " + count + "; exit 2"});
  EXPECT_EQ(r.status, 2) << r.err;
  r = run({"--key", resource(), "--once", "r"}, {"sh", "-c", "echo try >> " + count});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_file(count), "try\ntry\n");
}

#ifndef JOBGUARD_TESTS_WITHOUT_POSTGRES
TEST_F(RunCli, OnceUsesPostgresWhenGiven) {
  auto& pg = shared_postgres();
  guard::pg_migrate(pg.url());
  const auto count = file("count");
  const Args cmd{"sh", "-c", "echo ran >> " + count};
  const Args globals{"--postgres", pg.url()};
  auto r = run({"--key", resource(), "--once", "pg-run"}, cmd, globals);
  EXPECT_EQ(r.status, 0) << r.err;
  r = run({"--key", resource(), "--once", "pg-run"}, cmd, globals);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("already done"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(count), "ran\n");
  // The record is in PostgreSQL, not in Redis: the Redis backend has not seen it.
  r = run({"--key", resource(), "--once", "pg-run"}, cmd);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_file(count), "ran\nran\n");
}
#else
// A Redis-only build: records meant for PostgreSQL are refused (78, CMD not
// run), never kept in Redis instead.
TEST_F(RunCli, OnceWithPostgresIsRefusedNotRecordedInRedis) {
  const auto count = file("count");
  const Args cmd{"sh", "-c", "echo ran >> " + count};
  auto r = run({"--key", resource(), "--once", "pg-run"}, cmd, {"--postgres", "postgresql://postgres@127.0.0.1:1/db"});
  EXPECT_EQ(r.status, 78) << r.err;
  EXPECT_NE(r.err.find("--once with --postgres (or $JOBGUARD_POSTGRES_URL) needs PostgreSQL"), std::string::npos)
      << r.err;
  EXPECT_EQ(read_file(count), "");
  r = run({"--key", resource(), "--once", "pg-run"}, cmd);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err.find("already done"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(count), "ran\n");
}
#endif

TEST_F(RunCli, JsonLogIsOneObjectPerLineWithKeyJobAndEvent) {
  // Renewed at a third of the TTL (200 ms), so the 0.5 s CMD sees one or
  // two; a TTL this long is lost only to a stall of ~400 ms, not to a
  // sanitizer build on a busy host.
  const auto r = run({"--key", resource(), "--job-id", "job-7", "--ttl", "600ms"}, {"sleep", "0.5"},
                     {"--log-format", "json"});
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<std::string> events;
  std::istringstream in(r.err);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);  // throws (fails the test) on a non-JSON line
    EXPECT_EQ(j.at("lock_key"), lock_key());
    EXPECT_EQ(j.at("job_id"), "job-7");
    EXPECT_TRUE(j.contains("elapsed_ms")) << line;
    events.push_back(j.at("event"));
  }
  ASSERT_GE(events.size(), 3u) << r.err;
  EXPECT_EQ(events.front(), "acquired");
  EXPECT_EQ(events.back(), "released");
  EXPECT_NE(std::find(events.begin(), events.end(), "renewed"), events.end()) << r.err;
}

TEST_F(RunCli, JsonLogReportsBusyAndErrorsAsJson) {
  const auto started = file("started"), go = file("go");
  Subprocess holder(args({"--key", resource()}, wait_for_go(started, go)));
  ASSERT_TRUE(eventually([&] { return exists(started); }, 10s)) << holder.err();
  const auto r = run({"--key", resource()}, {"true"}, {"--log-format", "json"});
  EXPECT_EQ(r.status, 75) << r.err;
  ASSERT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.err).at("event"), "busy");
  touch(go);
  EXPECT_EQ(holder.wait_or_kill(30s).status, 0);
}

TEST_F(RunCli, HelpDocumentsEveryExitStatus) {
  const auto r = run_jobguard({"run", "--help"});
  EXPECT_EQ(r.status, 0);
  for (const char* s : {"--key", "--ttl", "--wait", "--timeout", "--grace", "--fence", "--once", "JOBGUARD_KEY",
                        "JOBGUARD_TOKEN", "JOBGUARD_FENCE", "--class", "64", "69", "70", "75", "124", "128+N"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
}

}  // namespace
}  // namespace jobguard::test
