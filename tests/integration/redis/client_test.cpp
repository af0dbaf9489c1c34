#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <future>

#include <atomic>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <mutex>
#include <thread>

#include <unistd.h>

#include "helpers.hpp"
#include "support/redis_fixture.hpp"

using namespace jobguard;
using namespace jobguard::redis;
using namespace jobguard::test;

class RedisClient : public jobguard::test::RedisTest {};

TEST_F(RedisClient, SetAndGetRoundTrip) {
  auto c = make_client();
  EXPECT_TRUE(c->exec(Command{"SET", key("a"), "1"}).is_ok());
  EXPECT_EQ(c->exec(Command{"GET", key("a")}).str, "1");
  EXPECT_TRUE(c->exec(Command{"GET", key("missing")}).is_nil());
}

TEST_F(RedisClient, ManyThreadsPipelineOverOneConnection) {
  auto c = make_client();
  constexpr int kThreads = 8, kPerThread = 2000;
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      std::vector<std::future<Reply>> fs;
      for (int i = 0; i < kPerThread; ++i) fs.push_back(c->exec_future(Command{"INCR", key(std::to_string(t))}));
      for (int i = 0; i < kPerThread; ++i)
        if (fs[i].get().integer == i + 1) ok++;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), kThreads * kPerThread);
  const auto s = c->stats();
  EXPECT_LT(s.writes, s.commands / 4) << "commands issued concurrently must share writes";
}

// Calls made in one turn of the loop leave together at its end; flush_writes
// sends those made so far at once (the semaphore's full batches use it), and
// does nothing off the loop thread.
TEST_F(RedisClient, FlushWritesSendsThisTurnsCallsBeforeTheTurnEnds) {
  auto c = make_client();
  ASSERT_EQ(c->exec(Command{"PING"}).str, "PONG");  // connected
  c->flush_writes();                                   // off the loop: nothing to do, nothing breaks
  std::promise<std::array<std::uint64_t, 4>> seen;
  std::atomic<int> replies{0};
  boost::asio::post(c->get_executor(), [&] {
    const auto w0 = c->stats().writes;
    c->async_exec(Command{"SET", key("f"), "1"}, [&](std::error_code, Reply) { ++replies; });
    const auto w1 = c->stats().writes;  // deferred to the end of the turn
    c->flush_writes();
    const auto w2 = c->stats().writes;  // written now
    c->async_exec(Command{"GET", key("f")}, [&](std::error_code, Reply) { ++replies; });
    c->flush_writes();
    seen.set_value({w0, w1, w2, c->stats().writes});
  });
  const auto w = seen.get_future().get();
  EXPECT_EQ(w[1], w[0]);
  EXPECT_EQ(w[2], w[0] + 1);
  // The second flush finds the first write done (the kernel took it whole)
  // and writes the GET at once too.
  EXPECT_EQ(w[3], w[0] + 2);
  ASSERT_TRUE(eventually([&] { return replies.load() == 2; }));
  EXPECT_EQ(c->exec(Command{"GET", key("f")}).str, "1");
}

// A write the kernel does not take whole at once (more than the socket's
// buffer): the rest goes out asynchronously, behind nothing and before the
// commands submitted after it (Connection::do_write).
TEST_F(RedisClient, WritesLargerThanTheSocketBufferArriveWholeAndInOrder) {
  auto c = make_client();
  const std::string big(24 << 20, 'a'), other(6 << 20, 'o');
  std::vector<std::future<Reply>> fs;
  fs.push_back(c->exec_future(Command{"SET", key("big"), big}, {std::chrono::seconds(30)}));
  fs.push_back(c->exec_future(Command{"APPEND", key("big"), "z"}, {std::chrono::seconds(30)}));
  fs.push_back(c->exec_future(Command{"SET", key("other"), other}, {std::chrono::seconds(30)}));
  for (int i = 0; i < 100; ++i) fs.push_back(c->exec_future(Command{"INCR", key("n")}, {std::chrono::seconds(30)}));
  fs.push_back(c->exec_future(Command{"STRLEN", key("big")}, {std::chrono::seconds(30)}));
  fs.push_back(c->exec_future(Command{"GETRANGE", key("big"), "-3", "-1"}, {std::chrono::seconds(30)}));
  std::vector<Reply> rs;
  for (auto& f : fs) rs.push_back(f.get());
  EXPECT_TRUE(rs[0].is_ok()) << to_debug_string(rs[0]);
  EXPECT_EQ(rs[1].integer, static_cast<std::int64_t>(big.size()) + 1);
  EXPECT_TRUE(rs[2].is_ok()) << to_debug_string(rs[2]);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(rs[3 + static_cast<std::size_t>(i)].integer, i + 1);
  EXPECT_EQ(rs[103].integer, static_cast<std::int64_t>(big.size()) + 1);
  EXPECT_EQ(rs[104].str, "aaz");
  EXPECT_EQ(c->exec(Command{"STRLEN", key("other")}).integer, static_cast<std::int64_t>(other.size()));
}

