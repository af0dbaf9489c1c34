// Private to src/job: awaiting the library's callback-style operations from a
// coroutine, and running a blocking call (a PostgreSQL statement, a blocking
// effect) on another executor while the coroutine waits.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <exception>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "jobguard/redis/client.hpp"
#include "jobguard/redis/script.hpp"

namespace jobguard::job::detail {

template <class T>
using Done = std::function<void(std::exception_ptr, T)>;

// `start(done)` begins the operation; `done(error, value)` may run on any
// thread, and the coroutine resumes on its own executor. A completion that
// comes while `start` is still running is posted, not run inline: resuming a
// coroutine inside its own co_await is not allowed. An exception `start`
// throws (bad input it checks on the caller's thread) comes back to the
// coroutine as the operation's error: thrown out of the initiation, Asio
// would rethrow it from the event loop's run(), ending the process.
template <class T, class Start>
boost::asio::awaitable<T> await_done(Start start) {
  namespace asio = boost::asio;
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(std::exception_ptr, T)>(
      [start = std::move(start)](auto handler) mutable {
        using H = decltype(handler);
        using Ex = asio::associated_executor_t<H>;
        Ex ex = asio::get_associated_executor(handler);
        struct Shared {
          Shared(H&& handler_in, const Ex& e) : h(std::move(handler_in)), work(e) {}
          H h;
          // Outstanding work of the coroutine's executor until the hand-over
          // returns: `done` may run on another thread (a pool running a
          // blocking call), and without it the loop's run() could return, and
          // its io_context be destroyed, while that thread is still inside
          // post() waking it (as <jobguard/async.hpp>'s Completer).
          asio::executor_work_guard<Ex> work;
          std::atomic<bool> starting{true};
          std::atomic<bool> fired{false};  // the handler is called once: by done, or by a throw from start
        };
        auto sh = std::make_shared<Shared>(std::move(handler), ex);
        try {
          start(Done<T>([sh, ex](std::exception_ptr e, T v) mutable {
            if (sh->fired.exchange(true)) return;
            auto resume = [sh, e, v = std::move(v)]() mutable { std::move(sh->h)(e, std::move(v)); };
            if (sh->starting.load(std::memory_order_acquire)) asio::post(ex, std::move(resume));
            else asio::dispatch(ex, std::move(resume));
            sh->work.reset();
          }));
        } catch (...) {
          if (!sh->fired.exchange(true)) {
            asio::post(ex, [sh, e = std::current_exception()]() mutable { std::move(sh->h)(e, T{}); });
            sh->work.reset();
          }
        }
        sh->starting.store(false, std::memory_order_release);
      },
      asio::use_awaitable);
}

// Runs `f` on `blocking` (a thread pool, or the thread of a blocking caller)
// while the coroutine waits; its value or exception comes back. `f` may refer
// to the coroutine's locals: they live until it resumes.
template <class F>
boost::asio::awaitable<std::invoke_result_t<F&>> on_blocking(boost::asio::any_io_executor blocking, F f) {
  using R = std::invoke_result_t<F&>;
  using V = std::conditional_t<std::is_void_v<R>, bool, R>;
  auto fn = std::make_shared<F>(std::move(f));
  auto run = [blocking, fn](Done<V> done) {
    boost::asio::post(blocking, [fn, done = std::move(done)] {
      try {
        if constexpr (std::is_void_v<R>) {
          (*fn)();
          done(nullptr, true);
        } else {
          done(nullptr, (*fn)());
        }
      } catch (...) {
        done(std::current_exception(), V{});
      }
    });
  };
  if constexpr (std::is_void_v<R>) {
    co_await await_done<V>(std::move(run));
  } else {
    co_return co_await await_done<V>(std::move(run));
  }
}

// EVALSHA (EVAL on NOSCRIPT) as a coroutine on the client's loop; a failure
// is thrown as the library's Error, with the server's words.
inline boost::asio::awaitable<redis::Reply> eval_on_loop(redis::Client& client, const redis::Script& script,
                                                         std::vector<std::string> keys, std::vector<std::string> args,
                                                         std::chrono::milliseconds timeout) {
  co_return co_await await_done<redis::Reply>([&](Done<redis::Reply> done) {
    client.async_eval(
        script, std::move(keys), std::move(args),
        [&client, done = std::move(done), context = "EVALSHA " + script.sha1()](std::error_code ec,
                                                                               redis::Reply r) mutable {
          if (ec) return done(std::make_exception_ptr(redis::to_error(ec, r, client.address(), context)), {});
          done(nullptr, std::move(r));
        },
        redis::CallOptions{timeout});
  });
}

}  // namespace jobguard::job::detail
