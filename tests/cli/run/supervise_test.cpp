// `jobguard run` supervising CMD, as users meet it: CMD never outlives
// jobguard (kill -9, a closed pipe), every terminating signal is forwarded and
// escalated, a stopped CMD does not hold the lock for ever, --foreground, and
// what CMD's environment does not carry. The real binary, a real redis-server.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "support/cli_fixture.hpp"
#include "support/pty.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;

class RunSupervision : public CliTest {
 protected:
  std::string resource() const {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return fmt::format("t:{}", info->name());
  }
  std::string lock_key() const { return "jobguard:lock:{" + resource() + "}"; }
  Args args(const Args& flags, const Args& cmd) const {
    Args a{jobguard_binary(), "--redis", url(), "run", "--key", resource()};
    a.insert(a.end(), flags.begin(), flags.end());
    a.push_back("--");
    a.insert(a.end(), cmd.begin(), cmd.end());
    return a;
  }
  bool exists(const std::string& path) const { return std::filesystem::exists(path); }
  // A pid written by CMD (written to a temporary name first, so it is whole).
  pid_t read_pid(const std::string& path) const { return static_cast<pid_t>(std::stol(read_file(path))); }
  void touch(const std::string& path) { std::ofstream(path) << "go\n"; }
};

// CMD writes its shell's pid to $0 and a background grandchild's to $0.bg.
Args shell_with_grandchild(const std::string& pidfile) {
  return {"sh", "-c",
          "sleep 300 & echo $! > \"$0.bg.tmp\"; mv \"$0.bg.tmp\" \"$0.bg\"; echo $$ > \"$0.tmp\"; mv \"$0.tmp\" \"$0\"; "
          "wait",
          pidfile};
}

TEST_F(RunSupervision, Kill9OfJobguardKillsCmdAndItsGrandchildLongBeforeTheTtl) {
  const auto pidfile = file("pid");
  Subprocess p(args({"--ttl", "60s"}, shell_with_grandchild(pidfile)));
  ASSERT_TRUE(eventually([&] { return exists(pidfile) && exists(pidfile + ".bg"); }, 10s)) << p.err();
  const pid_t sh = read_pid(pidfile), bg = read_pid(pidfile + ".bg");
  p.signal(SIGKILL);
  EXPECT_EQ(p.wait_or_kill(10s).status, 128 + SIGKILL);
  // The lease would stay for 60 s; CMD must be gone long before.
  EXPECT_TRUE(eventually([&] { return process_gone(sh); }, 10s)) << "CMD " << sh << " outlived jobguard";
  EXPECT_TRUE(eventually([&] { return process_gone(bg); }, 10s)) << "grandchild " << bg << " outlived jobguard";
}

TEST_F(RunSupervision, PipedIntoHeadJobguardSurvivesItsClosedPipeReleasesAndCmdIsGone) {
  const auto pidfile = file("pid"), status = file("status");
  // Both CMD's output and jobguard's log go into the pipe: once head has
  // exited, jobguard's next log line meets a closed pipe (SIGPIPE).
  const std::string jg = fmt::format("{} --log-format human --redis {} run --key {} -- sh -c 'echo $$ > {}; exec yes'",
                                     jobguard_binary(), url(), resource(), pidfile);
  Subprocess p({"sh", "-c", fmt::format("({} 2>&1; echo $? > {}) | head -1", jg, status)});
  const auto r = p.wait_or_kill(30s);
  EXPECT_EQ(r.status, 0) << r.err;
  ASSERT_TRUE(eventually([&] { return !read_file(status).empty(); }, 10s));
  EXPECT_EQ(std::stoi(read_file(status)), 128 + SIGPIPE) << "jobguard reports CMD's death by SIGPIPE, it does not die of it";
  EXPECT_TRUE(eventually([&] { return process_gone(read_pid(pidfile)); }, 10s));
  EXPECT_EQ(admin("EXISTS " + lock_key()), "0") << "the lock was released";
}

TEST_F(RunSupervision, SigpipeSentToJobguardIsIgnored) {
  const auto started = file("started"), go = file("go");
  Subprocess p(args({}, {"sh", "-c", "echo > \"$0\"; while [ ! -e \"$1\" ]; do sleep 0.01; done", started, go}));
  ASSERT_TRUE(eventually([&] { return exists(started); }, 10s)) << p.err();
  p.signal(SIGPIPE);
  touch(go);
  EXPECT_EQ(p.wait_or_kill(30s).status, 0);
}

TEST_F(RunSupervision, EveryTerminatingSignalIsForwardedToCmd) {
  for (const auto& [sig, name] : std::vector<std::pair<int, std::string>>{{SIGHUP, "HUP"},
                                                                          {SIGINT, "INT"},
                                                                          {SIGQUIT, "QUIT"},
                                                                          {SIGUSR1, "USR1"},
                                                                          {SIGUSR2, "USR2"},
                                                                          {SIGALRM, "ALRM"},
                                                                          {SIGTERM, "TERM"}}) {
    const auto got = file("got-" + name), started = got + ".started";
    Subprocess p(args({}, {"sh", "-c",
                           "trap 'echo $1 > \"$0\"; exit 3' $1; echo > \"$0.started\"; while :; do sleep 0.05; done",
                           got, name}));
    ASSERT_TRUE(eventually([&] { return exists(started); }, 10s)) << name << ": " << p.err();
    p.signal(sig);
    const auto r = p.wait_or_kill(30s);
    EXPECT_EQ(r.status, 3) << name << ": " << r.err;  // CMD's own status: it handled the signal
    EXPECT_EQ(read_file(got), name + "\n") << name;
    EXPECT_EQ(admin("EXISTS " + lock_key()), "0") << name;
  }
}