TEST_F(RedisClient, TwoConnectionsShareTheLoadAndKeepPerCallerOrder) {
  auto o = options();
  o.connections = 2;
  o.client_name = "jg-two";
  Client c(o);
  ASSERT_TRUE(eventually([&] { return c.stats().connected == 2; })) << "both connections come up";
  constexpr int kThreads = 4, kPerThread = 1500;
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      // Each thread waits for its reply before the next INCR, so the values it
      // sees must be exactly 1..N whatever connection carried each call.
      for (int i = 0; i < kPerThread; ++i)
        if (c.exec(Command{"INCR", key(std::to_string(t))}).integer == i + 1) ok++;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), kThreads * kPerThread);
  // Both sockets are really in use: the server sees two clients by our name
  // (set by the CLIENT SETNAME handshake), and both have run commands.
  const std::string list = admin("CLIENT LIST");
  std::size_t ours = 0, busy = 0;
  for (std::size_t at = list.find("name=jg-two "); at != std::string::npos; at = list.find("name=jg-two ", at + 1)) {
    ++ours;
    const auto line_start = list.rfind('\n', at) == std::string::npos ? 0 : list.rfind('\n', at) + 1;
    const std::string line = list.substr(line_start, list.find('\n', at) - line_start);
    if (line.find("cmd=incr") != std::string::npos) ++busy;
  }
  EXPECT_EQ(ours, 2u) << list;
  EXPECT_EQ(busy, 2u) << "both connections carry calls:\n" << list;
}

TEST_F(RedisClient, ErrorReplyFailsOnlyItsOwnCallWithServerError) {
  auto c = make_client();
  c->exec(Command{"SET", key("s"), "text"});
  auto bad = c->exec_future(Command{"INCR", key("s")});
  auto good = c->exec_future(Command{"INCR", key("n")});
  const Error e = error_of([&] { bad.get(); });
  EXPECT_EQ(e.code(), errc::server_error) << e.what();
  EXPECT_NE(std::string(e.what()).find("not an integer"), std::string::npos) << e.what();
  EXPECT_EQ(good.get().integer, 1);
}

// async_exec_in_order: the commands go back to back on one connection, so
// the server runs them in that order even where the client spreads calls
// over several connections; each has its own reply.
TEST_F(RedisClient, InOrderCommandsRunInTheirOrderOnOneOfSeveralConnections) {
  auto o = options();
  o.connections = 4;
  Client c(o);
  ASSERT_TRUE(eventually([&] { return c.stats().connected == 4; }));
  constexpr int kSequences = 400;
  std::vector<std::promise<std::pair<std::error_code, std::vector<Reply>>>> ps(kSequences);
  for (int i = 0; i < kSequences; ++i) {
    const std::string k = key("seq" + std::to_string(i));
    c.async_exec_in_order({Command{"SET", k, "a"}, Command{"APPEND", k, "b"}, Command{"GET", k}},
                          [&ps, i](std::error_code ec, std::vector<Reply> rs) { ps[i].set_value({ec, std::move(rs)}); });
  }
  int in_order = 0;
  for (auto& p : ps) {
    auto f = p.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    auto [ec, rs] = f.get();
    ASSERT_FALSE(ec) << ec.message();
    ASSERT_EQ(rs.size(), 3u);
    EXPECT_EQ(rs[0].str, "OK");
    EXPECT_EQ(rs[1].integer, 2);
    if (rs[2].str == "ab") ++in_order;
  }
  EXPECT_EQ(in_order, kSequences) << "a GET ran before the APPEND sent ahead of it";
}

