// job::Supervisor with real child processes: several CMDs on one loop, each
// outcome, the one guardian that kills every CMD's group when its owner dies.
#include "jobguard/job/supervisor.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <optional>
#include <string>
#include <thread>

#include "job/group_guardian.hpp"
#include "support/redis_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using job::Ending;
using job::CmdOutcome;
using job::Supervisor;
using job::SupervisorEvent;
using job::SupervisorOptions;
namespace asio = boost::asio;

class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/jobguard-supervisor.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string file(const std::string& name) const { return dir_ + "/" + name; }
  static SupervisorOptions sh(const std::string& script, std::vector<std::string> args = {}) {
    SupervisorOptions o;
    o.argv = {"sh", "-c", script};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    o.grace = 300ms;
    return o;
  }
  // Runs `ctx` until every outcome is in (or a generous deadline: a hang).
  static void run_until(asio::io_context& ctx, const std::function<bool()>& done) {
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (!done() && std::chrono::steady_clock::now() < until) ctx.run_for(50ms);
  }
  std::string dir_;
};

TEST_F(SupervisorTest, SeveralChildrenOnOneLoopEachGetTheirOwnOutcome) {
  asio::io_context ctx;
  std::optional<CmdOutcome> exited, timed_out, lost, stopped, missing;
  auto timeout = sh("exec sleep 30");
  timeout.timeout = 200ms;
  // It says when its trap is set: a SIGTERM before that would end it, and
  // the SIGKILL after the grace would never be needed (a loaded host can
  // deliver it before the trap is set).
  const std::string trapped = file("stubborn-trapped");
  auto stubborn = sh("trap '' TERM; : > \"$0\"; while :; do sleep 0.05; done", {trapped});
  auto stops_itself = sh("kill -STOP $$; exit 9");
  SupervisorOptions nowhere;
  nowhere.argv = {"/nonexistent/jobguard-test-cmd"};
  Supervisor a(ctx.get_executor(), sh("exit 3"), [&](const CmdOutcome& o) { exited = o; });
  Supervisor b(ctx.get_executor(), timeout, [&](const CmdOutcome& o) { timed_out = o; });
  Supervisor c(ctx.get_executor(), stubborn, [&](const CmdOutcome& o) { lost = o; });
  Supervisor d(ctx.get_executor(), stops_itself, [&](const CmdOutcome& o) { stopped = o; });
  Supervisor e(ctx.get_executor(), nowhere, [&](const CmdOutcome& o) { missing = o; });
  EXPECT_EQ(a.pgid(), a.pid()) << "CMD leads its own group";
  EXPECT_NE(a.pgid(), b.pgid());
  // One guardian for all of them, in no CMD's group (its own session): a
  // signal to a group, or to ours, must not take it away.
  const pid_t guardian = job::detail::guardian_pid();
  ASSERT_GT(guardian, 0);
  EXPECT_EQ(::getsid(guardian), guardian);
  for (auto* s : {&a, &b, &c, &d}) EXPECT_NE(::getpgid(guardian), s->pgid());
  run_until(ctx, [&] { return std::filesystem::exists(trapped); });
  ASSERT_TRUE(std::filesystem::exists(trapped)) << "the stubborn CMD never set its trap";
  c.stop(Ending::lease_lost, "lease on k lost");
  run_until(ctx, [&] { return exited && timed_out && lost && stopped && missing; });

  ASSERT_TRUE(exited && timed_out && lost && stopped && missing);
  EXPECT_EQ(exited->ending, Ending::exited);
  EXPECT_EQ(exited->status.shell_status(), 3);
  EXPECT_EQ(timed_out->ending, Ending::timed_out);
  EXPECT_EQ(timed_out->status.signal, SIGTERM);
  EXPECT_EQ(lost->ending, Ending::lease_lost);
  EXPECT_EQ(lost->status.signal, SIGKILL) << "SIGTERM was ignored: SIGKILL after the grace";
  EXPECT_NE(lost->describe().find("lease on k lost"), std::string::npos) << lost->describe();
  EXPECT_EQ(stopped->ending, Ending::stopped);
  EXPECT_EQ(stopped->signal, SIGSTOP);
  EXPECT_EQ(missing->ending, Ending::failed_to_start);
  EXPECT_EQ(missing->error, ENOENT);
  EXPECT_NE(missing->detail.find("/nonexistent/jobguard-test-cmd"), std::string::npos) << missing->detail;
  for (auto* s : {&a, &b, &c, &d}) EXPECT_TRUE(process_gone(s->pgid())) << "CMD " << s->pgid();
  EXPECT_EQ(job::detail::guardian_pid(), guardian) << "the same guardian serves the next CMD";
  EXPECT_FALSE(process_gone(guardian));
}

