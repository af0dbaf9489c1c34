// Completion-token forms of the lock and lease operations, for code that
// runs on an Asio event loop: callbacks, `boost::asio::use_awaitable`
// (coroutines), `boost::asio::use_future`, or any other token.
//
//   auto lock = co_await jobguard::async_acquire(*locks, "invoice:48291", {.ttl = 30s}, use_awaitable);
//   if (lock) co_await jobguard::async_release(*lock, use_awaitable);
//
// Every operation but async_wait_lost completes with
// (std::exception_ptr, result): the exception, when set, is a jobguard::Error
// (the same one the blocking form throws, naming the server and the key), so
// `co_await` and `future::get()` throw jobguard::Error and a callback can
// std::rethrow_exception it. A busy lock is a result (nullopt), not an error.
//
// The completion runs on the handler's associated executor (the client's
// event loop when it has none), never inside the initiating call.
// Running these inside your own io_context, shutdown, and the g++ 12
// coroutine pitfalls: docs/async.md.
//
// This header includes Boost.Asio's core; <jobguard/lock.hpp> and
// <jobguard/lease.hpp> alone do not, so code that only uses the blocking
// forms does not pay for it.
#pragma once

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/system_executor.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "jobguard/error.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/multilock.hpp"
#include "jobguard/quorum.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard {

namespace detail {

// Hands a result to an Asio handler on its own executor. Inline (dispatch)
// when the result arrives after the initiating call returned, as it does from
// the event loop; posted when it arrives inside that call, so a coroutine is
// never resumed inside its own co_await.
//
// The handler's executor counts the operation as outstanding work from the
// start until the hand-over returns. The result usually arrives on another
// thread (the client's or a quorum service's loop); without the count, the
// caller's io_context::run() can run the handler, find nothing left and
// return, and the caller destroy the io_context while that other thread is
// still inside post() signalling its wake-up condition.
template <class Handler>
class Completer {
 public:
  Completer(Handler h, const boost::asio::any_io_executor& fallback)
      : st_(std::make_shared<St>(std::move(h), fallback)) {}

  // Call once the initiating call has returned.
  void started() const noexcept { st_->initiating.store(false, std::memory_order_release); }

  template <class... Args>
  void operator()(Args&&... args) const {
    auto st = st_;
    auto invoke = [st, ... a = std::forward<Args>(args)]() mutable { std::move(st->h)(std::move(a)...); };
    if (st->initiating.load(std::memory_order_acquire)) boost::asio::post(st->ex, std::move(invoke));
    else boost::asio::dispatch(st->ex, std::move(invoke));
    st->work.reset();
  }

 private:
  struct St {
    St(Handler handler, const boost::asio::any_io_executor& fallback)
        : h(std::move(handler)), ex(boost::asio::get_associated_executor(h, fallback)), work(ex) {}
    Handler h;
    boost::asio::associated_executor_t<Handler, boost::asio::any_io_executor> ex;
    boost::asio::executor_work_guard<decltype(ex)> work;
    std::atomic<bool> initiating{true};
  };
  std::shared_ptr<St> st_;
};

// Runs `start(done)`; an exception it throws (a bad argument, checked on the
// caller's thread) becomes the completion's exception, with `empty` results.
template <class Handler, class Start, class... Empty>
void initiate(Handler&& handler, const boost::asio::any_io_executor& fallback, Start&& start, Empty... empty) {
  Completer<std::decay_t<Handler>> done(std::forward<Handler>(handler), fallback);
  try {
    start(done);
  } catch (...) {
    done(std::current_exception(), std::move(empty)...);
  }
  done.started();
}

// The completion's exception, with a text of its own: copies of an Error
// share their text, and the caller's copy is dropped on the event loop after
// the handler returns, while a future's or a coroutine's thread reads this one.
inline std::exception_ptr as_exception(const Error& e) {
  return e ? std::make_exception_ptr(Error(e.code(), std::string(e.detail()), e.source())) : std::exception_ptr();
}

// The event loop a lease's scheduler runs on, where its completions run: a
// single-server client's, or a quorum service's own (QuorumLease::adopt).
boost::asio::any_io_executor lease_executor(const Lease& lease);

// The quorum service's own event loop (where its retries and its leases run).
boost::asio::any_io_executor quorum_executor(const QuorumLockService& service);

inline boost::asio::any_io_executor executor_of(const Lock& lock) {
  if (lock.service()) return lock.service()->client().get_executor();
  return boost::asio::system_executor();
}

}  // namespace detail

