// The Lease a caller holds: its safe time, its end, its release
// (lease_internal.hpp; the renewals are lease_scheduler.cpp's).
#include "jobguard/lease.hpp"

#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <boost/asio/system_executor.hpp>
#include <stdexcept>

#include "jobguard/error.hpp"
#include "lock/lease_internal.hpp"

namespace jobguard {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;

const char* to_string(LeaseState s) noexcept {
  switch (s) {
    case LeaseState::active: return "active";
    case LeaseState::released: return "released";
    case LeaseState::token_gone: return "token_gone";
    case LeaseState::expired: return "expired";
    case LeaseState::timed_out: return "timed_out";
  }
  return "?";
}

namespace detail {
struct LeaseAccess {
  static asio::any_io_executor executor(const Lease& l) { return l.s_->sched->impl_->timer.get_executor(); }
};
asio::any_io_executor lease_executor(const Lease& lease) { return LeaseAccess::executor(lease); }
}  // namespace detail

// --- Lease --------------------------------------------------------------------

Lease::Lease(Lease&&) noexcept = default;
Lease& Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    if (s_) release();
    s_ = std::move(o.s_);
  }
  return *this;
}
Lease::~Lease() {
  if (s_) release();
}

const std::string& Lease::key() const noexcept { return s_->key(); }
const std::string& Lease::token() const noexcept { return s_->token(); }
const std::string& Lease::resource() const noexcept { return s_->resource(); }
std::optional<std::int64_t> Lease::fence() const noexcept {
  return s_->quorum ? s_->quorum->lock.fence() : s_->lock.fence();
}
LockService& Lease::service() const noexcept { return s_->sched->service(); }

std::chrono::milliseconds Lease::safe_time_left() const noexcept {
  if (s_->state.load() != LeaseState::active) return ms(0);
  const auto until = Clock::time_point(Clock::duration(s_->safe_until_ns.load()));
  const auto now = s_->clock.now();
  if (now >= until) return ms(0);
  return std::chrono::duration_cast<ms>(until - now);
}

Clock::time_point Lease::deadline() const noexcept {
  return Clock::time_point(Clock::duration(s_->safe_until_ns.load()));
}

std::optional<Clock::time_point> Lease::hard_deadline() const noexcept {
  if (s_->opts.hard_timeout.count() <= 0) return std::nullopt;
  return s_->acquired_at() + s_->opts.hard_timeout;
}

void Lease::ensure(std::chrono::milliseconds min_left) const {
  const auto left = safe_time_left();
  if (left <= ms(0) || left < min_left) {
    const auto st = s_->state.load();
    throw Error(errc::lease_lost,
                st != LeaseState::active ? reason()
                                         : fmt::format("{}lease on {} has {} ms of safe time left, {} ms required",
                                                       s_->quorum ? "quorum " : "", key(), left.count(),
                                                       min_left.count()));
  }
}

// The stop, not the state: publish() stores the state first and requests the
// stop last, so a caller that sees lost() also sees stop_token() stopped, and
// one woken by the stop finds lost(), state() and reason() set. (Only a loss
// requests the stop; a release does not.)
bool Lease::lost() const noexcept { return s_->stop.stop_requested(); }
LeaseState Lease::state() const noexcept { return s_->state.load(); }
std::string Lease::reason() const {
  std::lock_guard<std::mutex> g(s_->mu);
  return s_->reason;
}
std::uint64_t Lease::renewals() const noexcept { return s_->renewals.load(); }
std::stop_token Lease::stop_token() const noexcept { return s_->stop.get_token(); }

void Lease::on_lost(std::function<void(LeaseState, const std::string&)> fn) {
  std::unique_lock<std::mutex> g(s_->mu);
  const auto st = s_->state.load();
  if (st != LeaseState::active && st != LeaseState::released) {
    const std::string why = s_->reason;
    g.unlock();
    asio::post(s_->sched->impl_->timer.get_executor(), [fn = std::move(fn), st, why] { fn(st, why); });
    return;
  }
  s_->on_lost = std::move(fn);
}