TEST_F(RedisClient, InOrderCommandsReportTheFirstFailureWithEveryReply) {
  auto c = make_client();
  auto run = [&](std::vector<Command> cmds) {
    std::promise<std::pair<std::error_code, std::vector<Reply>>> p;
    c->async_exec_in_order(std::move(cmds),
                           [&p](std::error_code ec, std::vector<Reply> rs) { p.set_value({ec, std::move(rs)}); });
    auto f = p.get_future();
    EXPECT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    return f.get();
  };
  const std::string k = key("s");
  auto [ec, rs] = run({Command{"SET", k, "text"}, Command{"INCR", k}, Command{"GET", k}});
  EXPECT_EQ(ec, errc::server_error);
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs[0].str, "OK");
  EXPECT_TRUE(rs[1].is_error());
  EXPECT_NE(rs[1].str.find("not an integer"), std::string::npos) << rs[1].str;
  EXPECT_EQ(rs[2].str, "text") << "a failure does not stop the commands after it";
  auto [none_ec, none] = run({});
  EXPECT_FALSE(none_ec);
  EXPECT_TRUE(none.empty());
  // Nothing answers: every command fails at its deadline, and the call with them.
  server->pause();
  CallOptions co;
  co.timeout = Ms(200);
  std::promise<std::pair<std::error_code, std::vector<Reply>>> p;
  c->async_exec_in_order({Command{"SET", k, "x"}, Command{"GET", k}},
                         [&p](std::error_code e, std::vector<Reply> r) { p.set_value({e, std::move(r)}); }, co);
  auto f = p.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(f.get().first);
  server->resume();
}

TEST_F(RedisClient, CoroutineFormReturnsRepliesAndThrowsOnErrorReplies) {
  auto c = make_client();
  namespace asio = boost::asio;
  const std::string k = key("co");
  auto task = [&]() -> asio::awaitable<std::string> {
    // g++ 12: build commands in named variables, not inside co_await (...).
    Command set{"SET", k, "41"};
    Reply r = co_await async_exec(*c, std::move(set), asio::use_awaitable);
    if (!r.is_ok()) co_return "SET gave " + to_debug_string(r);
    Command incr{"INCR", k};
    r = co_await async_exec(*c, std::move(incr), asio::use_awaitable);
    if (r.integer != 42) co_return "INCR gave " + to_debug_string(r);
    Command wrong{"LPUSH", k, "x"};
    try {
      co_await async_exec(*c, std::move(wrong), asio::use_awaitable);
      co_return "LPUSH on a string did not throw";
    } catch (const Error& e) {
      if (e.code() != errc::server_error) co_return std::string("wrong code: ") + e.what();
      if (std::string(e.what()).find("WRONGTYPE") == std::string::npos) co_return std::string("message: ") + e.what();
    }
    co_return "ok";
  };
  auto f = asio::co_spawn(c->get_executor(), task(), asio::use_future);
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(f.get(), "ok");
}

// The client answers from its own loop's thread. The caller's io_context may
// be destroyed as soon as run() returns: the call is that io_context's
// outstanding work until the client's thread has finished handing the reply
// over. Without it this loop fails under ThreadSanitizer (a data race on the
// io_context's wake-up condition) or AddressSanitizer (its use after free).
TEST_F(RedisClient, TheCallersIoContextMayBeDestroyedAsSoonAsRunReturns) {
  auto c = make_client();
  namespace asio = boost::asio;
  for (int i = 0; i < 40; ++i) {
    Reply got;
    {
      asio::io_context ctx;
      async_exec(*c, Command{"PING"}, asio::bind_executor(ctx, [&](std::exception_ptr e, Reply r) {
                   EXPECT_FALSE(e);
                   got = std::move(r);
                 }));
      ctx.run();
    }
    ASSERT_EQ(got.str, "PONG") << "round " << i << ": " << to_debug_string(got);
  }
}

TEST_F(RedisClient, BlockingCallOnTheLoopThreadIsRefusedInsteadOfDeadlocking) {
  auto c = make_client();
  std::promise<std::error_code> p;
  c->async_exec(Command{"PING"}, [&](std::error_code, Reply) {
    try {
      c->exec(Command{"PING"});
      p.set_value({});
    } catch (const Error& e) {
      p.set_value(e.code());
    }
  });
  auto f = p.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(f.get(), errc::invalid_argument);
}

