// Faults on a real redis-server: kill -9 mid-pipeline, a server that is down,
// a stalled server (CLIENT PAUSE, DEBUG SLEEP).
#include <gtest/gtest.h>

#include <boost/asio/post.hpp>
#include <future>

#include <atomic>
#include <mutex>
#include <thread>

#include "helpers.hpp"
#include "support/redis_fixture.hpp"

using namespace jobguard;
using namespace jobguard::redis;
using namespace jobguard::test;

class RedisFaults : public jobguard::test::RedisTest {
 protected:
  // Replaces the fixture's server with one started with `extra_args`.
  void restart_server_with(std::vector<std::string> extra_args) {
    EmbeddedRedisOptions so;
    so.extra_args = std::move(extra_args);
    server = std::make_unique<EmbeddedRedis>(so);
    server->start();
  }

  // Issues ECHO calls with distinct payloads; returns their futures.
  static std::vector<std::future<Reply>> echoes(Client& c, const std::string& prefix, int n, Ms timeout) {
    std::vector<std::future<Reply>> fs;
    CallOptions co;
    co.timeout = timeout;
    for (int i = 0; i < n; ++i) fs.push_back(c.exec_future(Command{"ECHO", prefix + std::to_string(i)}, co));
    return fs;
  }

  // A stalled server: calls time out at their deadline, the late replies
  // are discarded, and the same connection then serves fresh calls with
  // their own replies. The stall is long against the deadline so that a
  // loaded machine (sanitizers, parallel tests) cannot blur the two: a call
  // answered after the stall would succeed, so errc::timeout proves the
  // deadline fired while the server was stalled.
  void expect_deadlines_then_recovery(Client& c, const std::function<void()>& stall) {
    const Ms deadline(250);
    stall();
    const auto t0 = SteadyClock::now();
    auto late = echoes(c, "late-", 50, deadline);
    for (auto& f : late) {
      const Error e = error_of([&] { f.get(); });
      EXPECT_EQ(e.code(), errc::timeout) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.address()), std::string::npos) << e.what();
    }
    EXPECT_GE(since(t0), deadline) << "a call failed before its deadline";
    EXPECT_GE(c.stats().timeouts, 50u);

    // Issued while the server is still stalled; answered after it wakes up,
    // right behind the 50 late replies that must be thrown away.
    auto fresh = echoes(c, "fresh-", 50, Ms(10000));
    for (int i = 0; i < 50; ++i) EXPECT_EQ(fresh[static_cast<std::size_t>(i)].get().str, "fresh-" + std::to_string(i));
    EXPECT_EQ(c.exec(Command{"ECHO", "after"}).str, "after");
    EXPECT_EQ(c.stats().reconnects, 0u) << "a slow server is not a broken connection";
  }
};

TEST_F(RedisFaults, ServerKilledMidPipelineFailsEveryPendingCallPromptlyThenClientRecovers) {
  auto o = options();
  o.command_timeout = Ms(20000);  // "promptly" must mean long before this
  Client c(o);
  ASSERT_TRUE(c.wait_connected(Ms(5000)));
  // Hold replies back so thousands of calls are really in flight at the kill.
  ASSERT_EQ(admin("CLIENT PAUSE 20000 ALL"), "OK");

  constexpr int kThreads = 4, kPerThread = 1500, kCalls = kThreads * kPerThread;
  std::atomic<int> done{0};
  std::mutex mu;
  std::vector<std::string> unexpected;  // anything but connection_lost
  std::string sample;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i)
        c.async_exec(Command{"SET", key(std::to_string(t) + ":" + std::to_string(i)), "v"},
                     [&](std::error_code ec, Reply r) {
                       std::lock_guard lock(mu);
                       if (ec != errc::connection_lost) unexpected.push_back(ec.message() + ": " + r.str);
                       else if (sample.empty()) sample = Error(ec, r.str).what();
                       ++done;
                     });
    });
  for (auto& t : ts) t.join();
  // Every call is submitted; the first batch has left. Automatic pipelining
  // may put all 6000 in that one write (a busy host runs the four producers
  // before the loop), so wait for one write, not two, then let the rest of
  // the batches reach the socket.
  ASSERT_TRUE(eventually([&] { return c.stats().writes >= 1; }));
  std::this_thread::sleep_for(Ms(100));
  // Calls made off the loop are posted to it: once a handler posted now has
  // run, every call before it is on the live connection (written or queued
  // to be), which the kill fails with connection_lost. Without this a busy
  // host can still be routing calls at the kill; those wait for the next
  // connection and then their 20 s deadline.
  {
    std::promise<void> routed;
    boost::asio::post(c.get_executor(), [&] { routed.set_value(); });
    ASSERT_EQ(routed.get_future().wait_for(Ms(10000)), std::future_status::ready);
  }
  ASSERT_EQ(done.load(), 0) << "the paused server answered nothing yet";

  const auto t_kill = SteadyClock::now();
  server->kill();
  ASSERT_TRUE(eventually([&] { return done.load() == kCalls; }, Ms(10000)))
      << done.load() << " of " << kCalls << " calls completed after the kill";
  EXPECT_LT(since(t_kill), Ms(10000)) << "well under the 20 s deadline";
  {
    std::lock_guard lock(mu);
    EXPECT_TRUE(unexpected.empty()) << unexpected.size() << " calls failed otherwise, e.g. " << unexpected.front();
    EXPECT_NE(sample.find("connection lost"), std::string::npos) << sample;
    EXPECT_NE(sample.find(c.address()), std::string::npos) << sample;
    EXPECT_EQ(sample.find('\n'), std::string::npos) << sample;
  }
  EXPECT_EQ(c.stats().connected, 0);

  server->start();  // same port: EmbeddedRedis keeps it across restarts
  ASSERT_EQ(server->port(), o.port);
  ASSERT_TRUE(eventually(
      [&] {
        try {
          return c.exec(Command{"PING"}).str == "PONG";
        } catch (const Error&) {
          return false;
        }
      },
      Ms(5000)));
  EXPECT_TRUE(c.exec(Command{"SET", key("after"), "1"}).is_ok());
  EXPECT_EQ(c.exec(Command{"GET", key("after")}).str, "1");
  EXPECT_GE(c.stats().reconnects, 1u);
}