TEST_F(SupervisorTest, ForwardedSignalReachesTheGroupAndEscalates) {
  asio::io_context ctx;
  const auto got = file("got"), ready = file("ready");
  std::optional<CmdOutcome> handled, ignored;
  Supervisor a(ctx.get_executor(),
               sh("trap 'echo USR1 > \"$0\"; exit 4' USR1; echo > \"$0.a\"; while :; do sleep 0.05; done", {got}),
               [&](const CmdOutcome& o) { handled = o; });
  Supervisor b(ctx.get_executor(), sh("trap '' USR2; echo > \"$0\"; while :; do sleep 0.05; done", {ready}),
               [&](const CmdOutcome& o) { ignored = o; });
  // Both shells have their traps (a signal before that kills sh by default).
  run_until(ctx, [&] { return std::filesystem::exists(got + ".a") && std::filesystem::exists(ready); });
  a.forward(SIGUSR1);
  b.forward(SIGUSR2);
  run_until(ctx, [&] { return handled && ignored; });
  ASSERT_TRUE(handled && ignored);
  EXPECT_EQ(handled->ending, Ending::signaled);
  EXPECT_EQ(handled->signal, SIGUSR1);
  EXPECT_EQ(handled->status.shell_status(), 4);
  EXPECT_EQ(read_file(got), "USR1\n");
  EXPECT_EQ(ignored->ending, Ending::signaled);
  EXPECT_EQ(ignored->status.signal, SIGKILL);
}

TEST_F(SupervisorTest, StoppedChildContinuedWithinTheGraceRunsToItsEnd) {
  asio::io_context ctx;
  std::optional<CmdOutcome> out;
  std::vector<SupervisorEvent::Kind> events;
  auto o = sh("kill -STOP $$; exit 5");
  o.grace = 20s;
  std::unique_ptr<Supervisor> s;
  s = std::make_unique<Supervisor>(
      ctx.get_executor(), o, [&](const CmdOutcome& r) { out = r; },
      [&](const SupervisorEvent& ev) {
        events.push_back(ev.kind);
        if (ev.kind == SupervisorEvent::Kind::suspended) ::kill(s->pid(), SIGCONT);
      });
  run_until(ctx, [&] { return out.has_value(); });
  ASSERT_TRUE(out);
  EXPECT_EQ(out->ending, Ending::exited);
  EXPECT_EQ(out->status.shell_status(), 5);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0], SupervisorEvent::Kind::suspended);
  EXPECT_EQ(events[1], SupervisorEvent::Kind::resumed);
}

TEST_F(SupervisorTest, WhatCmdLeavesInItsGroupDiesBeforeTheOutcome) {
  asio::io_context ctx;
  const auto pidfile = file("pid");
  std::optional<CmdOutcome> out;
  Supervisor s(ctx.get_executor(), sh("sleep 300 & echo $! > \"$0\"", {pidfile}), [&](const CmdOutcome& o) { out = o; });
  run_until(ctx, [&] { return out.has_value(); });
  ASSERT_TRUE(out);
  EXPECT_EQ(out->status.shell_status(), 0);
  const pid_t bg = std::stoi(read_file(pidfile));
  EXPECT_TRUE(eventually([&] { return process_gone(bg); }, 5s)) << "sleep " << bg << " outlived the job";
}

