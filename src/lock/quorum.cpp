#include "jobguard/async.hpp"
#include "jobguard/quorum.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "jobguard/redis/client.hpp"
#include "lock/lease_internal.hpp"
#include "lock/quarantine.hpp"
#include "lock/quorum_internal.hpp"

namespace jobguard {
namespace lock_scripts {
extern const std::string_view quorum_acquire;
extern const std::string_view quorum_fence;
extern const std::string_view extend;
}  // namespace lock_scripts

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;

namespace {

const redis::Script& script_acquire() {
  static const redis::Script s{std::string(lock_scripts::quorum_acquire)};
  return s;
}
const redis::Script& script_fence() {
  static const redis::Script s{std::string(lock_scripts::quorum_fence)};
  return s;
}
const redis::Script& script_extend() {
  static const redis::Script s{std::string(lock_scripts::extend)};
  return s;
}

// The service's own event loop. Its thread is detached and holds the
// context: the last reference to a service may be dropped on that very
// thread (a completion that held it), where a join could never return.
struct QuorumLoop {
  std::shared_ptr<asio::io_context> ctx = std::make_shared<asio::io_context>(1);
  asio::executor_work_guard<asio::io_context::executor_type> guard{ctx->get_executor()};
  // QuorumLease::adopt's, made on first use. Declared after ctx: its timer
  // is gone before the context is let go.
  std::mutex mu;
  std::shared_ptr<LeaseScheduler> sched;
  QuorumLoop() { std::thread([c = ctx] { c->run(); }).detach(); }
  ~QuorumLoop() {
    guard.reset();
    ctx->stop();
  }
};

struct Outcome {
  std::error_code ec;
  redis::Reply reply;
};
using Outcomes = std::vector<Outcome>;

// Sends one call per instance (send(i, completion)) and runs `done` once every
// instance has answered or reached its call's deadline. The completions may
// come from different event-loop threads (each client may own its loop), so
// the tally is under a mutex, and `done` runs on the thread of the last one.
template <class Send>
void fan_out(std::size_t n, Send send, std::function<void(Outcomes)> done) {
  struct Gather {
    std::mutex mu;
    Outcomes out;
    std::size_t left = 0;
    std::function<void(Outcomes)> done;
  };
  auto g = std::make_shared<Gather>();
  g->out.resize(n);
  g->left = n;
  g->done = std::move(done);
  for (std::size_t i = 0; i < n; ++i) {
    send(i, [g, i](std::error_code ec, redis::Reply r) {
      std::function<void(Outcomes)> fire;
      {
        std::lock_guard<std::mutex> lk(g->mu);
        g->out[i] = Outcome{ec, std::move(r)};
        if (--g->left == 0) fire = std::move(g->done);
      }
      // Outside the lock: nobody writes `out` after the last completion.
      if (fire) fire(std::move(g->out));
    });
  }
}

redis::CallOptions call_options(ms timeout) {
  redis::CallOptions o;
  o.timeout = timeout;
  // An instance known to be down answers "no" at once instead of eating the
  // validity time waiting for a reconnect.
  o.fail_if_down = true;
  return o;
}

std::string describe_failure(const std::string& address, const Outcome& o, std::string_view what) {
  return fmt::format("{}: {}", address, redis::to_error(o.ec, o.reply, address, what).detail());
}

ms default_instance_timeout(ms ttl) { return std::max(ms(1), std::min(ttl / 10, ms(250))); }

}  // namespace

namespace detail {
void release_all(const QuorumLockService& svc, const std::string& key, const std::string& channel,
                 const std::string& token, ms timeout, QuorumLock::ReleaseHandler done) {
  auto self = svc.shared_from_this();
  fan_out(
      svc.size(),
      [&](std::size_t i, redis::Completion c) {
        svc.instance(i).async_eval_views(lock_release_script(), {key}, {token, channel}, std::move(c),
                                         call_options(timeout));
      },
      [self, done = std::move(done)](Outcomes out) {
        std::size_t n = 0;
        std::string failures;
        for (std::size_t i = 0; i < out.size(); ++i) {
          const auto& o = out[i];
          if (o.ec) {
            if (!failures.empty()) failures += "; ";
            failures += describe_failure(self->address(i), o, "quorum release");
          } else if (o.reply.is_integer() && o.reply.integer == 1) {
            ++n;
          }
        }
        if (!done) return;
        if (failures.empty()) return done(Error(), n);
        done(Error(errc::redis_unavailable, failures, error_source::redis), n);
      });
}

void extend_all(const QuorumLockService& svc, const std::string& key, const std::string& token, ms ttl,
                ms timeout, std::function<void(ExtendTally)> done) {
  const std::string ttl_arg = std::to_string(ttl.count());
  auto self = svc.shared_from_this();
  fan_out(
      svc.size(),
      [&](std::size_t i, redis::Completion c) {
        svc.instance(i).async_eval_views(script_extend(), {key}, {token, ttl_arg}, std::move(c), call_options(timeout));
      },
      [self, done = std::move(done)](Outcomes out) {
        ExtendTally t;
        for (std::size_t i = 0; i < out.size(); ++i) {
          const auto& o = out[i];
          if (o.ec) {
            ++t.failed;
            if (!t.failures.empty()) t.failures += "; ";
            t.failures += describe_failure(self->address(i), o, "quorum extend");
          } else if (o.reply.is_integer() && o.reply.integer == 1) {
            ++t.ok;
          } else {
            ++t.gone;
          }
        }
        done(std::move(t));
      });
}
}  // namespace detail

using detail::ExtendTally;
using detail::extend_all;
using detail::release_all;

std::chrono::milliseconds quorum_drift(std::chrono::milliseconds ttl, double clock_drift_factor) noexcept {
  // Rounded up: the allowance must never come out smaller than the factor says.
  const auto scaled = static_cast<std::int64_t>(static_cast<double>(ttl.count()) * clock_drift_factor + 0.999);
  return ms(scaled + 2);
}

// --- the acquire ---------------------------------------------------------------

asio::io_context& QuorumLockService::Impl::loop(const QuorumLockService& s) {
  return *static_cast<QuorumLoop*>(s.loop_.get())->ctx;
}

asio::any_io_executor detail::quorum_executor(const QuorumLockService& service) {
  return QuorumLockService::Impl::loop(service).get_executor();
}

std::shared_ptr<LeaseScheduler> QuorumLockService::Impl::scheduler(const QuorumLockService& s) {
  auto& l = *static_cast<QuorumLoop*>(s.loop_.get());
  std::lock_guard<std::mutex> lk(l.mu);
  if (!l.sched) l.sched = LeaseScheduler::Impl::for_quorum(*l.ctx);
  return l.sched;
}

bool QuorumLockService::Impl::in_any_loop(const QuorumLockService& s) {
  if (loop(s).get_executor().running_in_this_thread()) return true;
  for (auto* c : s.clients_)
    if (c->running_in_loop_thread()) return true;
  return false;
}

struct QuorumLockService::Impl::Acquire : std::enable_shared_from_this<Acquire> {
  std::shared_ptr<QuorumLockService> svc;
  std::string resource, key, fence_key, channel, token;
  QuorumOptions opts;
  ms drift{0}, timeout{0};
  Clock::time_point give_up_at{};
  int attempt = 0;
  AcquireHandler done;
  asio::steady_timer timer;

