// The lease state machine, sans-IO: time points in, decisions out. The
// scheduler drives it on the event loop; unit tests drive it with a fake clock
// and cross TTLs without sleeping.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include "jobguard/lease.hpp"

namespace jobguard::detail {

class LeaseTimeline {
 public:
  using Clock = std::chrono::steady_clock;
  using ms = std::chrono::milliseconds;

  struct Config {
    ms ttl;
    ms renew_every;   // resolved (never 0)
    ms drift;         // resolved
    ms hard_timeout;  // 0 = none
    ms retry_every;   // after a failed renewal
    ms coalesce;      // resolved LeaseOptions::coalesce
  };

  static Config resolve(ms ttl, const LeaseOptions& o) {
    Config c;
    c.ttl = ttl;
    c.renew_every = o.renew_every.count() > 0 ? o.renew_every : std::max(ms(1), ttl / 3);
    c.drift = o.drift.count() > 0 ? o.drift : ttl / 100 + ms(2);
    c.hard_timeout = o.hard_timeout;
    c.retry_every = std::clamp(c.renew_every / 4, ms(1), ms(500));
    // Wide enough that a few hundred leases renew in one wake-up and one
    // script call; at most 1/200 of a long period early, which no lease needs.
    c.coalesce = o.coalesce.count() > 0 ? o.coalesce : std::clamp(c.renew_every / 100, ms(10), ms(50));
    return c;
  }

  // `granted_sent_at`: when the acquire that granted the lock was sent.
  LeaseTimeline(Config c, Clock::time_point granted_sent_at)
      : c_(c),
        start_(granted_sent_at),
        safe_until_(granted_sent_at + c.ttl - c.drift),
        next_renewal_(granted_sent_at + c.renew_every) {}

  const Config& config() const noexcept { return c_; }
  LeaseState state() const noexcept { return state_; }
  const std::string& reason() const noexcept { return reason_; }
  Clock::time_point safe_until() const noexcept { return safe_until_; }
  bool renewal_in_flight() const noexcept { return in_flight_; }

  // Checks the clock. Returns true when a renewal should be sent now (the
  // caller sends it, then calls renewal_sent). `coalesce` lets a renewal due a
  // little later go with this batch.
  bool poll(Clock::time_point now, ms coalesce = ms(0)) {
    if (state_ != LeaseState::active) return false;
    if (c_.hard_timeout.count() > 0 && now >= start_ + c_.hard_timeout) {
      lose(LeaseState::timed_out, "hard job timeout passed");
      return false;
    }
    if (now >= safe_until_) {
      // Renewals failed, or we were not running (SIGSTOP, a pause) until the
      // TTL may have run out on the server: someone else may hold it now.
      lose(LeaseState::expired, "safe time ran out before a renewal succeeded");
      return false;
    }
    return !in_flight_ && now + coalesce >= next_renewal_;
  }

  void renewal_sent(Clock::time_point now) {
    in_flight_ = true;
    sent_at_ = now;
  }

  // The reply: `still_ours` false means the token was gone.
  void renewal_succeeded(Clock::time_point now, double jitter_factor = 1.0) {
    in_flight_ = false;
    if (state_ != LeaseState::active) return;
    safe_until_ = std::max(safe_until_, sent_at_ + c_.ttl - c_.drift);
    const auto period = std::chrono::duration_cast<ms>(c_.renew_every * jitter_factor);
    next_renewal_ = sent_at_ + std::max(ms(1), period);
    poll(now);  // a reply that arrives after the safe time (we were paused) does not save us
  }

  void renewal_token_gone() {
    in_flight_ = false;
    lose(LeaseState::token_gone, "the lock key is gone or held by another owner");
  }

  // The server was found to have lost lock state since the grant
  // (lock/quarantine.hpp): someone else may be granted the lock now.
  void state_lost(const std::string& why) { lose(LeaseState::token_gone, why); }

  void renewal_failed(Clock::time_point now, const std::string& why) {
    in_flight_ = false;
    last_error_ = why;
    next_renewal_ = now + c_.retry_every;
    poll(now);
    if (state_ == LeaseState::expired) reason_ += " (last renewal error: " + why + ")";
  }

  void released() {
    if (state_ == LeaseState::active) state_ = LeaseState::released;
  }

  // When the scheduler should look again.
  Clock::time_point next_wake() const noexcept {
    auto t = safe_until_;
    if (!in_flight_) t = std::min(t, next_renewal_);
    if (c_.hard_timeout.count() > 0) t = std::min(t, start_ + c_.hard_timeout);
    return t;
  }

 private:
  void lose(LeaseState s, std::string why) {
    if (state_ != LeaseState::active) return;
    state_ = s;
    reason_ = std::move(why);
  }

  Config c_;
  Clock::time_point start_, safe_until_, next_renewal_, sent_at_{};
  bool in_flight_ = false;
  LeaseState state_ = LeaseState::active;
  std::string reason_, last_error_;
};

}  // namespace jobguard::detail