// LockService::acquire without blocking: completes with the Lock, or nullopt
// when it stayed busy for the whole wait.
// Signature: void(std::exception_ptr, std::optional<Lock>).
template <class Token>
auto async_acquire(LockService& service, std::string resource, LockOptions opts, Token&& token) {
  return boost::asio::async_initiate<Token, void(std::exception_ptr, std::optional<Lock>)>(
      [&service](auto handler, std::string r, LockOptions o) {
        detail::initiate(
            std::move(handler), service.client().get_executor(),
            [&](const auto& done) {
              service.async_acquire(std::move(r), std::move(o), [done](const Error& e, std::optional<Lock> l) {
                done(detail::as_exception(e), std::move(l));
              });
            },
            std::optional<Lock>());
      },
      token, std::move(resource), std::move(opts));
}

// acquire_all without blocking (<jobguard/multilock.hpp>): every lock of the
// set, or nullopt (none held) when one stayed busy for the whole wait.
// Signature: void(std::exception_ptr, std::optional<MultiLock>).
template <class Token>
auto async_acquire_all(LockService& service, std::vector<std::string> resources, LockOptions opts, Token&& token) {
  return boost::asio::async_initiate<Token, void(std::exception_ptr, std::optional<MultiLock>)>(
      [&service](auto handler, std::vector<std::string> r, LockOptions o) {
        detail::initiate(
            std::move(handler), service.client().get_executor(),
            [&](const auto& done) {
              // Named as the handler type: a bare lambda would pick this template again.
              jobguard::async_acquire_all(service, std::move(r), std::move(o),
                                          AcquireAllHandler([done](const Error& e, std::optional<MultiLock> m) {
                                            done(detail::as_exception(e), std::move(m));
                                          }));
            },
            std::optional<MultiLock>());
      },
      token, std::move(resources), std::move(opts));
}

// acquire_all without blocking, the set adopted as one renewing Lease
// (LeaseScheduler::adopt_all), or nullopt (none held) when a key stayed busy
// for the whole wait. Signature: void(std::exception_ptr, std::optional<Lease>).
template <class Token>
auto async_acquire_all(LeaseScheduler& scheduler, std::vector<std::string> resources, LockOptions lock_opts,
                       LeaseOptions lease_opts, Token&& token) {
  return boost::asio::async_initiate<Token, void(std::exception_ptr, std::optional<Lease>)>(
      [&scheduler](auto handler, std::vector<std::string> r, LockOptions o, LeaseOptions lo) {
        detail::initiate(
            std::move(handler), scheduler.service().client().get_executor(),
            [&](const auto& done) {
              jobguard::async_acquire_all(
                  scheduler.service(), std::move(r), std::move(o),
                  AcquireAllHandler([done, sched = scheduler.shared_from_this(), lo](const Error& e,
                                                                                     std::optional<MultiLock> m) {
                    if (e || !m) return done(detail::as_exception(e), std::optional<Lease>());
                    std::optional<Lease> lease;
                    std::exception_ptr failed;
                    try {
                      lease.emplace(sched->adopt_all(std::move(*m), lo));
                    } catch (...) {
                      failed = std::current_exception();  // a bad LeaseOptions; the MultiLock's scope exit releases it
                    }
                    done(failed, std::move(lease));
                  }));
            },
            std::optional<Lease>());
      },
      token, std::move(resources), std::move(lock_opts), std::move(lease_opts));
}

// MultiLock::release without blocking: true if every lock was still ours.
// Signature: void(std::exception_ptr, bool).
template <class Token>
auto async_release(MultiLock& locks, Token&& token) {
  return boost::asio::async_initiate<Token, void(std::exception_ptr, bool)>(
      [&locks](auto handler) {
        const auto ex = locks.locks().empty() ? boost::asio::any_io_executor(boost::asio::system_executor())
                                              : detail::executor_of(locks.locks().front());
        detail::initiate(
            std::move(handler), ex,
            [&](const auto& done) {
              locks.async_release([done](const Error& e, bool ours) { done(detail::as_exception(e), ours); });
            },
            false);
      },
      token);
}

