// A quorum lock kept alive: renewed on a majority before its safe time runs
// out, lost when it cannot be (quorum.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <mutex>
#include <random>

#include "jobguard/quorum.hpp"
#include "jobguard/redis/client.hpp"
#include "lock/quorum_internal.hpp"

namespace jobguard {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;
using detail::ExtendTally;
using detail::extend_all;
using detail::release_all;

struct QuorumLease::State : std::enable_shared_from_this<QuorumLease::State> {
  QuorumLock lock;
  LeaseOptions opts;
  ms period{0}, drift{0};
  std::shared_ptr<QuorumLockService> svc;
  std::atomic<LeaseState> state{LeaseState::active};
  std::atomic<Clock::rep> safe_until{0};
  std::atomic<std::uint64_t> renewals{0};
  std::stop_source stop;
  mutable std::mutex mu;  // reason, on_lost
  std::string reason;
  std::function<void(LeaseState, const std::string&)> on_lost;
  // Touched only on the service's event loop, like everything below.
  asio::steady_timer timer;
  bool renewing = false;
  Clock::time_point next_renewal{};
  std::string last_failures;  // the last renewal's unanswered instances, for the reason
  std::mt19937_64 rng{std::random_device{}()};

  State(QuorumLock l, const LeaseOptions& o)
      : lock(std::move(l)), opts(o), svc(lock.service_), timer(QuorumLockService::Impl::loop(*svc).get_executor()) {}
  // The lease's own paths release (or not, when lost): never the lock's destructor.
  ~State() { lock.detach(); }

  Clock::time_point until() const { return Clock::time_point(Clock::duration(safe_until.load())); }

  ms jittered() {
    const double frac = std::clamp(opts.jitter, 0.0, 0.9);
    std::uniform_real_distribution<double> d(1.0 - frac, 1.0 + frac);
    return ms(std::max<std::int64_t>(1, static_cast<std::int64_t>(static_cast<double>(period.count()) * d(rng))));
  }

  std::optional<Clock::time_point> hard() const {
    if (opts.hard_timeout.count() <= 0) return std::nullopt;
    return lock.acquired_at() + opts.hard_timeout;
  }

  // Wakes at the next renewal, the end of the safe time or the hard
  // timeout, whichever is first, so a loss is noticed when it happens even
  // while a renewal is still out.
  void arm() {
    auto at = std::min(until(), renewing ? until() : next_renewal);
    if (auto h = hard()) at = std::min(at, *h);
    timer.expires_at(at);
    timer.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->tick();
    });
  }

  void tick() {
    if (state.load() != LeaseState::active) return;
    const auto now = Clock::now();
    if (auto h = hard(); h && now >= *h) {
      lose(LeaseState::timed_out, fmt::format("quorum lease on {} lost: hard timeout of {} ms", lock.key(),
                                              opts.hard_timeout.count()));
      // Still ours: free it for the next holder now rather than at the TTL.
      release_all(*svc, lock.key(), svc->keys().channel(lock.resource()), lock.token(), lock.instance_timeout_, nullptr);
      return;
    }
    if (now >= until()) {
      lose(LeaseState::expired, fmt::format("quorum lease on {} lost: no renewal acknowledged by a majority ({} of {}) "
                                            "within the safe time{}{}",
                                            lock.key(), svc->quorum(), svc->size(), last_failures.empty() ? "" : "; last: ",
                                            last_failures));
      return;
    }
    if (!renewing && now >= next_renewal) {
      renewing = true;
      const auto sent = now;
      auto self = shared_from_this();
      extend_all(*svc, lock.key(), lock.token(), lock.ttl(), lock.instance_timeout_, [self, sent](ExtendTally t) {
        asio::post(self->timer.get_executor(), [self, sent, t = std::move(t)] { self->on_renewed(sent, t); });
      });
    }
    arm();
  }

  void on_renewed(Clock::time_point sent, const ExtendTally& t) {
    renewing = false;
    if (state.load() != LeaseState::active) return;
    const auto now = Clock::now();
    if (now >= until()) {
      // The safe time ran out while the renewal was out: the holder may
      // already have been told it has none (safe_time_left), so it is lost
      // even if the renewal then succeeds.
      lose(LeaseState::expired, fmt::format("quorum lease on {} lost: the safe time ran out before a majority ({} "
                                            "of {}) acknowledged a renewal",
                                            lock.key(), svc->quorum(), svc->size()));
      return;
    }
    const auto until_new = sent + lock.ttl() - drift;
    const std::size_t n = svc->size(), q = svc->quorum();
    if (t.ok >= q && now < until_new) {
      safe_until.store(std::max(until(), until_new).time_since_epoch().count());
      renewals.fetch_add(1);
      next_renewal = sent + jittered();
    } else if (t.gone > n - q) {
      lose(LeaseState::token_gone,
           fmt::format("quorum lease on {} lost: the token is no longer ours on {} of {} instances (a majority of {} "
                       "cannot be had)",
                       lock.key(), t.gone, n, q));
      return;
    } else {
      // Too few answered: try again soon, until the safe time runs out.
      next_renewal = now + std::max(ms(1), period / 4);
      last_failures = t.failures;
    }
    arm();
  }

  void lose(LeaseState st, std::string why) {
    std::function<void(LeaseState, const std::string&)> cb;
    {
      // The reason is set with the state, under the lock on_lost() reads
      // both under: a callback registered just after never sees it empty.
      std::lock_guard<std::mutex> lk(mu);
      auto expected = LeaseState::active;
      if (!state.compare_exchange_strong(expected, st)) return;
      reason = std::move(why);
      cb = std::move(on_lost);
      on_lost = nullptr;
    }
    stop.request_stop();
    timer.cancel();
    if (cb) cb(st, reason);
  }
};