TEST_F(RunSupervision, ForwardedSignalIsEscalatedToSigkillAfterGrace) {
  const auto started = file("started");
  // The ignored SIGTERM is inherited by the loop's sleeps too.
  Subprocess p(args({"--grace", "300ms"},
                    {"sh", "-c", "trap '' TERM; echo > \"$0\"; while :; do sleep 0.05; done", started}));
  ASSERT_TRUE(eventually([&] { return exists(started); }, 10s)) << p.err();
  p.signal(SIGTERM);
  const auto r = p.wait_or_kill(20s);  // CMD alone would run for ever
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.err;
  EXPECT_EQ(admin("EXISTS " + lock_key()), "0");
}

TEST_F(RunSupervision, CmdReadingTheTerminalFromTheBackgroundIsReportedStoppedAndReleased) {
  const auto started = file("started"), out = file("out");
  PtyProcess p(args({"--grace", "300ms", "--ttl", "60s"},
                    {"sh", "-c", "echo > \"$0\"; read x; echo \"got:$x\" > \"$1\"", started, out}));
  const auto status = p.wait_for(30s);  // not the TTL: the lock is not held for ever
  ASSERT_TRUE(status.has_value()) << p.screen();
  EXPECT_EQ(*status, 128 + SIGTTIN) << p.screen();
  EXPECT_NE(p.screen().find("stopped by SIGTTIN"), std::string::npos) << p.screen();
  EXPECT_NE(p.screen().find("--foreground"), std::string::npos) << p.screen();
  EXPECT_FALSE(exists(out));
  EXPECT_EQ(admin("EXISTS " + lock_key()), "0");
}

TEST_F(RunSupervision, ForegroundCmdReadsTheTerminal) {
  const auto started = file("started"), out = file("out");
  PtyProcess p(args({"--foreground", "--grace", "300ms"},
                    {"sh", "-c", "echo > \"$0\"; read x; echo \"got:$x\" > \"$1\"", started, out}));
  ASSERT_TRUE(eventually([&] { return exists(started); }, 10s)) << p.screen();
  p.write("hello\n");
  const auto status = p.wait_for(30s);
  ASSERT_TRUE(status.has_value()) << p.screen();
  EXPECT_EQ(*status, 0) << p.screen();
  EXPECT_EQ(read_file(out), "got:hello\n");
  EXPECT_EQ(admin("EXISTS " + lock_key()), "0");
}

TEST_F(RunSupervision, ForegroundWithoutATerminalIsAUsageError) {
  Subprocess p(args({"--foreground"}, {"true"}));
  const auto r = p.wait_or_kill(30s);
  EXPECT_EQ(r.status, 64) << r.err;
  EXPECT_NE(r.err.find("--foreground"), std::string::npos) << r.err;
}

TEST_F(RunSupervision, CmdWithoutDashDashIsAUsageError) {
  const auto marker = file("ran");
  Subprocess p({jobguard_binary(), "--redis", url(), "run", "--key", resource(), "touch", marker});
  const auto r = p.wait_or_kill(30s);
  EXPECT_EQ(r.status, 64) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("`--`"), std::string::npos) << r.err;
  EXPECT_FALSE(exists(marker));
}

TEST_F(RunSupervision, CmdEnvironmentLacksUrlsAndPasswords) {
  const auto envfile = file("env");
  Subprocess p(args({}, {"sh", "-c", "env > \"$0\"", envfile}),
               {{"JOBGUARD_REDIS_URL", url()},
                {"JOBGUARD_POSTGRES_URL", "postgresql://u:sekrit@127.0.0.1:1/db"},
                {"JOBGUARD_POSTGRES_PASSWORD", "hunter2"},  // (jobguard itself reads $JOBGUARD_REDIS_PASSWORD)
                {"JOBGUARD_UNRELATED", "kept"}});
  const auto r = p.wait_or_kill(30s);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto env = read_file(envfile);
  EXPECT_EQ(env.find("JOBGUARD_REDIS_URL"), std::string::npos) << env;
  EXPECT_EQ(env.find("JOBGUARD_POSTGRES_URL"), std::string::npos) << env;
  EXPECT_EQ(env.find("hunter2"), std::string::npos) << env;
  EXPECT_NE(env.find("JOBGUARD_UNRELATED=kept"), std::string::npos) << env;
  EXPECT_NE(env.find("JOBGUARD_KEY=" + lock_key()), std::string::npos) << env;
}

TEST_F(RunSupervision, WhatCmdLeavesInItsGroupIsKilledBeforeTheRelease) {
  const auto pidfile = file("pid");
  const auto r = [&] {
    Subprocess p(args({}, {"sh", "-c", "sleep 300 & echo $! > \"$0\"", pidfile}));
    return p.wait_or_kill(30s);
  }();
  EXPECT_EQ(r.status, 0) << r.err;
  // SIGKILLed before jobguard exited; dying takes the kernel a moment.
  EXPECT_TRUE(eventually([&] { return process_gone(read_pid(pidfile)); }, 5s));
}

}  // namespace
}  // namespace jobguard::test
