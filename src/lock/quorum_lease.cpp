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
#include "lock/lease_timeline.hpp"
#include "lock/quorum_internal.hpp"

namespace jobguard {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;
using detail::ExtendTally;
using detail::extend_all;
using detail::release_all;

// The lease's decisions (when to renew, when it is lost, how long it is
// safe) are detail::LeaseTimeline's, as a Lease's are; this shell sends the
// renewals to every instance, counts the majority and arms the timer on the
// quorum service's loop.
struct QuorumLease::State : std::enable_shared_from_this<QuorumLease::State> {
  QuorumLock lock;
  LeaseOptions opts;
  std::shared_ptr<QuorumLockService> svc;
  std::atomic<LeaseState> state{LeaseState::active};
  std::atomic<Clock::rep> safe_until{0};  // the timeline's, for other threads
  std::atomic<std::uint64_t> renewals{0};
  std::stop_source stop;
  mutable std::mutex mu;  // reason, on_lost
  std::string reason;
  std::function<void(LeaseState, const std::string&)> on_lost;
  // Touched only on the service's event loop, like everything below.
  detail::LeaseTimeline tl;
  asio::steady_timer timer;
  ExtendTally last;  // the last renewal's answers, for the reason
  std::mt19937_64 rng{std::random_device{}()};

  State(QuorumLock l, const LeaseOptions& o)
      : lock(std::move(l)),
        opts(o),
        svc(lock.service_),
        tl(config(lock, o), lock.acquired_at()),
        timer(QuorumLockService::Impl::loop(*svc).get_executor()) {
    // Extended since its grant: the safe time counts from the extension.
    const auto extended = lock.valid_until() + lock.drift_ - lock.ttl();
    if (extended > lock.acquired_at()) {
      tl.renewal_sent(extended);
      tl.renewal_succeeded(extended);
    }
    safe_until.store(tl.safe_until().time_since_epoch().count());
  }
  // The lease's own paths release (or not, when lost): never the lock's destructor.
  ~State() { lock.detach(); }

  // A Lease's timeline, but for the quorum's drift allowance (the lock's,
  // unless LeaseOptions::drift) and its retry: a quarter period, uncapped.
  static detail::LeaseTimeline::Config config(const QuorumLock& l, const LeaseOptions& o) {
    auto c = detail::LeaseTimeline::resolve(l.ttl(), o);
    c.drift = o.drift.count() > 0 ? o.drift : l.drift_;
    c.retry_every = std::max(ms(1), c.renew_every / 4);
    return c;
  }

  Clock::time_point until() const { return Clock::time_point(Clock::duration(safe_until.load())); }

  double jitter() {
    const double frac = std::clamp(opts.jitter, 0.0, 0.9);
    return std::uniform_real_distribution<double>(1.0 - frac, 1.0 + frac)(rng);
  }

  // Wakes at the next renewal, the end of the safe time or the hard
  // timeout, whichever is first (the timeline's next_wake), so a loss is
  // noticed when it happens even while a renewal is still out.
  void arm() {
    timer.expires_at(tl.next_wake());
    timer.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->tick();
    });
  }

  void tick() {
    if (state.load() != LeaseState::active) return;
    const auto now = Clock::now();
    if (tl.poll(now)) {
      tl.renewal_sent(now);
      auto self = shared_from_this();
      extend_all(*svc, lock.key(), lock.token(), lock.ttl(), lock.instance_timeout_, [self](ExtendTally t) {
        asio::post(self->timer.get_executor(), [self, t = std::move(t)] { self->on_renewed(t); });
      });
    }
    if (publish()) arm();
  }

  void on_renewed(const ExtendTally& t) {
    if (state.load() != LeaseState::active) return;
    const auto now = Clock::now();
    const std::size_t n = svc->size(), q = svc->quorum();
    last = t;
    if (t.ok >= q) {
      // A reply after the safe time ran out (the holder may have been told
      // it has none) still loses the lease: the timeline looks at `now`.
      tl.renewal_succeeded(now, jitter());
      if (tl.state() == LeaseState::active) renewals.fetch_add(1);
    } else if (t.gone > n - q) {
      tl.renewal_token_gone();
    } else {
      // Too few answered: try again soon, until the safe time runs out.
      tl.renewal_failed(now, t.failures);
    }
    if (publish()) arm();
  }

  // The timeline's state made visible; false once the lease is lost.
  bool publish() {
    safe_until.store(tl.safe_until().time_since_epoch().count());
    const LeaseState st = tl.state();
    if (st == LeaseState::active) return true;
    lose(st, why_lost(st));
    // Still ours: free it for the next holder now rather than at the TTL.
    if (st == LeaseState::timed_out)
      release_all(*svc, lock.key(), svc->keys().channel(lock.resource()), lock.token(), lock.instance_timeout_, nullptr);
    return false;
  }

  std::string why_lost(LeaseState st) const {
    const std::size_t n = svc->size(), q = svc->quorum();
    if (st == LeaseState::timed_out)
      return fmt::format("quorum lease on {} lost: hard timeout of {} ms", lock.key(), opts.hard_timeout.count());
    if (st == LeaseState::token_gone)
      return fmt::format("quorum lease on {} lost: the token is no longer ours on {} of {} instances (a majority of "
                         "{} cannot be had)",
                         lock.key(), last.gone, n, q);
    return fmt::format("quorum lease on {} lost: no renewal acknowledged by a majority ({} of {}) within the safe "
                       "time{}{}",
                       lock.key(), q, n, last.failures.empty() ? "" : "; last: ", last.failures);
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