std::function<bool()> Lease::when_ended(std::function<void(LeaseState)> fn) {
  std::unique_lock<std::mutex> g(s_->mu);
  if (s_->ended_with) {
    const LeaseState how = *s_->ended_with;
    g.unlock();
    asio::post(s_->sched->impl_->timer.get_executor(), [fn = std::move(fn), how] { fn(how); });
    return [] { return false; };
  }
  const std::uint64_t id = s_->next_waiter++;
  s_->end_waiters.emplace(id, std::move(fn));
  return [s = s_, id] {
    std::lock_guard<std::mutex> lk(s->mu);
    return s->end_waiters.erase(id) > 0;
  };
}

// Stops renewing. True if the lease was still active (its lock is ours to
// release); false if it was lost (never delete the key then: it is someone
// else's or gone) or released already.
bool Lease::stop_for_release() {
  if (!s_ || s_->release_called.exchange(true)) return false;
  auto& s = s_;
  LeaseState expected = LeaseState::active;
  const bool was_active = s->state.compare_exchange_strong(expected, LeaseState::released);
  auto impl = s->sched->impl_;
  if (was_active) impl->active.fetch_sub(1);
  asio::post(impl->timer.get_executor(), [impl, s, was_active] {
    s->tl.released();
    impl->unschedule(s);
    if (was_active) LeaseScheduler::Impl::end(*s, LeaseState::released);
  });
  if (!was_active) {
    s->lock.detach();
    for (auto& l : s->more) l.detach();
    if (s->quorum) s->quorum->lock.detach();
  }
  return was_active;
}

bool Lease::release() {
  // The handle stays usable (key(), reason()...) after release.
  if (!stop_for_release()) return false;
  if (s_->quorum) return release_quorum();
  if (s_->sched->service().client().running_in_loop_thread()) {
    // Cannot block here: send the release now without waiting for the reply
    // (left to the Lock's destructor, it would wait for the last handle).
    for (auto* l : all_locks()) l->async_release(nullptr);
    return true;
  }
  if (!s_->more.empty()) {
    bool all = true;
    for (auto* l : all_locks()) {
      try {
        all = l->release() && all;
      } catch (const Error&) {
        all = false;  // unreachable Redis: the TTL frees the lock
      }
    }
    return all;
  }
  try {
    return s_->lock.release();
  } catch (const Error&) {
    return false;  // unreachable Redis: the TTL frees the lock
  }
}

std::vector<Lock*> Lease::all_locks() const {
  std::vector<Lock*> out{&s_->lock};
  for (auto& l : s_->more) out.push_back(&l);
  return out;
}

std::size_t Lease::lock_count() const noexcept { return s_->quorum ? 0 : 1 + s_->more.size(); }
const Lock& Lease::lock_at(std::size_t i) const {
  if (i >= lock_count()) throw std::out_of_range("Lease::lock_at: no such lock");
  return i == 0 ? s_->lock : s_->more[i - 1];
}
const QuorumLock* Lease::quorum_lock() const noexcept { return s_->quorum ? &s_->quorum->lock : nullptr; }

void Lease::async_release(std::function<void(const Error&, bool)> done) {
  if (!stop_for_release()) {
    auto ex = s_ ? s_->sched->impl_->timer.get_executor() : asio::any_io_executor(asio::system_executor());
    asio::post(ex, [done = std::move(done)] {
      if (done) done(Error(), false);
    });
    return;
  }
  if (s_->quorum) {
    const std::size_t quorum = s_->quorum->lock.service()->quorum();
    // Released on a majority is released, whatever a minority answered.
    return s_->quorum->lock.async_release([done = std::move(done), quorum](const Error& e, std::size_t n) {
      if (done) done(n >= quorum ? Error() : e, n >= quorum);
    });
  }
  if (s_->more.empty()) return s_->lock.async_release(std::move(done));
  struct Join {
    std::size_t left;
    Error first;
    bool all = true;
    std::function<void(const Error&, bool)> done;
  };
  auto locks = all_locks();
  auto j = std::make_shared<Join>(Join{locks.size(), Error(), true, std::move(done)});
  for (auto* l : locks)
    l->async_release([j](const Error& e, bool ours) {
      if (e && !j->first) j->first = e;
      j->all = j->all && ours && !e;
      if (--j->left == 0 && j->done) j->done(j->first, j->all);
    });
}

}  // namespace jobguard
