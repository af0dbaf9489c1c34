// What keeps leases alive: one timer and one deadline queue for every lease
// of a LockService, renewals batched into one script call per turn of the
// loop, losses found and told (lease_internal.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <utility>

#include "jobguard/admin.hpp"
#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"
#include "lock/lease_internal.hpp"

namespace jobguard {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;

double LeaseScheduler::Impl::jitter(double frac) {
  if (frac <= 0) return 1.0;
  std::uniform_real_distribution<double> d(1.0 - frac, 1.0 + frac);
  return d(rng);
}

void LeaseScheduler::Impl::schedule(const std::shared_ptr<Lease::State>& s) {
  dequeue(*s);
  if (s->tl.state() != LeaseState::active) return;
  max_coalesce = std::max(max_coalesce, std::min(s->coalesce, ms(50)));
  queue.push(s->tl.next_wake(), s, ++s->qgen);
  s->queued = true;
  ++queued;
  arm();
}

void LeaseScheduler::Impl::dequeue(Lease::State& s) {
  if (!s.queued) return;
  s.queued = false;  // its entry is stale from now on
  --queued;
}

void LeaseScheduler::Impl::unschedule(const std::shared_ptr<Lease::State>& s) {
  dequeue(*s);
  if (queued == 0) {
    // Only stale entries left: drop them, and the States they keep alive.
    queue.clear();
  }
  if (queued == 0 && armed_for != Clock::time_point::max()) {
    // Nothing left to renew: drop the wake-up, whose handler keeps the
    // scheduler (and its service) alive, so a loop being shut down is not
    // held up to ttl/3 by it.
    timer.cancel();
    armed_for = Clock::time_point::max();
  }
}

void LeaseScheduler::Impl::arm() {
  if (queue.empty()) return;
  const auto first = queue.next();
  if (first >= armed_for) return;
  armed_for = first;
  // The timer runs on the host's steady clock; the queue holds instants of
  // ours, so it waits for what is left of them by our clock.
  const auto left = first - clock.now();
  timer.expires_after(left.count() > 0 ? left : Clock::duration::zero());
  timer.async_wait([this, keep = owner.lock()](boost::system::error_code ec) {
    if (ec == asio::error::operation_aborted) return;  // re-armed earlier, or shutting down
    armed_for = Clock::time_point::max();
    tick();
  });
}

void LeaseScheduler::Impl::publish(const std::shared_ptr<Lease::State>& s) {
  s->safe_until_ns.store(s->tl.safe_until().time_since_epoch().count());
  const LeaseState st = s->tl.state();
  if (st == LeaseState::active || st == LeaseState::released) return;
  std::function<void(LeaseState, const std::string&)> cb;
  std::string why;
  {
    // The state changes under the lock that on_lost() registers under: a
    // callback registered now is either taken here or finds the loss and is
    // posted, never stored after the take and left uncalled. A compare, not
    // a store: a release on another thread (stop_for_release) may have
    // ended the lease since the check above, and then it is not lost.
    std::lock_guard<std::mutex> g(s->mu);
    LeaseState expected = LeaseState::active;
    if (!s->state.compare_exchange_strong(expected, st)) return;
    s->reason = s->quorum ? quorum_why_lost(*s, st) : fmt::format("lease on {} lost: {}", keys_text(*s), s->tl.reason());
    why = s->reason;
    cb = std::move(s->on_lost);
    s->on_lost = nullptr;
  }
  // Counted before the loss is published (the stop below): a caller that
  // sees lost() reads the counts complete, and may then let the registry go.
  s->metrics.leases_lost_total.inc();
  s->metrics.hold_seconds.observe(clock.now() - s->acquired_at());
  // A multi-lock's holds are per key, as its grants and releases are.
  for (const auto& l : s->more) s->metrics.hold_seconds.observe(clock.now() - l.acquired_at());
  // The timeline's record, with the key and holder the counter cannot carry
  // (a hard timeout is the job's own deadline, not an incident).
  if ((st == LeaseState::token_gone || st == LeaseState::expired) && !s->quorum)
    if (auto self = owner.lock())
      admin::record_incident(self->service().client(), self->service().keys(),
                             {.kind = "lease_lost", .resource = s->lock.resource(),
                              .job = token_owner(s->lock.token()), .lock_class = s->lock.lock_class(), .detail = why});
  lost.fetch_add(1);
  active.fetch_sub(1);
  // Last of what a caller may read: Lease::lost() is this stop, so whoever
  // sees it, or the stop token, finds the state, the reason and the counts
  // already in.
  s->stop.request_stop();
  unschedule(s);
  // A multi-lock that lost one key gives back the others at once
  // (compare-and-delete: only those still ours), so the next holder of the
  // set does not wait out their TTL.
  if (st == LeaseState::timed_out || !s->more.empty()) release_timed_out(s);
  if (cb) cb(st, why);
  end(*s, st);
}

void LeaseScheduler::Impl::release_timed_out(const std::shared_ptr<Lease::State>& s) {
  if (s->quorum) {
    const QuorumLock& q = s->quorum->lock;
    const auto& svc = *q.service();
    return detail::release_all(svc, q.key(), svc.keys().channel(q.resource()), q.token(), q.instance_timeout_, nullptr);
  }
  auto self = owner.lock();
  if (!self) return;
  auto one = [&](const Lock& l) {
    self->service().async_release_held(l, [m = &l.metrics()](const Error& e, bool ours) {
      if (e) m->redis_errors_total.inc();
      else if (ours) m->releases_total.inc();
    });
  };
  one(s->lock);
  for (const auto& l : s->more) one(l);
}

std::string LeaseScheduler::Impl::keys_text(const Lease::State& s) {
  std::string out = s.lock.key();
  for (const auto& l : s.more) out.append(", ").append(l.key());
  return out;
}

void LeaseScheduler::Impl::end(Lease::State& s, LeaseState how) {
  std::map<std::uint64_t, std::function<void(LeaseState)>> waiters;
  {
    std::lock_guard<std::mutex> g(s.mu);
    if (s.ended_with) return;
    s.ended_with = how;
    waiters.swap(s.end_waiters);
  }
  for (auto& [id, fn] : waiters) fn(how);
}

void LeaseScheduler::Impl::tick() {
  const auto now = clock.now();
  // Everything due now, plus renewals due within the coalescing window, go
  // out in this turn of the loop: the client writes them as one pipeline.
  std::vector<std::shared_ptr<Lease::State>> due;
  // Not a fixed bound: an entry up to the horizon that is not taken (its
  // own window is narrower than the widest) is looked at again next tick.
  queue.take_until(now + max_coalesce, [&](auto& e) {
    if (!current(e)) return true;
    if (e.at > now + e.item->coalesce) return false;
    dequeue(*e.item);
    due.push_back(std::move(e.item));
    return true;
  });
  // Renewals go out in batches, one script call each (extend_many.lua):
  // 100,000 leases cost a few hundred calls a TTL/3 instead of one per
  // lease, which is what the client's CPU (and the server's) pays for.
  std::vector<std::shared_ptr<Lease::State>> batch;
  for (auto& s : due) {
    if (s->tl.poll(now, s->coalesce)) {
      s->tl.renewal_sent(now);
      renewals_sent.fetch_add(1, std::memory_order_relaxed);
      if (!batchable(*s)) {
        send_renewal(s);
      } else {
        batch.push_back(s);
        if (batch.size() == kRenewalBatch) send_renewals(std::exchange(batch, {}));
      }
    }
    publish(s);
    // A lease waiting for its reply is rescheduled by poll() to its next
    // check, not its next renewal; the reply reschedules it again.
    schedule(s);
  }
  if (!batch.empty()) send_renewals(std::move(batch));
  arm();
}

std::string LeaseScheduler::Impl::state_lost(Lease::State& s) {
  const auto& now_epoch = gate().epoch();
  if (s.lock.epoch().empty() || now_epoch.empty()) return {};
  // A multi-lock's keys may live on several shards: each is checked
  // against its own shard's epoch, every time (no per-generation cache).
  for (const auto& l : s.more) {
    const auto& theirs = gate().epoch_for(l.key());
    if (!l.epoch().empty() && !theirs.empty() && theirs != l.epoch())
      return fmt::format("the server of {} lost lock state since the grant (epoch {} -> {}); "
                         "another holder may be granted the lock", l.key(), l.epoch(), theirs);
  }
  // Once per lease and epoch, not per renewal: the lease's epoch string is
  // cold memory (one cache miss a renewal, a tenth of the scheduler's time
  // with 100,000 leases); the scheduler's copy of the gate's epoch is hot.
  if (now_epoch != seen_epoch) {
    seen_epoch = now_epoch;
    ++seen_epoch_gen;
  }
  if (s.epoch_same_gen == seen_epoch_gen) return {};
  // On a cluster the epoch of the lease's own shard: a loss on another
  // shard leaves this lease alone. A slot no shard served at the check
  // ("") is not a loss found; the renewals meet whatever it is.
  const auto& mine = gate().epoch_for(s.lock.key());
  if (mine.empty() || mine == s.lock.epoch()) {
    s.epoch_same_gen = seen_epoch_gen;
    return {};
  }
  return fmt::format("the server lost lock state since the grant (epoch {} -> {}); "
                     "another holder may be granted the lock", s.lock.epoch(), mine);
}

void LeaseScheduler::Impl::on_new_epoch(const std::string& reason) {
  std::vector<std::shared_ptr<Lease::State>> hit;
  queue.for_each([&](const auto& e) {
    if (current(e) && !state_lost(*e.item).empty()) hit.push_back(e.item);
  });
  for (auto& s : hit) {
    s->tl.state_lost(state_lost(*s) + (reason.empty() ? "" : ": " + reason));
    publish(s);
  }
}

void LeaseScheduler::Impl::send_renewals(std::vector<std::shared_ptr<Lease::State>> batch) {
  auto self = owner.lock();
  if (!self) return;
  batches.fetch_add(1, std::memory_order_relaxed);
  // Leases are held: keep the gate reading the server's clock, so a step
  // that expires their keys early is found within its probe interval.
  if (gate_ptr) gate().touch();
  // Views into the leases' own strings (the batch keeps them alive while
  // the request is encoded): no copies.
  std::vector<LockService::ExtendEntry> entries;
  entries.reserve(batch.size());
  for (const auto& s : batch)
    entries.push_back({.resource = s->lock.resource(), .token = s->lock.token(), .ttl = s->lock.ttl(), .key = s->lock.key()});
  self->service().async_extend_many(
      entries, [this, self, batch = std::move(batch)](const Error& e, std::vector<bool> ours) {
        for (std::size_t i = 0; i < batch.size(); ++i) renewed(batch[i], e, !e && ours[i]);
      });
}

void LeaseScheduler::Impl::send_renewal(const std::shared_ptr<Lease::State>& s) {
  if (s->quorum) return send_quorum_renewal(s);
  auto self = owner.lock();
  if (!self) return;
  if (s->more.empty())
    return self->service().async_extend_held(s->lock, s->lock.ttl(),
                                             [this, self, s](const Error& e, bool ours) { renewed(s, e, ours); });
  // A multi-lock: every key renewed at once, and the lease's safe time
  // moves (renewed() once, with the verdict of all) only when every key
  // was; the first key not ours is named in the loss.
  struct Join {
    std::size_t left;
    Error first;
    std::string not_ours;
  };
  auto j = std::make_shared<Join>(Join{1 + s->more.size(), Error(), std::string()});
  auto one = [this, self, s, j](const Lock& l) {
    self->service().async_extend_held(l, l.ttl(), [this, self, s, j, key = l.key()](const Error& e, bool ours) {
      if (e && !j->first) j->first = e;
      if (!e && !ours && j->not_ours.empty()) j->not_ours = key;
      if (--j->left > 0) return;
      if (!j->first && !j->not_ours.empty() && s->tl.state() == LeaseState::active) {
        s->metrics.renewal_failures_total.inc();
        s->tl.state_lost(fmt::format("{} is gone or held by another owner", j->not_ours));
        publish(s);
        return schedule(s);
      }
      renewed(s, j->first, !j->first);
    });
  };
  one(s->lock);
  for (const auto& l : s->more) one(l);
}

bool LeaseScheduler::Impl::batchable(const Lease::State& s) const {
  // A permit or a read-write lock holder renews by its own script
  // (sem_extend.lua), one by one; a quorum lease on every instance.
  return !s.quorum && s.lock.confirmation().replicas == 0 && s.lock.permits() == 0 && s.lock.mode() == LockMode::mutex &&
         s.more.empty() &&
         !s.sched->service().client().options().cluster;
}

void LeaseScheduler::Impl::renewed(const std::shared_ptr<Lease::State>& s, const Error& e, bool ours) {
  const auto t = clock.now();
  auto& m = s->metrics;
  if (e) {
    m.renewal_failures_total.inc();
    m.redis_errors_total.inc();
    failures.fetch_add(1, std::memory_order_relaxed);
    s->tl.renewal_failed(t, e.what());
  } else if (!ours) {
    m.renewal_failures_total.inc();
    s->tl.renewal_token_gone();
  } else if (auto lost_why = state_lost(*s); !lost_why.empty()) {
    s->tl.state_lost(lost_why);
  } else if (!gate().checked_current(s->lock.key())) {
    // The reply came on a connection the server's lock state was not
    // checked on (a reconnect: maybe a restarted server that kept our
    // key from a snapshot, maybe a promoted replica). It proves
    // nothing until the check says the state is the one we were
    // granted in; a check that finds a new epoch loses us at once.
    m.renewal_failures_total.inc();
    s->tl.renewal_failed(t, "reconnected; checking the server's lock state");
    gate().recheck();
  } else {
    m.renewals_total.inc();
    s->renewals.fetch_add(1, std::memory_order_relaxed);
    s->tl.renewal_succeeded(t, jitter(s->opts.jitter));
  }
  publish(s);
  schedule(s);
}

// --- LeaseScheduler -------------------------------------------------------------

LeaseScheduler::LeaseScheduler(std::shared_ptr<LockService> service, const LeaseSchedulerOptions& o)
    : service_(std::move(service)),
      impl_(std::make_shared<Impl>(service_->client().get_executor(), service_->clock(),
                                   o.metrics ? *o.metrics : service_->metrics_registry())) {}

LeaseScheduler::LeaseScheduler(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

LeaseScheduler::~LeaseScheduler() = default;

std::shared_ptr<LeaseScheduler> LeaseScheduler::Impl::for_quorum(asio::io_context& loop) {
  auto impl = std::make_shared<Impl>(loop.get_executor(), MonotonicClock::steady(), observe::Registry::global());
  impl->own_loop = &loop;
  auto s = std::shared_ptr<LeaseScheduler>(new LeaseScheduler(impl));
  impl->owner = s;
  return s;
}

bool LeaseScheduler::Impl::on_loop() const {
  if (own_loop) return own_loop->get_executor().running_in_this_thread();
  auto self = owner.lock();
  return self && self->service().client().running_in_loop_thread();
}

std::shared_ptr<LeaseScheduler> LeaseScheduler::create(std::shared_ptr<LockService> service,
                                                       LeaseSchedulerOptions options) {
  if (!service) throw Error(errc::invalid_argument, "LeaseScheduler::create: no LockService");
  if (options.clock && options.clock != &service->clock())
    throw Error(errc::invalid_argument,
                "LeaseSchedulerOptions::clock differs from the LockService's: a lease counts from its lock's "
                "acquired_at(), read on the service's clock (give the clock to LockServiceOptions instead)");
  auto s = std::shared_ptr<LeaseScheduler>(new LeaseScheduler(std::move(service), options));
  s->impl_->owner = s;
  s->impl_->gate_ptr = s->service_->gate();
  std::weak_ptr<Impl> weak = s->impl_;
  asio::post(s->service_->client().get_executor(), [weak, gate = s->impl_->gate_ptr] {
    auto impl = weak.lock();
    if (!impl) return;
    static_cast<detail::StateGate*>(gate.get())->listen(impl, [weak](const std::string&, const std::string& reason) {
      if (auto i = weak.lock()) i->on_new_epoch(reason);
    });
  });
  return s;
}

Lease LeaseScheduler::adopt(Lock lock, const LeaseOptions& opts) {
  if (!lock.held()) throw Error(errc::invalid_argument, "adopt: the lock is not held");
  if (opts.jitter < 0 || opts.jitter >= 1) throw Error(errc::invalid_argument, "lease jitter must be in [0, 1)");
  // The lock's own metrics unless this scheduler reports to another registry.
  observe::LockClassMetrics& m = &impl_->registry == &service_->metrics_registry()
                                     ? lock.metrics()
                                     : impl_->registry.lock_class(lock.lock_class());
  auto s = std::make_shared<Lease::State>(shared_from_this(), std::move(lock), opts, impl_->clock, m);
  impl_->active.fetch_add(1);
  asio::post(service_->client().get_executor(), [impl = impl_, s] {
    impl->publish(s);  // a lock adopted after its safe time is lost at once
    impl->schedule(s);
  });
  return Lease(std::move(s));
}

Lease LeaseScheduler::adopt_all(MultiLock locks, const LeaseOptions& opts) {
  if (!locks.held()) throw Error(errc::invalid_argument, "adopt_all: the locks are not all held");
  if (opts.jitter < 0 || opts.jitter >= 1) throw Error(errc::invalid_argument, "lease jitter must be in [0, 1)");
  auto all = locks.take();
  Lock first = std::move(all.front());
  all.erase(all.begin());
  // The earliest grant starts the lease: the key granted first expires first.
  for (const auto& l : all)
    if (l.acquired_at() < first.acquired_at() || l.ttl() != first.ttl())
      throw Error(errc::invalid_argument, "adopt_all: the locks were not granted together (ttl or grant order)");
  observe::LockClassMetrics& m = &impl_->registry == &service_->metrics_registry()
                                     ? first.metrics()
                                     : impl_->registry.lock_class(first.lock_class());
  auto s = std::make_shared<Lease::State>(shared_from_this(), std::move(first), opts, impl_->clock, m, std::move(all));
  impl_->active.fetch_add(1);
  asio::post(service_->client().get_executor(), [impl = impl_, s] {
    impl->publish(s);
    impl->schedule(s);
  });
  return Lease(std::move(s));
}

std::optional<Lease> LeaseScheduler::acquire(std::string_view resource, const LockOptions& lock_opts,
                                             const LeaseOptions& lease_opts) {
  auto l = service_->acquire(resource, lock_opts);
  if (!l) return std::nullopt;
  return adopt(std::move(*l), lease_opts);
}

LeaseSchedulerStats LeaseScheduler::stats() const {
  LeaseSchedulerStats st;
  st.active = impl_->active.load();
  st.renewals_sent = impl_->renewals_sent.load();
  st.renewal_batches = impl_->batches.load();
  st.renewal_failures = impl_->failures.load();
  st.lost = impl_->lost.load();
  return st;
}

}  // namespace jobguard
