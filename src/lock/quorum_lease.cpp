// The quorum kind of lease entry: a LeaseScheduler renews a quorum lock on
// every instance and counts the majority, from the same deadline queue and
// timeline as its single-server leases (lease_internal.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <boost/asio/post.hpp>

#include "jobguard/quorum.hpp"
#include "lock/lease_internal.hpp"

namespace jobguard {

namespace asio = boost::asio;
using ms = std::chrono::milliseconds;

namespace {

// A Lease's timeline, but for the quorum's drift allowance (the lock's,
// unless LeaseOptions::drift) and its retry: a quarter period, uncapped.
detail::LeaseTimeline::Config quorum_config(const QuorumLock& l, ms lock_drift, const LeaseOptions& o) {
  auto c = detail::LeaseTimeline::resolve(l.ttl(), o);
  c.drift = o.drift.count() > 0 ? o.drift : lock_drift;
  c.retry_every = std::max(ms(1), c.renew_every / 4);
  return c;
}

}  // namespace

Lease LeaseScheduler::adopt(QuorumLock lock, const LeaseOptions& opts) {
  if (!lock.held() || !lock.service()) throw Error(errc::invalid_argument, "adopt: the quorum lock is not held");
  if (opts.renew_every.count() < 0 || opts.drift.count() < 0 || opts.hard_timeout.count() < 0)
    throw Error(errc::invalid_argument, "quorum lease: negative renew_every, drift or hard_timeout");
  if (opts.jitter < 0 || opts.jitter >= 1) throw Error(errc::invalid_argument, "lease jitter must be in [0, 1)");
  if (&impl_->clock != &MonotonicClock::steady())
    throw Error(errc::invalid_argument,
                "adopt: a quorum lock's grant time is read on the steady clock; this scheduler counts on another");
  auto s = std::make_shared<Lease::State>(shared_from_this(), Lock(), opts, impl_->clock,
                                          impl_->registry.lock_class("quorum"));
  s->tl = detail::LeaseTimeline(quorum_config(lock, lock.drift_, opts), lock.acquired_at());
  // Extended since its grant: the safe time counts from the extension.
  const auto extended = lock.valid_until() + lock.drift_ - lock.ttl();
  if (extended > lock.acquired_at()) {
    s->tl.renewal_sent(extended);
    s->tl.renewal_succeeded(extended);
  }
  s->coalesce = s->tl.config().coalesce;
  s->safe_until_ns.store(s->tl.safe_until().time_since_epoch().count());
  s->quorum = std::make_unique<Lease::State::Quorum>(std::move(lock));
  impl_->active.fetch_add(1);
  asio::post(impl_->timer.get_executor(), [impl = impl_, s] {
    impl->publish(s);  // a lock adopted after its safe time is lost at once
    impl->schedule(s);
  });
  return Lease(std::move(s));
}

std::optional<Lease> LeaseScheduler::acquire(QuorumLockService& quorum, std::string_view resource,
                                             const QuorumOptions& lock_opts, const LeaseOptions& lease_opts) {
  auto l = quorum.acquire(resource, lock_opts);
  if (!l) return std::nullopt;
  return adopt(std::move(*l), lease_opts);
}

QuorumLease QuorumLease::adopt(QuorumLock lock, const LeaseOptions& opts) {
  if (!lock.held() || !lock.service())
    throw Error(errc::invalid_argument, "QuorumLease::adopt: the lock is not held");
  auto sched = QuorumLockService::Impl::scheduler(*lock.service());
  return QuorumLease(sched->adopt(std::move(lock), opts));
}

void LeaseScheduler::Impl::send_quorum_renewal(const std::shared_ptr<Lease::State>& s) {
  auto self = owner.lock();
  if (!self) return;
  const QuorumLock& q = s->quorum->lock;
  // The answers come on the instances' loops: counted back on this one,
  // where the timeline lives.
  detail::extend_all(*q.service(), q.key(), q.token(), q.ttl(), q.instance_timeout_,
                     [this, self, s](detail::ExtendTally t) {
                       asio::post(timer.get_executor(),
                                  [this, self, s, t = std::move(t)] { quorum_renewed(s, t); });
                     });
}

void LeaseScheduler::Impl::quorum_renewed(const std::shared_ptr<Lease::State>& s, const detail::ExtendTally& t) {
  const auto now = clock.now();
  const auto& svc = *s->quorum->lock.service();
  const std::size_t n = svc.size(), q = svc.quorum();
  s->quorum->last = t;
  auto& m = s->metrics;
  if (t.ok >= q) {
    // A reply after the safe time ran out (the holder may have been told
    // it has none) still loses the lease: the timeline looks at `now`.
    s->tl.renewal_succeeded(now, jitter(s->opts.jitter));
    if (s->tl.state() == LeaseState::active) {
      m.renewals_total.inc();
      s->renewals.fetch_add(1, std::memory_order_relaxed);
    }
  } else if (t.gone > n - q) {
    m.renewal_failures_total.inc();
    s->tl.renewal_token_gone();
  } else {
    // Too few answered: try again soon, until the safe time runs out.
    m.renewal_failures_total.inc();
    failures.fetch_add(1, std::memory_order_relaxed);
    s->tl.renewal_failed(now, t.failures);
  }
  publish(s);
  schedule(s);
}

std::string LeaseScheduler::Impl::quorum_why_lost(const Lease::State& s, LeaseState st) {
  const auto& svc = *s.quorum->lock.service();
  const std::size_t n = svc.size(), q = svc.quorum();
  const auto& last = s.quorum->last;
  const auto& key = s.quorum->lock.key();
  if (st == LeaseState::timed_out)
    return fmt::format("quorum lease on {} lost: hard timeout of {} ms", key, s.opts.hard_timeout.count());
  if (st == LeaseState::token_gone)
    return fmt::format("quorum lease on {} lost: the token is no longer ours on {} of {} instances (a majority of "
                       "{} cannot be had)",
                       key, last.gone, n, q);
  return fmt::format("quorum lease on {} lost: no renewal acknowledged by a majority ({} of {}) within the safe "
                     "time{}{}",
                     key, q, n, last.failures.empty() ? "" : "; last: ", last.failures);
}

// Stopped (stop_for_release): compare-and-delete on every instance.
bool Lease::release_quorum() {
  auto s = s_;
  QuorumLock& l = s->quorum->lock;
  const auto& svc = *l.service();
  if (QuorumLockService::Impl::in_any_loop(svc) || s->sched->impl_->on_loop()) {
    l.async_release([s](const Error&, std::size_t) {});
    return true;
  }
  return l.release() >= svc.quorum();
}

}  // namespace jobguard
