// detail::await_done: a callback-style operation awaited from a coroutine.
// The hazard tested: an exception thrown by the operation's start (bad input
// checked on the caller's thread) must reach the awaiting coroutine. Thrown
// out of the initiation instead, Asio rethrows it from io_context::run(),
// which on a client's loop thread ended the process (`jobguard jobs work`
// with a TTL above the max TTL aborted).
#include "job/awaiting.hpp"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <stdexcept>
#include <string>

#include "jobguard/error.hpp"

namespace asio = boost::asio;
using jobguard::job::detail::await_done;
using jobguard::job::detail::Done;

namespace {

TEST(AwaitDone, AnExceptionFromTheStartReachesTheCoroutineNotTheLoop) {
  asio::io_context ctx;
  std::string caught;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        try {
          co_await await_done<int>([](Done<int>) { throw jobguard::Error(jobguard::errc::invalid_argument, "bad ttl"); });
          caught = "nothing thrown";
        } catch (const jobguard::Error& e) {
          caught = e.what();
        }
      },
      asio::detached);
  EXPECT_NO_THROW(ctx.run());
  EXPECT_NE(caught.find("bad ttl"), std::string::npos) << caught;
}

TEST(AwaitDone, AStartThatCompletesThenThrowsResumesTheCoroutineOnceWithItsValue) {
  asio::io_context ctx;
  int resumed = 0, value = 0;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        value = co_await await_done<int>([](Done<int> done) {
          done(nullptr, 7);
          throw std::runtime_error("after the completion");
        });
        ++resumed;
      },
      asio::detached);
  EXPECT_NO_THROW(ctx.run());
  EXPECT_EQ(resumed, 1);
  EXPECT_EQ(value, 7);
}

TEST(AwaitDone, ACompletionFromTheStartIsPostedAndCarriesItsError) {
  asio::io_context ctx;
  std::string caught;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        try {
          co_await await_done<int>([](Done<int> done) {
            done(std::make_exception_ptr(std::runtime_error("refused")), 0);
          });
        } catch (const std::runtime_error& e) {
          caught = e.what();
        }
      },
      asio::detached);
  ctx.run();
  EXPECT_EQ(caught, "refused");
}

}  // namespace
