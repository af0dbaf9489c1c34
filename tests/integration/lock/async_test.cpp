// The completion-token forms (<jobguard/async.hpp>): coroutines with
// use_awaitable, futures, callbacks; the blocking forms refusing the loop
// thread; a lease loss waking an awaiting coroutine. Labelled tsan: the
// coroutines run on the client's loop while the test thread drives Redis.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <future>
#include <string>

#include "jobguard/async.hpp"
#include "jobguard/error.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using jobguard::test::eventually;
namespace asio = boost::asio;
using asio::use_awaitable;

#include "fixtures.hpp"

namespace {
// Runs `task` on `ex` and returns what it co_returns ("ok", or what went
// wrong: a coroutine cannot use gtest's assertions). An exception escaping
// it is rethrown by get().
std::string run_on(asio::any_io_executor ex, asio::awaitable<std::string> task) {
  return asio::co_spawn(ex, std::move(task), asio::use_future).get();
}

// GET key, from a coroutine.
asio::awaitable<std::string> get(redis::Client& c, std::string key) {
  redis::Command cmd{"GET", std::move(key)};
  const redis::Reply r = co_await redis::async_exec(c, std::move(cmd), use_awaitable);
  co_return r.is_nil() ? std::string("(nil)") : r.str;
}
}  // namespace

TEST_F(LockTest, ACoroutineAcquiresHoldsExtendsAndReleasesWithUseAwaitable) {
  const std::string r = resource("co");
  auto task = [&]() -> asio::awaitable<std::string> {
    // g++ 12: options in named variables, not braced temporaries inside
    // co_await (...) (docs/async.md).
    const LockOptions opts{.ttl = 5s, .fence = true};
    std::optional<Lock> lock = co_await async_acquire(*svc, r, opts, use_awaitable);
    if (!lock || !lock->held()) co_return "not granted";
    if (!lock->fence()) co_return "no fence";
    if (co_await get(*client, lock->key()) != lock->token()) co_return "Redis does not hold our token";
    // Held: a second acquire, try-once, is busy (a result, not an error).
    const LockOptions once{.ttl = 5s};
    if (co_await async_acquire(*svc, r, once, use_awaitable)) co_return "granted twice";
    if (!co_await async_extend(*lock, 10s, use_awaitable)) co_return "extend: not ours";
    redis::Command pttl{"PTTL", lock->key()};
    const auto left = (co_await redis::async_exec(*client, std::move(pttl), use_awaitable)).integer;
    if (left <= 5000) co_return "extend did not move the TTL: " + std::to_string(left);
    if (!co_await async_release(*lock, use_awaitable)) co_return "release: not ours";
    if (lock->held()) co_return "still held after release";
    if (co_await get(*client, lock->key()) != "(nil)") co_return "key left behind";
    // A released lock's second release is false, not an error.
    if (co_await async_release(*lock, use_awaitable)) co_return "released twice";
    co_return "ok";
  };
  EXPECT_EQ(run_on(client->get_executor(), task()), "ok");
}

TEST_F(LockTest, UseAwaitableThrowsJobguardError) {
  auto task = [&]() -> asio::awaitable<std::string> {
    const LockOptions opts{.ttl = 5s};
    try {
      co_await async_acquire(*svc, "has space", opts, use_awaitable);
      co_return "a malformed resource was accepted";
    } catch (const Error& e) {
      if (e.code() != errc::invalid_argument) co_return std::string("wrong code: ") + e.what();
    }
    co_return "ok";
  };
  EXPECT_EQ(run_on(client->get_executor(), task()), "ok");

  // A Redis failure: the Error of the blocking form, server and key named.
  const std::string address = client->address();
  const std::string key = svc->keys().lock_key(resource("down"));
  server->kill();
  ASSERT_TRUE(eventually([&] { return static_cast<bool>(client->down_error()); }, 10s));
  auto down = [&]() -> asio::awaitable<std::string> {
    const LockOptions opts{.ttl = 5s};
    try {
      co_await async_acquire(*svc, resource("down"), opts, use_awaitable);
      co_return "acquire succeeded with Redis down";
    } catch (const Error& e) {
      const std::string what = e.what();
      if (e.code() != errc::not_connected) co_return "wrong code: " + what;
      if (what.find(address) == std::string::npos || what.find(key) == std::string::npos)
        co_return "server or key not named: " + what;
    }
    co_return "ok";
  };
  EXPECT_EQ(run_on(client->get_executor(), down()), "ok");
}