  explicit Acquire(const asio::any_io_executor& ex) : timer(ex) {}

  void start() {
    ++attempt;
    const auto sent = Clock::now();
    const std::string ttl = std::to_string(opts.ttl.count());
    const std::string fence = opts.fence ? "1" : "0";
    auto self = shared_from_this();
    fan_out(
        svc->size(),
        [&](std::size_t i, redis::Completion c) {
          redis::Client& cl = svc->instance(i);
          const std::string max_ttl = opts.quarantine ? std::to_string(cl.options().lock_max_ttl.count()) : "";
          cl.async_eval_views(script_acquire(), {key, fence_key, detail::kLockStateKey}, {token, ttl, fence, max_ttl},
                              std::move(c), call_options(timeout));
        },
        [self, sent](Outcomes out) { self->on_votes(sent, std::move(out)); });
  }

  void on_votes(Clock::time_point sent, Outcomes out) {
    const std::size_t n = out.size(), q = svc->quorum();
    std::size_t granted = 0, refused = 0, quarantined = 0, failed = 0;
    std::int64_t fence = -1;
    std::string failures, quarantines;
    for (std::size_t i = 0; i < n; ++i) {
      const auto& o = out[i];
      const auto& r = o.reply;
      if (o.ec || !r.is_array() || r.elements.size() < 2 || !r.elements[0].is_integer()) {
        ++failed;
        if (!failures.empty()) failures += "; ";
        failures += o.ec ? describe_failure(svc->address(i), o, "quorum acquire")
                         : fmt::format("{}: unexpected reply {}", svc->address(i), redis::to_debug_string(r));
        continue;
      }
      switch (r.elements[0].integer) {
        case 1:
          ++granted;
          fence = std::max(fence, r.elements[1].integer);
          break;
        case -2:
          ++quarantined;
          if (!quarantines.empty()) quarantines += "; ";
          quarantines += fmt::format("{}: {} ({} ms more)", svc->address(i),
                                     r.elements.size() > 2 ? r.elements[2].str : std::string("lock state lost"),
                                     r.elements[1].integer);
          break;
        default: ++refused; break;
      }
    }
    // On the clock itself, not in whole milliseconds: a truncated elapsed
    // would overstate the validity by up to 1 ms.
    const auto now = Clock::now();
    const auto elapsed = std::chrono::duration_cast<ms>(now - sent);
    if (granted >= q && now < sent + opts.ttl - drift) {
      if (!opts.fence) return succeed(sent, granted, std::nullopt);
      return raise_fence(sent, fence);
    }
    Error cause;
    if (granted >= q) {
      cause = Error(errc::timeout,
                    fmt::format("quorum acquire of {}: granted on {} of {} instances, but {} ms elapsed + {} ms drift "
                                "left none of the {} ms TTL valid",
                                key, granted, n, elapsed.count(), drift.count(), opts.ttl.count()),
                    error_source::redis);
    } else if (failed > n - q || (refused == 0 && failed >= quarantined && failed > 0)) {
      cause = Error(errc::redis_unavailable,
                    fmt::format("quorum acquire of {}: {} of {} instances answered, {} needed: {}", key, n - failed, n,
                                q, failures),
                    error_source::redis);
    } else if (refused == 0 && quarantined > 0) {
      cause = Error(errc::server_busy,
                    fmt::format("quorum acquire of {}: {} of {} instances lost lock state and refuse grants: {}", key,
                                quarantined, n, quarantines),
                    error_source::redis);
    }
    // else: busy, someone else holds enough instances (an empty cause).
    undo_then_retry(std::move(cause));
  }

