#include "lock/waiter.hpp"

#include <algorithm>

namespace jobguard::detail {

using Action = WaiterMachine::Action;
using Actions = WaiterMachine::Actions;

namespace {
Action act(Action::Kind k) { return Action{{}, 0, k, WaiterMachine::Result::busy, false}; }
}  // namespace

// splitmix64: a waiter draws a handful of numbers; a std::mt19937_64 per
// waiter (2.5 KB of state) would cost more than the acquire.
std::uint64_t WaiterMachine::next_random() noexcept {
  std::uint64_t z = (rng_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

WaiterMachine::ms WaiterMachine::backoff() {
  long long lo = 0, hi = 0;
  if (c_.fair || in_line_) {
    // A queued fair waiter is handed the lock by the release that reaches it;
    // its attempts only refresh its place (the waiter lease is at least five
    // backoff maxima) and notice a holder that expired without a release.
    // Polling faster would only load the host the handoffs run on.
    hi = std::max<long long>(1, c_.backoff_max.count());
    lo = hi / 2;
  } else {
    // Full jitter: waiters spread out instead of stampeding in lockstep.
    hi = std::min<long long>(c_.backoff_max.count(),
                             std::max<long long>(1, c_.backoff_min.count()) << std::min(tries_, 16));
    ++tries_;
  }
  if (hi <= lo) return ms(lo);
  return ms(lo + static_cast<long long>(next_random() % static_cast<std::uint64_t>(hi - lo + 1)));
}

Actions WaiterMachine::start(time_point now) {
  if (phase_ != Phase::idle) return {};
  deadline_ = now + c_.wait;
  if (!c_.fair && c_.wait.count() > 0 && yield_until_ > now && yield_until_ < deadline_) {
    // Not subscribed yet, so nothing but this timer (or a cancel) ends the
    // yield: the first attempt is then made as if the wait began now.
    phase_ = Phase::sleeping;
    Actions a;
    Action t = act(Action::arm_timer);
    t.at = yield_until_;
    a.push(t);
    return a;
  }
  return attempt();
}

Actions WaiterMachine::attempt() {
  phase_ = Phase::admitting;
  wake_pending_ = false;
  Actions a;
  a.push(act(Action::send_attempt));
  return a;
}

void WaiterMachine::sent(time_point now) noexcept {
  if (phase_ != Phase::admitting) return;
  phase_ = Phase::awaiting_reply;
  sent_at_ = now;
  // A grant that came before this send is seen by the attempt itself
  // (acquire.lua: "the lock holds my token"); only one arriving from now on is
  // one the attempt may have missed.
  grant_in_flight_ = false;
  grant_fence_.reset();
}

Actions WaiterMachine::refused(time_point now, ms retry_in) {
  if (phase_ != Phase::admitting) return {};
  Actions a;
  if (cancel_pending_) {
    finish_without(a, Result::cancelled);
    return a;
  }
  // A quarantine that ends within our wait is waited out, like a busy lock.
  if (retry_in.count() > 0 && now + retry_in < deadline_) {
    phase_ = Phase::sleeping;
    Action t = act(Action::arm_timer);
    t.at = now + retry_in;
    a.push(t);
    return a;
  }
  finish_without(a, Result::failed);
  return a;
}

Actions WaiterMachine::reply(time_point now, Reply r, std::optional<std::int64_t> fence) {
  if (phase_ != Phase::awaiting_reply) return {};
  Actions a;
  switch (r) {
    case Reply::error:
      finish_without(a, Result::failed);
      return a;
    case Reply::retry:
      // The script did nothing: a grant that arrived meanwhile still stands,
      // and the next attempt finds it.
      if (cancel_pending_) {
        finish_without(a, Result::cancelled);
        return a;
      }
      return attempt();
    case Reply::unchecked_grant: {
      // Handed back: whatever a grant message gave us went with it.
      a.push(act(Action::discard_grant));
      grant_in_flight_ = false;
      maybe_holder_ = false;
      if (cancel_pending_) {
        finish_without(a, Result::cancelled);
        return a;
      }
      a.push(act(Action::send_attempt));
      phase_ = Phase::admitting;
      wake_pending_ = false;
      return a;
    }
    case Reply::granted:
      if (cancel_pending_) {
        maybe_holder_ = true;
        finish_without(a, Result::cancelled);
        return a;
      }
      return finish_granted(sent_at_, fence);
    case Reply::busy:
      if (grant_in_flight_) {
        // The attempt ran before the grant, so its send time is a safe start
        // of the TTL the grant set.
        if (cancel_pending_) {
          finish_without(a, Result::cancelled);
          return a;
        }
        return finish_granted(sent_at_, grant_fence_);
      }
      // Sent after any grant we heard of and still busy: that grant is gone
      // (expired, force-released), so there is nothing of ours to pass on.
      maybe_holder_ = false;
      return on_busy(now);
  }
  return a;
}

Actions WaiterMachine::on_busy(time_point now) {
  saw_busy_ = true;
  last_busy_sent_ = sent_at_;
  if (cancel_pending_) return give_up(Result::cancelled);
  if (now >= deadline_) return give_up(Result::busy);
  if (!subscribed_) {
    // Listen only now: a try-once acquire, the common case, never needs to.
    subscribed_ = true;
    phase_ = Phase::subscribing;
    Actions a;
    a.push(act(Action::subscribe));
    return a;
  }
  if (wake_pending_) return attempt();
  return sleep(now);
}

Actions WaiterMachine::subscribed(time_point now, Heard h) {
  if (phase_ != Phase::subscribing) return {};
  // Look again unless the channel was already listening when the busy
  // attempt was sent: a release in between would otherwise go unheard.
  if (h == Heard::look_again || wake_pending_) return attempt();
  return sleep(now);
}

Actions WaiterMachine::sleep(time_point now) {
  phase_ = Phase::sleeping;
  ms d = backoff();
  const auto left = std::chrono::duration_cast<ms>(deadline_ - now);
  if (d > left) d = left;
  Actions a;
  Action t = act(Action::arm_timer);
  t.at = now + d;
  a.push(t);
  return a;
}

Actions WaiterMachine::timer_fired(time_point) {
  if (phase_ != Phase::sleeping) return {};
  return attempt();
}

Actions WaiterMachine::release_message(time_point) {
  switch (phase_) {
    case Phase::admitting:
    case Phase::awaiting_reply:
    case Phase::subscribing:
      // The attempt on its way may have run before the release.
      wake_pending_ = true;
      return {};
    case Phase::sleeping: {
      Actions a;
      a.push(act(Action::cancel_timer));
      a.push(act(Action::send_attempt));
      phase_ = Phase::admitting;
      wake_pending_ = false;
      return a;
    }
    case Phase::idle:
    case Phase::done: return {};
  }
  return {};
}

Actions WaiterMachine::grant_message(time_point now, std::optional<std::int64_t> fence) {
  if (phase_ == Phase::idle || phase_ == Phase::done) return {};
  maybe_holder_ = true;
  if (phase_ == Phase::admitting) return {};  // the attempt, once sent, finds the lock ours
  if (phase_ == Phase::awaiting_reply) {
    grant_in_flight_ = true;
    grant_fence_ = fence;
    return {};
  }
  // Sleeping (or between a busy reply and its subscription): the grant ran
  // after our last busy attempt, so that attempt's send time is a safe start
  // of our TTL. When it is too far back to leave a useful TTL, one attempt
  // restarts the TTL (acquire.lua) and counts from its own send.
  Actions a;
  if (phase_ == Phase::sleeping) a.push(act(Action::cancel_timer));
  if (now - last_busy_sent_ > c_.ttl / 4) {
    a.push(act(Action::send_attempt));
    phase_ = Phase::admitting;
    wake_pending_ = false;
    return a;
  }
  Actions g = finish_granted(last_busy_sent_, fence);
  for (const auto& x : g) a.push(x);
  return a;
}

Actions WaiterMachine::cancel(time_point) {
  Actions a;
  switch (phase_) {
    case Phase::done: return a;
    case Phase::idle:
      phase_ = Phase::done;
      {
        Action c = act(Action::complete);
        c.result = Result::cancelled;
        a.push(c);
      }
      return a;
    case Phase::admitting:
    case Phase::awaiting_reply:
      // The attempt may be granted on the server: wait for its reply so a
      // grant is handed back instead of blocking the lock for its TTL.
      cancel_pending_ = true;
      return a;
    case Phase::subscribing:
    case Phase::sleeping: {
      const bool timer = phase_ == Phase::sleeping;
      Actions g = give_up(Result::cancelled);
      if (timer) a.push(act(Action::cancel_timer));
      for (const auto& x : g) a.push(x);
      return a;
    }
  }
  return a;
}

Actions WaiterMachine::give_up(Result r) {
  Actions a;
  // Best effort; a waiter that cannot leave expires from the queue anyway.
  if (c_.fair && c_.wait.count() > 0) a.push(act(Action::leave_queue));
  finish_without(a, r);
  return a;
}

Actions WaiterMachine::finish_granted(time_point ttl_from, std::optional<std::int64_t> fence) {
  Actions a;
  if (subscribed_) a.push(act(Action::unsubscribe));
  Action c = act(Action::complete);
  c.result = Result::granted;
  c.at = ttl_from;
  c.has_fence = fence.has_value();
  c.fence_value = fence.value_or(0);
  a.push(c);
  phase_ = Phase::done;
  return a;
}

void WaiterMachine::finish_without(Actions& a, Result r) {
  if (subscribed_) a.push(act(Action::unsubscribe));
  if (c_.fair && c_.wait.count() > 0) {
    // Our place may still be queued (an error, or a give-up whose leave does
    // not arrive): a release that hands it the lock must find it abandoned.
    a.push(act(Action::abandon));
  }
  // A grant that came while our failed attempt was in flight made us the
  // holder already: pass the lock on (best effort; else its TTL frees it).
  if (maybe_holder_) a.push(act(Action::pass_on_grant));
  Action c = act(Action::complete);
  c.result = r;
  a.push(c);
  phase_ = Phase::done;
}

}  // namespace jobguard::detail