TEST_F(RedisClient, DestroyingTheClientFailsPendingCallsWithShutdownAndDoesNotHang) {
  auto c = make_client();
  server->pause();  // SIGSTOP: nothing we send is answered
  constexpr int kCalls = 2000;
  std::vector<std::future<Reply>> fs;
  std::atomic<int> async_shutdown{0}, async_calls{0};
  for (int i = 0; i < kCalls; ++i) {
    CallOptions co;
    co.timeout = Ms(20000);
    fs.push_back(c->exec_future(Command{"SET", key(std::to_string(i)), "v"}, co));
    c->async_exec(
        Command{"GET", key(std::to_string(i))},
        [&](std::error_code ec, Reply) {
          ++async_calls;
          if (ec == errc::shutdown) ++async_shutdown;
        },
        co);
  }
  const auto t0 = SteadyClock::now();
  c.reset();
  EXPECT_LT(since(t0), Ms(5000)) << "the destructor must not wait for deadlines";
  EXPECT_EQ(async_calls.load(), kCalls);
  EXPECT_EQ(async_shutdown.load(), kCalls);
  for (auto& f : fs) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::ready);
    const Error e = error_of([&] { f.get(); });
    EXPECT_EQ(e.code(), errc::shutdown) << e.what();
  }
  server->resume();
}

namespace {
// The scheduler's state letter of a thread of this process ('R' running or
// runnable, 'S' asleep), '?' once it is gone.
char thread_state(const std::string& tid) {
  std::ifstream in("/proc/self/task/" + tid + "/stat");
  std::string s;
  std::getline(in, s);
  const auto close = s.rfind(')');
  return close != std::string::npos && close + 2 < s.size() ? s[close + 2] : '?';
}

// The name of a thread of this process.
std::string thread_name(const std::string& tid) {
  std::ifstream in("/proc/self/task/" + tid + "/comm");
  std::string n;
  std::getline(in, n);
  return n;
}
}  // namespace

// busy_poll: after a reply the loop goes on polling instead of going to
// sleep, sleeps once the window passed with nothing to do, and its deadlines
// fire while it polls.
TEST_F(RedisClient, BusyPollKeepsTheLoopAwakeAfterAReplyAndAsleepWhenIdle) {
  auto o = options();
  o.busy_poll = std::chrono::milliseconds(300);
  auto c = std::make_unique<Client>(o);
  std::promise<pid_t> loop;
  boost::asio::post(c->get_executor(), [&] { loop.set_value(::gettid()); });
  const std::string tid = std::to_string(loop.get_future().get());
  EXPECT_EQ(thread_name(tid), "jobguard-io");

  ASSERT_EQ(c->exec(Command{"PING"}).str, "PONG");
  // Sampled inside the 300 ms window, from a moment after the reply: a loop
  // blocked in epoll_wait is 'S' by then, one that polls is 'R' (running, or
  // runnable when the machine is busy) throughout.
  const auto window_end = SteadyClock::now() + Ms(250);
  std::string seen;
  for (std::this_thread::sleep_for(Ms(5)); SteadyClock::now() < window_end; std::this_thread::sleep_for(Ms(10)))
    seen += thread_state(tid);
  ASSERT_FALSE(seen.empty());
  EXPECT_GE(std::count(seen.begin(), seen.end(), 'R') * 5, static_cast<std::ptrdiff_t>(seen.size()) * 4)
      << "the loop slept in its polling window after a reply: states " << seen;

  char idle = '?';
  for (const auto until = SteadyClock::now() + std::chrono::seconds(10); SteadyClock::now() < until;) {
    if ((idle = thread_state(tid)) == 'S') break;
    std::this_thread::sleep_for(Ms(20));
  }
  EXPECT_EQ(idle, 'S') << "an idle client's loop must sleep once the window has passed";

  server->pause();  // SIGSTOP: the call is never answered
  CallOptions co;
  co.timeout = Ms(200);
  auto f = c->exec_future(Command{"PING"}, co);
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "a deadline did not fire while polling";
  EXPECT_EQ(error_of([&] { f.get(); }).code(), errc::timeout);
  server->resume();
  EXPECT_EQ(c->exec(Command{"PING"}).str, "PONG");
}

