// The lock waiter, sans-IO: one acquire's decisions (when to try, when to
// listen, when to sleep, when a fair grant may be used, when to give up) as a
// state machine with events in and actions out. The shell in waiter_shell.cpp does
// the I/O (the gate, the scripts, the subscriber, the timer) and feeds back
// what happened; tests/unit/lock/waiter_test.cpp drives it on a fake clock and
// reaches the fair-handoff races no real server can be made to produce on
// demand (docs/lock-safety.md, "Waiting" and "Direct handoff").
//
// Threads: one owner (the shell runs it on the client's event loop). No
// allocation on any path: a try-once acquire pays for two events.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace jobguard::detail {

class WaiterMachine {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using ms = std::chrono::milliseconds;

  struct Config {
    ms ttl{30000};
    ms wait{0};  // 0 = try once
    bool fair = false;
    ms backoff_min{5};
    ms backoff_max{200};
  };

  // What an attempt's reply said, as the shell classifies it.
  enum class Reply {
    granted,          // the lock is ours (SET OK, or acquire.lua {1, fence})
    busy,             // someone else holds it
    error,            // a Redis failure or a malformed reply: the acquire fails
    retry,            // acquire.lua saw an eviction (the shell invalidated the gate): ask again
    unchecked_grant,  // granted, but on a connection the gate did not check: the
                      // shell hands it back (Action::discard_grant) and asks again
  };
  // How the subscription the machine asked for (Action::subscribe) stands,
  // relative to the send time of the attempt that found the lock busy.
  enum class Heard {
    yes,         // confirmed before that attempt was sent: a later release is heard
    look_again,  // confirmed while it was in flight: a release in between went unheard
    on_ready,    // not confirmed yet: release_message() comes with the confirmation
  };
  enum class Result { granted, busy, failed, cancelled };

  struct Action {
    enum Kind : std::uint8_t {
      send_attempt,   // pass the gate, then send one attempt; report sent() / refused() / reply()
      arm_timer,      // call timer_fired() at `at` (replaces any armed timer)
      cancel_timer,   // the armed timer must not fire
      subscribe,      // listen (fair: the grant channel; plain: the release channel); report subscribed()
      unsubscribe,    // stop listening (only after subscribe)
      discard_grant,  // release the unchecked grant (a plain waiter also takes a fresh token)
      leave_queue,    // fair: leave the queue (leave_queue.lua); a 1 means the lock was ours: pass it on
      abandon,        // fair: a grant naming this token that arrives later is passed on by the service
      pass_on_grant,  // fair: a release handed the lock to us and we will not use it: release it
      complete,       // the acquire ends with `result`; nothing follows
    };
    // Plain data without initializers, so an Actions list costs nothing to
    // make: every acquire returns two of them.
    time_point at;            // arm_timer: when; complete(granted): the TTL's start
    std::int64_t fence_value; // complete(granted), when has_fence
    Kind kind;
    Result result;            // complete
    bool has_fence;
    std::optional<std::int64_t> fence() const noexcept {
      return has_fence ? std::optional<std::int64_t>(fence_value) : std::nullopt;
    }
  };

  // At most one event's worth; iterate with begin()/end(). Copies only the
  // actions it holds.
  class Actions {
   public:
    Actions() noexcept {}
    Actions(const Actions& o) noexcept : n_(o.n_) { std::copy_n(o.a_, o.n_, a_); }
    Actions& operator=(const Actions& o) noexcept {
      n_ = o.n_;
      std::copy_n(o.a_, o.n_, a_);
      return *this;
    }
    const Action* begin() const noexcept { return a_; }
    const Action* end() const noexcept { return a_ + n_; }
    std::size_t size() const noexcept { return n_; }
    bool empty() const noexcept { return n_ == 0; }
    const Action& operator[](std::size_t i) const noexcept { return a_[i]; }
    void push(const Action& a) noexcept { a_[n_++] = a; }