TEST_F(SupervisorTest, RemoteStopFromAnotherThreadAndAfterTheEndIsSafe) {
  asio::io_context ctx;
  std::optional<CmdOutcome> out;
  Supervisor::RemoteStop stop;
  {
    Supervisor s(ctx.get_executor(), sh("exec sleep 30"), [&](const CmdOutcome& o) { out = o; });
    stop = s.remote_stop();
    std::thread other([&] { stop(Ending::lease_lost, "lost on the client's loop"); });
    run_until(ctx, [&] { return out.has_value(); });
    other.join();
  }
  ASSERT_TRUE(out);
  EXPECT_EQ(out->ending, Ending::lease_lost);
  EXPECT_EQ(out->detail, "lost on the client's loop");
  stop(Ending::lease_lost, "too late");  // the Supervisor is gone: a no-op
  ctx.restart();
  ctx.poll();
}

TEST_F(SupervisorTest, DestroyedBeforeTheEndKillsTheGroup) {
  asio::io_context ctx;
  const auto pidfile = file("pid");
  pid_t sh_pid = -1, guardian = -1;
  {
    Supervisor s(ctx.get_executor(), sh("echo $$ > \"$0\"; exec sleep 30", {pidfile}), [](const CmdOutcome&) {});
    sh_pid = s.pid();
    guardian = s.pgid();
    run_until(ctx, [&] { return !read_file(pidfile).empty(); });
  }
  EXPECT_TRUE(process_gone(sh_pid));
  EXPECT_TRUE(process_gone(guardian));
}

TEST_F(SupervisorTest, EnvironmentWithholdsUrlsAndPasswords) {
  ::setenv("JOBGUARD_REDIS_URL", "redis://:pw@h:1/0", 1);
  ::setenv("JOBGUARD_PG_PASSWORD", "pw", 1);
  ::setenv("JOBGUARD_OTHER", "kept", 1);
  const auto env = job::child_environment({{"JOBGUARD_KEY", "k"}});
  ::unsetenv("JOBGUARD_REDIS_URL");
  ::unsetenv("JOBGUARD_PG_PASSWORD");
  ::unsetenv("JOBGUARD_OTHER");
  auto has = [&](const std::string& prefix) {
    return std::any_of(env.begin(), env.end(), [&](const std::string& e) { return e.rfind(prefix, 0) == 0; });
  };
  EXPECT_FALSE(has("JOBGUARD_REDIS_URL="));
  EXPECT_FALSE(has("JOBGUARD_PG_PASSWORD="));
  EXPECT_TRUE(has("JOBGUARD_OTHER=kept"));
  EXPECT_TRUE(has("JOBGUARD_KEY=k"));
}