// Lock::release without blocking: true if the lock was still ours.
// Signature: void(std::exception_ptr, bool).
template <class Token>
auto async_release(Lock& lock, Token&& token) {
  return boost::asio::async_initiate<Token, void(std::exception_ptr, bool)>(
      [&lock](auto handler) {
        detail::initiate(
            std::move(handler), detail::executor_of(lock),
            [&](const auto& done) {
              lock.async_release([done](const Error& e, bool ours) { done(detail::as_exception(e), ours); });
            },
            false);
      },
      token);
}

// Lock::extend without blocking (ttl 0 = the acquire ttl): true if the lock
// was still ours. Signature: void(std::exception_ptr, bool).
template <class Token>
auto async_extend(Lock& lock, std::chrono::milliseconds ttl, Token&& token) {
  return boost::asio::async_initiate<Token, void(std::exception_ptr, bool)>(
      [&lock, ttl](auto handler) {
        detail::initiate(
            std::move(handler), detail::executor_of(lock),
            [&](const auto& done) {
              lock.async_extend(ttl, [done](const Error& e, bool ours) { done(detail::as_exception(e), ours); });
            },
            false);
      },
      token);
}

// LeaseScheduler::acquire without blocking: the lock, adopted as a renewing
// Lease, or nullopt when it stayed busy for the whole wait.
// Signature: void(std::exception_ptr, std::optional<Lease>).
template <class Token>
auto async_acquire(LeaseScheduler& scheduler, std::string resource, LockOptions lock_opts, LeaseOptions lease_opts,
                   Token&& token) {
  return boost::asio::async_initiate<Token, void(std::exception_ptr, std::optional<Lease>)>(
      [&scheduler](auto handler, std::string r, LockOptions o, LeaseOptions lo) {
        detail::initiate(
            std::move(handler), scheduler.service().client().get_executor(),
            [&](const auto& done) {
              scheduler.service().async_acquire(
                  std::move(r), std::move(o),
                  [done, sched = scheduler.shared_from_this(), lo](const Error& e, std::optional<Lock> l) {
                    if (e || !l) return done(detail::as_exception(e), std::optional<Lease>());
                    std::optional<Lease> lease;
                    std::exception_ptr failed;
                    try {
                      lease.emplace(sched->adopt(std::move(*l), lo));
                    } catch (...) {
                      failed = std::current_exception();  // a bad LeaseOptions; the Lock's scope exit releases it
                    }
                    done(failed, std::move(lease));
                  });
            },
            std::optional<Lease>());
      },
      token, std::move(resource), std::move(lock_opts), std::move(lease_opts));
}

template <class Token>
auto async_acquire(LeaseScheduler& scheduler, std::string resource, LockOptions lock_opts, Token&& token) {
  return async_acquire(scheduler, std::move(resource), std::move(lock_opts), LeaseOptions{},
                       std::forward<Token>(token));
}

// QuorumLockService::acquire without blocking, in the single-server form:
// the QuorumLock, or nullopt when a majority stayed held by others for the
// whole wait. Signature: void(std::exception_ptr, std::optional<QuorumLock>).
template <class Token>
auto async_acquire(QuorumLockService& service, std::string resource, QuorumOptions opts, Token&& token) {
  return boost::asio::async_initiate<Token, void(std::exception_ptr, std::optional<QuorumLock>)>(
      [&service](auto handler, std::string r, QuorumOptions o) {
        detail::initiate(
            std::move(handler), detail::quorum_executor(service),
            [&](const auto& done) {
              service.async_acquire(std::move(r), std::move(o), [done](const Error& e, std::optional<QuorumLock> l) {
                done(detail::as_exception(e), std::move(l));
              });
            },
            std::optional<QuorumLock>());
      },
      token, std::move(resource), std::move(opts));
}