QuorumLease QuorumLease::adopt(QuorumLock lock, const LeaseOptions& opts) {
  if (!lock.held() || !lock.service())
    throw Error(errc::invalid_argument, "QuorumLease::adopt: the lock is not held");
  if (opts.renew_every.count() < 0 || opts.drift.count() < 0 || opts.hard_timeout.count() < 0)
    throw Error(errc::invalid_argument, "QuorumLease: negative renew_every, drift or hard_timeout");
  auto s = std::make_shared<State>(std::move(lock), opts);
  s->period = opts.renew_every.count() > 0 ? opts.renew_every : std::max(ms(1), s->lock.ttl() / 3);
  s->drift = opts.drift.count() > 0 ? opts.drift : s->lock.drift_;
  // valid_until is the last grant or extension's send time + ttl - the lock's drift.
  s->safe_until.store((s->lock.valid_until() + s->lock.drift_ - s->drift).time_since_epoch().count());
  s->next_renewal = s->lock.acquired_at() + s->jittered();
  asio::post(s->timer.get_executor(), [s] { s->tick(); });
  return QuorumLease(std::move(s));
}

QuorumLease::QuorumLease(QuorumLease&&) noexcept = default;
QuorumLease& QuorumLease::operator=(QuorumLease&& o) noexcept {
  if (this != &o) {
    if (s_) {
      try {
        release();
      } catch (...) {
      }
    }
    s_ = std::move(o.s_);
  }
  return *this;
}
QuorumLease::~QuorumLease() {
  if (!s_) return;
  try {
    release();
  } catch (...) {
    // A client shutting down: the TTL frees the lock.
  }
}

const std::string& QuorumLease::key() const noexcept { return s_->lock.key(); }
const std::string& QuorumLease::token() const noexcept { return s_->lock.token(); }
const std::string& QuorumLease::resource() const noexcept { return s_->lock.resource(); }
std::optional<std::int64_t> QuorumLease::fence() const noexcept { return s_->lock.fence(); }

std::chrono::milliseconds QuorumLease::safe_time_left() const noexcept {
  if (s_->state.load() != LeaseState::active) return ms(0);
  const auto now = Clock::now(), until = s_->until();
  return now >= until ? ms(0) : std::chrono::duration_cast<ms>(until - now);
}
Clock::time_point QuorumLease::deadline() const noexcept { return s_->until(); }

void QuorumLease::ensure(std::chrono::milliseconds min_left) const {
  const auto left = safe_time_left();
  if (left <= ms(0) || left < min_left) {
    throw Error(errc::lease_lost, s_->state.load() != LeaseState::active
                                      ? reason()
                                      : fmt::format("quorum lease on {} has {} ms of safe time left, {} ms required",
                                                    key(), left.count(), min_left.count()));
  }
}

bool QuorumLease::lost() const noexcept {
  const auto st = s_->state.load();
  return st != LeaseState::active && st != LeaseState::released;
}
LeaseState QuorumLease::state() const noexcept { return s_->state.load(); }
std::string QuorumLease::reason() const {
  std::lock_guard<std::mutex> lk(s_->mu);
  return s_->reason;
}
std::uint64_t QuorumLease::renewals() const noexcept { return s_->renewals.load(); }
std::stop_token QuorumLease::stop_token() const noexcept { return s_->stop.get_token(); }

void QuorumLease::on_lost(std::function<void(LeaseState, const std::string&)> fn) {
  std::unique_lock<std::mutex> lk(s_->mu);
  const auto st = s_->state.load();
  if (st != LeaseState::active && st != LeaseState::released) {
    const std::string why = s_->reason;
    lk.unlock();
    asio::post(s_->timer.get_executor(), [fn = std::move(fn), st, why] { fn(st, why); });
    return;
  }
  s_->on_lost = std::move(fn);
}

bool QuorumLease::release() {
  auto s = s_;
  auto expected = LeaseState::active;
  if (!s->state.compare_exchange_strong(expected, LeaseState::released)) return false;
  asio::post(s->timer.get_executor(), [s] { s->timer.cancel(); });
  if (QuorumLockService::Impl::in_any_loop(*s->svc)) {
    s->lock.async_release([s](std::size_t) {});
    return true;
  }
  return s->lock.release() >= s->svc->quorum();
}

}  // namespace jobguard