// The guarantee at its root: the owner dies of SIGKILL (no destructor, no
// handler runs) and the guardian still kills every CMD's whole group. The
// owner is a fork of this test process, which may have a guardian of its own
// already: the fork must start its own (this one would never see EOF).
TEST_F(SupervisorTest, GuardianKillsEveryGroupWhenTheOwnerIsKilled) {
  const pid_t ours = job::detail::guardian_pid();
  const auto pidfile = file("pid");
  const pid_t owner = ::fork();
  ASSERT_GE(owner, 0);
  if (owner == 0) {
    asio::io_context ctx;
    std::vector<std::unique_ptr<Supervisor>> all;
    for (int i = 0; i < 3; ++i) {
      const auto f = pidfile + std::to_string(i);
      all.push_back(std::make_unique<Supervisor>(
          ctx.get_executor(), sh("sleep 300 & echo $! > \"$0.bg\"; echo $$ > \"$0.tmp\"; mv \"$0.tmp\" \"$0\"; wait", {f}),
          [](const CmdOutcome&) {}));
    }
    {
      std::ofstream g(pidfile + ".g.tmp");
      g << job::detail::guardian_pid();
    }
    std::filesystem::rename(pidfile + ".g.tmp", pidfile + ".g");
    ctx.run();
    ::_exit(0);
  }
  std::vector<pid_t> cmds, bgs;
  for (int i = 0; i < 3; ++i) {
    const auto f = pidfile + std::to_string(i);
    ASSERT_TRUE(eventually([&] { return !read_file(f).empty() && !read_file(f + ".bg").empty(); }, 10s));
    cmds.push_back(std::stoi(read_file(f)));
    bgs.push_back(std::stoi(read_file(f + ".bg")));
  }
  ASSERT_TRUE(eventually([&] { return !read_file(pidfile + ".g").empty(); }, 10s));
  const pid_t theirs = std::stoi(read_file(pidfile + ".g"));
  EXPECT_GT(theirs, 0);
  EXPECT_NE(theirs, ours) << "the fork started a guardian of its own";
  ::kill(owner, SIGKILL);
  int st = 0;
  ASSERT_EQ(::waitpid(owner, &st, 0), owner);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(eventually([&] { return process_gone(cmds[i]); }, 10s)) << "CMD " << cmds[i] << " outlived its owner";
    EXPECT_TRUE(eventually([&] { return process_gone(bgs[i]); }, 10s)) << "grandchild " << bgs[i] << " outlived its owner";
  }
  EXPECT_TRUE(eventually([&] { return process_gone(theirs); }, 10s)) << "the guardian outlived its duty";
  if (ours > 0) {
    EXPECT_FALSE(process_gone(ours)) << "the test process's own guardian was not theirs to end";
  }
}

// A guardian that was killed is replaced at the next CMD, and the groups it
// listed are listed with the new one: the owner's death then still kills the
// CMD that started before the replacement.
TEST_F(SupervisorTest, AKilledGuardianIsReplacedWithEveryLiveGroup) {
  const auto pidfile = file("pid");
  const pid_t owner = ::fork();
  ASSERT_GE(owner, 0);
  if (owner == 0) {
    asio::io_context ctx;
    auto script = sh("sleep 300 & echo $! > \"$0.bg\"; echo $$ > \"$0.tmp\"; mv \"$0.tmp\" \"$0\"; wait", {pidfile + "a"});
    Supervisor first(ctx.get_executor(), script, [](const CmdOutcome&) {});
    const pid_t g1 = job::detail::guardian_pid();
    ::kill(g1, SIGKILL);
    // Its end closes as it dies (a zombie until the replacement reaps it).
    while (!process_gone(g1)) std::this_thread::sleep_for(1ms);
    script.argv.back() = pidfile + "b";
    Supervisor second(ctx.get_executor(), script, [](const CmdOutcome&) {});
    {
      std::ofstream g(pidfile + ".g.tmp");
      g << g1 << ' ' << job::detail::guardian_pid();
    }
    std::filesystem::rename(pidfile + ".g.tmp", pidfile + ".g");
    ctx.run();
    ::_exit(0);
  }
  ASSERT_TRUE(eventually([&] { return !read_file(pidfile + ".g").empty(); }, 10s));
  pid_t g1 = -1, g2 = -1;
  std::istringstream(read_file(pidfile + ".g")) >> g1 >> g2;
  EXPECT_GT(g2, 0);
  EXPECT_NE(g1, g2);
  std::vector<pid_t> procs;
  for (const char* n : {"a", "b"}) {
    const auto f = pidfile + n;
    ASSERT_TRUE(eventually([&] { return !read_file(f).empty() && !read_file(f + ".bg").empty(); }, 10s));
    procs.push_back(std::stoi(read_file(f)));
    procs.push_back(std::stoi(read_file(f + ".bg")));
  }
  ::kill(owner, SIGKILL);
  int st = 0;
  ASSERT_EQ(::waitpid(owner, &st, 0), owner);
  for (const pid_t p : procs) EXPECT_TRUE(eventually([&] { return process_gone(p); }, 10s)) << p << " outlived its owner";
  EXPECT_TRUE(eventually([&] { return process_gone(g2); }, 10s));
}

}  // namespace
}  // namespace jobguard::test