TEST_F(LockTest, FuturesAndCallbacksForAcquireExtendRelease) {
  const std::string r = resource("fut");
  std::optional<Lock> lock = async_acquire(*svc, r, LockOptions{.ttl = 5s}, asio::use_future).get();
  ASSERT_TRUE(lock);
  EXPECT_TRUE(async_extend(*lock, 0ms, asio::use_future).get());
  EXPECT_FALSE(async_acquire(*svc, r, LockOptions{}, asio::use_future).get()) << "granted twice";
  EXPECT_TRUE(async_release(*lock, asio::use_future).get());
  EXPECT_EQ(admin("EXISTS " + lock->key()), "0");
  // A future's get() throws the jobguard::Error.
  EXPECT_THROW(async_acquire(*svc, "", LockOptions{}, asio::use_future).get(), Error);

  // A callback: the exception_ptr carries the Error; it runs on the loop.
  std::promise<std::string> p;
  async_acquire(*svc, r, LockOptions{.ttl = 5s}, [&](std::exception_ptr ep, std::optional<Lock> l) {
    if (ep) return p.set_value("error");
    if (!client->running_in_loop_thread()) return p.set_value("not on the loop");
    if (!l) return p.set_value("busy");
    // On the loop: only the asynchronous release can be used here.
    async_release(*l, [&p](std::exception_ptr e, bool ours) { p.set_value(!e && ours ? "ok" : "release failed"); });
  });
  EXPECT_EQ(p.get_future().get(), "ok");
}

// release()/extend() wait for a reply only the loop delivers: on the loop
// they refuse at once (the handler returns) and the lock stays held, for
// scope exit or the asynchronous form to release.
TEST_F(LockTest, BlockingReleaseAndExtendOnTheLoopThreadRefuseInsteadOfHanging) {
  auto lock = svc->acquire(resource("loop"), LockOptions{.ttl = 5s});
  ASSERT_TRUE(lock);
  std::promise<std::string> p;
  asio::post(client->get_executor(), [&] {
    std::string out;
    for (const char* call : {"release", "extend"}) {
      try {
        if (std::string(call) == "release") lock->release();
        else lock->extend();
        out += std::string(call) + " returned; ";
      } catch (const Error& e) {
        if (e.code() != errc::invalid_argument) out += std::string(call) + ": " + e.what() + "; ";
      }
    }
    if (!lock->held()) out += "no longer held; ";
    lock->async_release([&p, out](const Error& e, bool ours) { p.set_value(!e && ours ? out + "ok" : out + "bad"); });
  });
  EXPECT_EQ(p.get_future().get(), "ok");
  EXPECT_EQ(admin("EXISTS " + lock->key()), "0");

  // A Lease's release on the loop sends it without waiting.
  auto lease = LeaseScheduler::create(svc)->acquire(resource("loop-lease"), LockOptions{.ttl = 5s});
  ASSERT_TRUE(lease);
  std::promise<bool> released;
  asio::post(client->get_executor(), [&] { released.set_value(lease->release()); });
  EXPECT_TRUE(released.get_future().get());
  EXPECT_TRUE(eventually([&] { return admin("EXISTS " + lease->key()) == "0"; }));
}