// QuorumLock::release without blocking: the number of instances that still
// had the token. As the blocking form, an instance that failed is not an
// error (its TTL frees it there); a moved-from lock is.
// Signature: void(std::exception_ptr, std::size_t).
template <class Token>
auto async_release(QuorumLock& lock, Token&& token) {
  return boost::asio::async_initiate<Token, void(std::exception_ptr, std::size_t)>(
      [&lock](auto handler) {
        detail::initiate(
            std::move(handler),
            lock.service() ? detail::quorum_executor(*lock.service())
                           : boost::asio::any_io_executor(boost::asio::system_executor()),
            [&](const auto& done) {
              lock.async_release([done](const Error&, std::size_t n) { done(std::exception_ptr(), n); });
            },
            std::size_t{0});
      },
      token);
}

// Lease::release without blocking: true if the lock was still ours; false
// if the lease was lost or released already. Signature: void(std::exception_ptr, bool).
template <class Token>
auto async_release(Lease& lease, Token&& token) {
  return boost::asio::async_initiate<Token, void(std::exception_ptr, bool)>(
      [&lease](auto handler) {
        detail::initiate(
            std::move(handler), detail::lease_executor(lease),
            [&](const auto& done) {
              lease.async_release([done](const Error& e, bool ours) { done(detail::as_exception(e), ours); });
            },
            false);
      },
      token);
}

// Completes when the lease ends: with the state it was lost in (token_gone,
// expired, timed_out), or LeaseState::released when it was released instead,
// so an awaiting coroutine is woken either way. Supports per-operation
// cancellation (terminal, partial, total), which completes it with
// boost::asio::error::operation_aborted and LeaseState::active: so
//   co_await (do_the_work() || jobguard::async_wait_lost(lease, use_awaitable))
// (boost/asio/experimental/awaitable_operators.hpp) stops whichever side is
// still running when the other ends. Signature: void(boost::system::error_code, LeaseState).
// The handler's executor must run on one thread (cancellation and completion
// both touch its cancellation slot there).
template <class Token>
auto async_wait_lost(Lease& lease, Token&& token) {
  return boost::asio::async_initiate<Token, void(boost::system::error_code, LeaseState)>(
      [&lease](auto handler) {
        using Handler = decltype(handler);
        struct Op {
          Op(Handler handler, const boost::asio::any_io_executor& fallback)
              : h(std::move(handler)),
                ex(boost::asio::get_associated_executor(h, fallback)),
                work(ex),
                slot(boost::asio::get_associated_cancellation_slot(h)) {}
          Handler h;
          boost::asio::associated_executor_t<Handler, boost::asio::any_io_executor> ex;
          // Outstanding until the hand-over returns, as in detail::Completer.
          boost::asio::executor_work_guard<decltype(ex)> work;
          boost::asio::associated_cancellation_slot_t<Handler> slot;
          std::atomic<bool> initiating{true};
          static void complete(const std::shared_ptr<Op>& op, boost::system::error_code ec, LeaseState how,
                               bool post) {
            auto invoke = [op, ec, how] {
              if (op->slot.is_connected()) op->slot.clear();  // drops the cancellation handler's copy of op
              std::move(op->h)(ec, how);
            };
            if (post) boost::asio::post(op->ex, std::move(invoke));
            else boost::asio::dispatch(op->ex, std::move(invoke));
            op->work.reset();
          }
        };
        auto op = std::make_shared<Op>(std::move(handler), detail::lease_executor(lease));
        auto cancel = lease.when_ended(
            [op](LeaseState how) { Op::complete(op, {}, how, op->initiating.load(std::memory_order_acquire)); });
        if (op->slot.is_connected()) {
          op->slot.assign([op, cancel](boost::asio::cancellation_type type) {
            using boost::asio::cancellation_type;
            if ((type & (cancellation_type::terminal | cancellation_type::partial | cancellation_type::total)) ==
                cancellation_type::none)
              return;
            if (cancel()) Op::complete(op, boost::asio::error::operation_aborted, LeaseState::active, true);
          });
        }
        op->initiating.store(false, std::memory_order_release);
      },
      token);
}

}  // namespace jobguard