  // Two majorities share an instance, but the shared one may have issued
  // a smaller fence than the majority's maximum: the maximum is written to
  // a majority before anyone is told, so every later majority contains an
  // instance whose counter is at least this fence (docs/redlock.md).
  void raise_fence(Clock::time_point sent, std::int64_t fence) {
    auto self = shared_from_this();
    const std::string f = fmt::format("{}", fence);
    fan_out(
        svc->size(),
        [&](std::size_t i, redis::Completion c) {
          svc->instance(i).async_eval_views(script_fence(), {key, fence_key}, {token, f}, std::move(c),
                                            call_options(timeout));
        },
        [self, sent, fence](Outcomes out) {
          std::size_t ok = 0;
          for (const auto& o : out)
            if (!o.ec && o.reply.is_integer() && o.reply.integer == 1) ++ok;
          const auto now = Clock::now();
          const auto elapsed = std::chrono::duration_cast<ms>(now - sent);
          if (ok >= self->svc->quorum() && now < sent + self->opts.ttl - self->drift)
            return self->succeed(sent, ok, fence);
          self->undo_then_retry(Error(
              errc::timeout,
              fmt::format("quorum acquire of {}: the fence {} was raised on {} of {} instances within the validity "
                          "time ({} ms elapsed)",
                          self->key, fence, ok, self->svc->size(), elapsed.count()),
              error_source::redis));
        });
  }

  void succeed(Clock::time_point sent, std::size_t granted, std::optional<std::int64_t> fence) {
    QuorumLock l;
    l.service_ = svc;
    l.resource_ = resource;
    l.key_ = key;
    l.token_ = token;
    l.fence_ = fence;
    l.ttl_ = opts.ttl;
    l.drift_ = drift;
    l.drift_factor_ = opts.clock_drift_factor;
    l.instance_timeout_ = timeout;
    l.acquired_at_ = sent;
    l.valid_until_ = sent + opts.ttl - drift;
    l.granted_ = granted;
    l.held_ = true;
    auto d = std::move(done);
    d(Error(), std::move(l));
  }

  // Every instance, those that refused or did not answer included: a vote
  // whose reply was lost may still have been cast.
  void undo_then_retry(Error cause) {
    auto self = shared_from_this();
    release_all(*svc, key, channel, token, timeout, [self, cause = std::move(cause)](const Error&, std::size_t) mutable {
      self->retry_or_finish(std::move(cause));
    });
  }