TEST_F(LeaseTest, ACoroutineTakesALeaseAndItsLossWakesIt) {
  const std::string r = resource("co-lease");
  std::promise<std::string> held;  // the lease's key, once it is held
  auto task = [&]() -> asio::awaitable<std::string> {
    const LockOptions opts{.ttl = 600ms, .fence = true};
    std::optional<Lease> lease = co_await async_acquire(*sched, r, opts, use_awaitable);
    if (!lease) co_return "not granted";
    held.set_value(lease->key());
    // Asleep until the renewal finds the key gone.
    const LeaseState how = co_await async_wait_lost(*lease, use_awaitable);
    if (how != LeaseState::token_gone) co_return std::string("woken by ") + to_string(how);
    if (!lease->lost() || !lease->stop_token().stop_requested()) co_return "lease not marked lost";
    // A lost lease is not released: the key is no longer ours.
    if (co_await async_release(*lease, use_awaitable)) co_return "released a lost lease";
    co_return "ok";
  };
  auto done = asio::co_spawn(client->get_executor(), task(), asio::use_future);
  const std::string key = held.get_future().get();
  ASSERT_EQ(admin("DEL " + key), "1");
  EXPECT_EQ(done.get(), "ok");
}

TEST_F(LeaseTest, WaitLostCompletesWithReleasedWhenTheLeaseIsReleased) {
  auto lease = sched->acquire(resource("rel"), LockOptions{.ttl = 5s});
  ASSERT_TRUE(lease);
  std::promise<LeaseState> woke;
  async_wait_lost(*lease, [&](boost::system::error_code ec, LeaseState how) {
    woke.set_value(ec ? LeaseState::active : how);
  });
  EXPECT_TRUE(async_release(*lease, asio::use_future).get());
  EXPECT_EQ(woke.get_future().get(), LeaseState::released);
  EXPECT_EQ(admin("EXISTS " + lease->key()), "0");
  // A wait that starts after the end completes at once with how it ended.
  EXPECT_EQ(async_wait_lost(*lease, asio::use_future).get(), LeaseState::released);
}

// `work || async_wait_lost(lease)`: the work ends first, the wait is
// cancelled, and the lease is still ours to release.
TEST_F(LeaseTest, WaitLostIsCancelledWhenTheWorkBesideItEndsFirst) {
  using namespace boost::asio::experimental::awaitable_operators;
  auto task = [&]() -> asio::awaitable<std::string> {
    const LockOptions opts{.ttl = 5s};
    std::optional<Lease> lease = co_await async_acquire(*sched, resource("race"), opts, use_awaitable);
    if (!lease) co_return "not granted";
    asio::steady_timer work(co_await asio::this_coro::executor, 1ms);
    auto first = co_await (work.async_wait(use_awaitable) || async_wait_lost(*lease, use_awaitable));
    if (first.index() != 0) co_return "the wait won over the work";
    if (lease->lost()) co_return "lease lost";
    if (!co_await async_release(*lease, use_awaitable)) co_return "release: not ours";
    co_return "ok";
  };
  EXPECT_EQ(run_on(client->get_executor(), task()), "ok");
}

// docs/async.md: the client on the application's own io_context, run by one
// thread; the coroutine shuts down in order (lease, services, client) from
// the loop, and run() returns when nothing is left.
TEST_F(LockTest, OnTheApplicationsOwnIoContext) {
  asio::io_context ctx;
  auto own = std::make_unique<redis::Client>(ctx, options());
  std::string result;
  auto task = [&]() -> asio::awaitable<std::string> {
    auto locks = LockService::create(*own);
    auto leases = LeaseScheduler::create(locks);
    const LockOptions opts{.ttl = 5s};
    std::optional<Lease> lease = co_await async_acquire(*leases, resource("own"), opts, use_awaitable);
    if (!lease) co_return "not granted";
    if (co_await get(*own, lease->key()) != lease->token()) co_return "Redis does not hold our token";
    if (!co_await async_release(*lease, use_awaitable)) co_return "release: not ours";
    lease.reset();
    leases.reset();
    locks.reset();
    own.reset();  // on the loop thread: closes the connections without waiting
    co_return "ok";
  };
  asio::co_spawn(ctx, task(), [&](std::exception_ptr ep, std::string r) {
    result = ep ? "exception" : r;
  });
  ctx.run();
  EXPECT_EQ(result, "ok");
}