   private:
    Action a_[6];  // the longest list: cancel while sleeping
    std::size_t n_ = 0;
  };

  explicit WaiterMachine(Config c) noexcept : c_(c) {}
  // Feeds the backoff's jitter; before the first sleep (the shell draws it
  // once a wait is needed, so a try-once acquire draws nothing; tests fix it).
  void seed(std::uint64_t s) noexcept { rng_ = s; }

  Actions start(time_point now);
  // The attempt asked for went out now: its TTL cannot have started earlier.
  void sent(time_point now) noexcept;
  // The gate refused the attempt (quarantine, a failed check); `retry_in` > 0:
  // the quarantine ends in that long.
  Actions refused(time_point now, ms retry_in);
  Actions reply(time_point now, Reply r, std::optional<std::int64_t> fence = std::nullopt);
  Actions subscribed(time_point now, Heard h);
  Actions timer_fired(time_point now);
  // A release on the resource's channel, a confirmed subscription or a
  // subscriber reconnect (which may have hidden a release): look again.
  Actions release_message(time_point now);
  // A fair release handed the lock to this waiter (release.lua's PUBLISH).
  Actions grant_message(time_point now, std::optional<std::int64_t> fence);
  // The caller no longer wants the lock. Ends at once while sleeping; with an
  // attempt in flight it ends on its reply (a grant is then handed back).
  Actions cancel(time_point now);

  // A default-mode waiter is in the server's line (acquire.lua put it there):
  // the release that reaches it wakes it by name, so like a fair waiter it
  // polls only to notice a holder that expired without a release. Polling
  // faster would let it take the lock from the woken waiter ahead of it.
  void in_line() noexcept { in_line_ = true; }

  // Before start: a default-mode wait holds its first attempt until `t` (a
  // release of ours just woke another waiter; LockService::Impl::yield_until
  // says why). Ignored by a fair or try-once acquire, and when `t` is not
  // before the wait's deadline.
  void yield_until(time_point t) noexcept { yield_until_ = t; }

  bool done() const noexcept { return phase_ == Phase::done; }
  // An attempt found the lock busy (metrics: contended acquires).
  bool saw_busy() const noexcept { return saw_busy_; }
  // Between send_attempt and its answer (gate refusal or reply).
  bool attempt_in_flight() const noexcept { return phase_ == Phase::admitting || phase_ == Phase::awaiting_reply; }

 private:
  enum class Phase : std::uint8_t {
    idle,            // before start
    admitting,       // send_attempt issued, not sent yet (the gate may be checking the server)
    awaiting_reply,  // sent, reply pending
    subscribing,     // busy; waiting for subscribed()
    sleeping,        // timer armed; a message may cut it short
    done,
  };

  Actions attempt();
  Actions on_busy(time_point now);
  Actions sleep(time_point now);
  Actions give_up(Result r);
  Actions finish_granted(time_point ttl_from, std::optional<std::int64_t> fence);
  // Failed or cancelled: `a` may already hold actions.
  void finish_without(Actions& a, Result r);
  ms backoff();
  std::uint64_t next_random() noexcept;

  Config c_;
  std::uint64_t rng_ = 0;
  Phase phase_ = Phase::idle;
  time_point deadline_{}, sent_at_{}, last_busy_sent_{}, yield_until_{};
  int tries_ = 0;
  bool in_line_ = false;
  // A grant message arrived while the attempt in flight was on the wire: that
  // attempt ran either before the grant (busy: its send time is a safe start
  // of our TTL) or after it (granted). Either way we wait for its reply, so
  // none of our attempts can run after our own release.
  bool grant_in_flight_ = false;
  std::optional<std::int64_t> grant_fence_;
  // A release named us its grantee and we have not used or handed it back:
  // ending without the lock must pass it on.
  bool maybe_holder_ = false;
  bool wake_pending_ = false, subscribed_ = false, saw_busy_ = false, cancel_pending_ = false;
};

}  // namespace jobguard::detail