  void retry_or_finish(Error cause) {
    const auto now = Clock::now();
    const ms cap = std::min(opts.backoff_max, ms(opts.backoff_min.count() * (std::int64_t{1} << std::min(attempt, 20))));
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::uniform_int_distribution<std::int64_t> d(opts.backoff_min.count(), std::max(opts.backoff_min, cap).count());
    const ms backoff(d(rng));
    if (now + backoff >= give_up_at) {
      auto h = std::move(done);
      return h(cause, std::nullopt);
    }
    auto self = shared_from_this();
    // The timer lives on the service's loop; this may run on an instance's.
    asio::post(timer.get_executor(), [self, backoff] {
      self->timer.expires_after(backoff);
      self->timer.async_wait([self](const boost::system::error_code&) { self->start(); });
    });
  }
};

QuorumLockService::QuorumLockService(std::vector<redis::Client*> instances, KeyBuilder keys)
    : clients_(std::move(instances)), keys_(std::move(keys)), loop_(std::make_shared<QuorumLoop>()) {
  for (auto* c : clients_) addresses_.push_back(c->address());
}
QuorumLockService::~QuorumLockService() = default;

std::shared_ptr<QuorumLockService> QuorumLockService::create(std::vector<redis::Client*> instances, KeyBuilder keys) {
  if (instances.empty()) throw Error(errc::invalid_argument, "a quorum lock needs at least one Redis instance");
  for (auto* c : instances) {
    if (c == nullptr) throw Error(errc::invalid_argument, "a quorum lock's instance is null");
    // Its lock-state record and a lock key are in different slots, and a
    // Cluster's shards are not independent of each other anyway.
    if (c->options().cluster)
      throw Error(errc::invalid_argument,
                  fmt::format("{} is a Redis Cluster: a quorum lock's instances are independent primaries", c->address()));
  }
  for (std::size_t i = 0; i < instances.size(); ++i)
    for (std::size_t j = i + 1; j < instances.size(); ++j)
      if (instances[i] == instances[j] || instances[i]->address() == instances[j]->address())
        throw Error(errc::invalid_argument,
                    fmt::format("{} is given twice: a quorum needs independent instances", instances[i]->address()));
  return std::shared_ptr<QuorumLockService>(new QuorumLockService(std::move(instances), std::move(keys)));
}

void QuorumLockService::async_acquire(std::string resource, QuorumOptions opts, AcquireHandler done) {
  if (opts.ttl < ms(10)) throw Error(errc::invalid_argument, "quorum lock ttl must be >= 10 ms");
  if (!(opts.clock_drift_factor >= 0.0 && opts.clock_drift_factor < 1.0))
    throw Error(errc::invalid_argument, "clock_drift_factor must be in [0, 1)");
  if (opts.wait < ms(0) || opts.instance_timeout < ms(0) || opts.backoff_min <= ms(0) ||
      opts.backoff_max < opts.backoff_min)
    throw Error(errc::invalid_argument, "quorum lock: negative wait/instance_timeout, or backoff_min <= 0 or > backoff_max");
  for (auto* c : clients_)
    if (opts.quarantine && opts.ttl > c->options().lock_max_ttl)
      throw Error(errc::invalid_argument,
                  fmt::format("quorum lock ttl {} ms is above the max TTL {} ms of {}: a lease could outlive its "
                              "instance's quarantine",
                              opts.ttl.count(), c->options().lock_max_ttl.count(), c->address()));
  auto a = std::make_shared<Impl::Acquire>(Impl::loop(*this).get_executor());
  a->svc = shared_from_this();
  a->key = keys_.lock_key(resource);
  a->fence_key = keys_.fence_key(resource);
  a->channel = keys_.channel(resource);
  a->resource = std::move(resource);
  a->token = make_token(opts.job_id);
  a->drift = quorum_drift(opts.ttl, opts.clock_drift_factor);
  a->timeout = opts.instance_timeout.count() > 0 ? opts.instance_timeout : default_instance_timeout(opts.ttl);
  a->give_up_at = Clock::now() + opts.wait;
  a->opts = std::move(opts);
  a->done = std::move(done);
  a->start();
}

std::optional<QuorumLock> QuorumLockService::acquire(std::string_view resource, const QuorumOptions& opts) {
  if (Impl::in_any_loop(*this))
    throw Error(errc::invalid_argument, "QuorumLockService::acquire blocks: use async_acquire on an event-loop thread");
  std::promise<std::optional<QuorumLock>> p;
  auto f = p.get_future();
  async_acquire(std::string(resource), opts, [&p](const Error& e, std::optional<QuorumLock> l) {
    if (!e) return p.set_value(std::move(l));
    // A copy whose text nothing on this thread shares once the caller can
    // see it: the temporary dies before set_exception, in its own statement
    // (as LockService::acquire's caller_exception). Otherwise the loop frees
    // shared text after the caller read it, ordered only by the exception's
    // reference count, which TSan cannot see in the uninstrumented libstdc++
    // (tests/tsan_suppressions.cpp).
    std::exception_ptr ep = std::make_exception_ptr(Error(e.code(), std::string(e.detail()), e.source()));
    p.set_exception(std::move(ep));
  });
  return f.get();
}

// --- the lock --------------------------------------------------------------------

QuorumLock::QuorumLock(QuorumLock&& o) noexcept { *this = std::move(o); }

QuorumLock& QuorumLock::operator=(QuorumLock&& o) noexcept {
  if (this != &o) {
    if (held_ && service_)
      release_all(*service_, key_, service_->keys().channel(resource_), token_, instance_timeout_, nullptr);
    service_ = std::move(o.service_);
    resource_ = std::move(o.resource_);
    key_ = std::move(o.key_);
    token_ = std::move(o.token_);
    fence_ = o.fence_;
    ttl_ = o.ttl_;
    drift_ = o.drift_;
    drift_factor_ = o.drift_factor_;
    instance_timeout_ = o.instance_timeout_;
    acquired_at_ = o.acquired_at_;
    valid_until_ = o.valid_until_;
    granted_ = o.granted_;
    held_ = std::exchange(o.held_, false);
  }
  return *this;
}

QuorumLock::~QuorumLock() {
  if (held_ && service_) {
    try {
      release_all(*service_, key_, service_->keys().channel(resource_), token_, instance_timeout_, nullptr);
    } catch (...) {
      // A client shutting down: the TTL frees the lock.
    }
  }
}

std::chrono::milliseconds QuorumLock::validity_left() const noexcept {
  const auto now = Clock::now();
  if (!held_ || now >= valid_until_) return ms(0);
  return std::chrono::duration_cast<ms>(valid_until_ - now);
}

void QuorumLock::async_release(ReleaseHandler done) {
  if (!service_) throw Error(errc::invalid_argument, "release of a moved-from QuorumLock");
  if (!held_) {
    asio::post(QuorumLockService::Impl::loop(*service_), [done = std::move(done)] {
      if (done) done(Error(), 0);
    });
    return;
  }
  held_ = false;
  release_all(*service_, key_, service_->keys().channel(resource_), token_, instance_timeout_, std::move(done));
}

std::size_t QuorumLock::release() {
  if (!held_ || !service_) return 0;
  if (QuorumLockService::Impl::in_any_loop(*service_))
    throw Error(errc::invalid_argument, "QuorumLock::release blocks: use async_release on an event-loop thread");
  std::promise<std::size_t> p;
  auto f = p.get_future();
  // An instance that failed is left to its TTL: the count says enough.
  async_release([&p](const Error&, std::size_t n) { p.set_value(n); });
  return f.get();
}

bool QuorumLock::extend(std::chrono::milliseconds ttl) {
  if (!held_ || !service_) return false;
  if (QuorumLockService::Impl::in_any_loop(*service_))
    throw Error(errc::invalid_argument, "QuorumLock::extend blocks: not on an event-loop thread");
  if (ttl.count() <= 0) ttl = ttl_;
  if (ttl < ms(10)) throw Error(errc::invalid_argument, "quorum lock ttl must be >= 10 ms");
  const auto sent = Clock::now();
  std::promise<ExtendTally> p;
  auto f = p.get_future();
  extend_all(*service_, key_, token_, ttl, instance_timeout_, [&p](ExtendTally t) { p.set_value(std::move(t)); });
  const auto t = f.get();
  const auto until = sent + ttl - quorum_drift(ttl, drift_factor_);
  if (t.ok < service_->quorum() || Clock::now() >= until) return false;
  ttl_ = ttl;
  drift_ = quorum_drift(ttl, drift_factor_);
  valid_until_ = until;
  granted_ = t.ok;
  return true;
}

}  // namespace jobguard