TEST_F(RedisClient, MalformedUrlsFailBeforeAnyConnectionIsTried) {
  for (const char* url : {"redis://127.0.0.1:99999", "http://127.0.0.1:6379", "redis://127.0.0.1/x"}) {
    const Error e = error_of([&] { Client c(parse_url(url)); });
    EXPECT_EQ(e.code(), errc::invalid_url) << url << ": " << e.what();
  }
  auto o = options();
  o.connections = 0;
  EXPECT_EQ(error_of([&] { Client c(o); }).code(), errc::invalid_argument);
  o = options();
  o.command_timeout = Ms(0);
  EXPECT_EQ(error_of([&] { Client c(o); }).code(), errc::invalid_argument);
  o = options();
  o.busy_poll = kMaxBusyPoll + std::chrono::microseconds(1);
  EXPECT_EQ(error_of([&] { Client c(o); }).code(), errc::invalid_argument);
  o.busy_poll = std::chrono::microseconds(-1);
  EXPECT_EQ(error_of([&] { Client c(o); }).code(), errc::invalid_argument);
  o = options();
  o.tls.enabled = true;
  o.tls.ca_file = server->dir() + "/no-such-ca.pem";
  const Error e = error_of([&] { Client c(o); });
  EXPECT_EQ(e.code(), errc::tls_error);
  EXPECT_NE(std::string(e.what()).find("no-such-ca.pem"), std::string::npos) << e.what();
}

TEST_F(RedisClient, EvalFromViewsEncodesLikeEvalAndSurvivesAScriptFlush) {
  auto c = make_client();
  const Script join("return #KEYS .. ':' .. table.concat(KEYS, ',') .. ':' .. table.concat(ARGV, ',')");
  auto call = [&](std::initializer_list<std::string_view> keys, std::initializer_list<std::string_view> args) {
    std::promise<Reply> p;
    c->async_eval_views(join, keys, args, [&p](std::error_code ec, Reply r) {
      if (ec) r.str = "error: " + ec.message() + " " + r.str;
      p.set_value(std::move(r));
    });
    return p.get_future().get().str;
  };
  // Binary-safe and empty arguments, no keys, several keys: the same bytes as async_eval.
  EXPECT_EQ(call({"k1", "k2"}, {"a", "", std::string_view("b\r\nc", 4)}), "2:k1,k2:a,,b\r\nc");
  EXPECT_EQ(call({}, {"x"}), "0::x");
  EXPECT_EQ(admin("SCRIPT FLUSH"), "OK");
  EXPECT_EQ(call({"k3"}, {"y"}), "1:k3:y");  // NOSCRIPT, then EVAL with the same tail
  ASSERT_EQ(admin("CONFIG RESETSTAT"), "OK");
  EXPECT_EQ(call({"k4"}, {}), "1:k4:");
  const std::string stats = admin("INFO commandstats");
  EXPECT_NE(stats.find("cmdstat_evalsha:calls=1,"), std::string::npos) << stats;
}

TEST_F(RedisClient, NoscriptAfterScriptFlushIsTransparentAndTheNextCallGoesBySha) {
  auto c = make_client();
  const Script echo("return ARGV[1] .. ':' .. KEYS[1]");
  EXPECT_EQ(c->eval(echo, {"k1"}, {"a"}).str, "a:k1");  // first call: NOSCRIPT, then EVAL loads it
  EXPECT_EQ(admin("SCRIPT FLUSH"), "OK");
  EXPECT_EQ(c->eval(echo, {"k2"}, {"b"}).str, "b:k2");  // transparent reload
  ASSERT_EQ(admin("CONFIG RESETSTAT"), "OK");
  EXPECT_EQ(c->eval(echo, {"k3"}, {"c"}).str, "c:k3");
  const std::string stats = admin("INFO commandstats");
  EXPECT_NE(stats.find("cmdstat_evalsha:calls=1,"), std::string::npos) << stats;
  EXPECT_EQ(stats.find("cmdstat_eval:"), std::string::npos) << "the cached script must go by SHA:\n" << stats;

  // A script that fails is a script_error, not retried as NOSCRIPT.
  const Script broken("return redis.call('NOPE')");
  const Error e = error_of([&] { c->eval(broken, {}, {}); });
  EXPECT_EQ(e.code(), errc::script_error) << e.what();
}