TEST_F(RedisFaults, CallsWhileTheServerIsDownWaitForTheirDeadlineOrForTheServer) {
  auto c = make_client();
  const auto port = server->port();
  server->kill();
  ASSERT_TRUE(eventually([&] { return c->stats().connected == 0; }));

  CallOptions short_deadline;
  short_deadline.timeout = Ms(300);
  const auto t0 = SteadyClock::now();
  const Error e = error_of([&] { c->exec(Command{"PING"}, short_deadline); });
  EXPECT_EQ(e.code(), errc::not_connected) << e.what();
  EXPECT_GE(since(t0), Ms(300)) << "a call while disconnected waits for a connection up to its deadline";
  EXPECT_NE(std::string(e.what()).find(c->address()), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << "says why: " << e.what();

  CallOptions long_deadline;
  long_deadline.timeout = Ms(8000);
  auto waiting = c->exec_future(Command{"SET", key("k"), "v"}, long_deadline);
  std::this_thread::sleep_for(Ms(150));
  ASSERT_EQ(waiting.wait_for(Ms(0)), std::future_status::timeout);
  server->start();
  ASSERT_EQ(server->port(), port);
  EXPECT_TRUE(waiting.get().is_ok()) << "a call issued while down succeeds when the server returns in time";
  EXPECT_EQ(admin("GET " + key("k")), "v");
}

TEST_F(RedisFaults, ClientPauseFailsCallsAtTheirDeadlineAndTheConnectionKeepsWorking) {
  auto c = make_client();
  ASSERT_EQ(c->exec(Command{"PING"}).str, "PONG");
  // Proved to hold before the late calls rely on it (RedisTest::pause_clients).
  expect_deadlines_then_recovery(*c, [&] { ASSERT_TRUE(pause_clients(Ms(2500))); });
}

TEST_F(RedisFaults, DebugSleepFailsCallsAtTheirDeadlineAndTheConnectionKeepsWorking) {
  restart_server_with({"--enable-debug-command", "yes"});
  auto c = make_client();
  std::future<Reply> sleeping;
  expect_deadlines_then_recovery(
      *c,
      [&] {
        CallOptions co;
        co.timeout = Ms(10000);
        // Sent on the same connection: everything behind it waits.
        sleeping = c->exec_future(Command{"DEBUG", "SLEEP", "2.5"}, co);
      });
  EXPECT_TRUE(sleeping.get().is_ok());
}

TEST_F(RedisFaults, SigstoppedServerTimesOutEveryCallAndRecoversOnSigcont) {
  auto c = make_client();
  std::jthread resumer;  // joined before the server is destroyed, even on failure
  expect_deadlines_then_recovery(
      *c,
      [&] {
        server->pause();
        // Resumed by a helper thread while the fresh calls are waiting.
        resumer = std::jthread([s = server.get()] {
          std::this_thread::sleep_for(Ms(2500));
          s->resume();
        });
      });
}
