// Leases: a held lock that renews itself and says the moment it is lost.
//
// One LeaseScheduler renews every lease of a process from a deadline queue on
// the client's event loop (no thread per lock), at ttl/3 with jitter, sending
// the renewals that fall due together in one pipeline. A Lease is the one
// handle for every kind of lock it renews: a single-server Lock, a
// multi-lock's set, and a quorum lock over N primaries (<jobguard/quorum.hpp>),
// whose renewal goes to every instance and counts when a majority took it. A lease knows its *safe
// time left* on the monotonic clock, counted from when the last successful
// renewal was *sent* (the server's TTL restarted no earlier than that) minus a
// drift allowance. It is lost when a renewal finds the token gone, when
// renewals keep failing until the safe time runs out, when the process was
// stopped (SIGSTOP, a long pause) past that time, or at the hard job timeout.
// The job hears it at once through a std::stop_token and a callback.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "jobguard/lock.hpp"
#include "jobguard/multilock.hpp"

namespace jobguard {

struct LeaseOptions {
  // Renewal period. Default 0 = ttl/3.
  std::chrono::milliseconds renew_every{0};
  // Renewal times are spread by +/- this fraction of the period so leases
  // taken together do not renew in lockstep forever. Default 0.1.
  double jitter = 0.1;
  // Clock-drift allowance subtracted from the safe time. Default 0 = ttl/100 + 2 ms.
  std::chrono::milliseconds drift{0};
  // Hard job timeout measured from acquisition. Default 0 = none.
  std::chrono::milliseconds hard_timeout{0};
  // Renewals due within this window of each other are sent together, in one
  // wake-up and one script call (a renewal is sent up to this much early).
  // Default 0 = a hundredth of the renewal period, between 10 and 50 ms:
  // 50 ms for a 30 s TTL, 10 ms for 3 s or less. A wider window is fewer wake-ups and
  // fewer, larger batches: that, not the renewals, is most of a scheduler's CPU.
  std::chrono::milliseconds coalesce{0};
};

enum class LeaseState {
  active,
  released,      // released by its owner
  token_gone,    // a renewal found the key gone or owned by someone else
  expired,       // renewals failed (or the process was paused) until the safe time ran out
  timed_out,     // the hard job timeout passed
};
const char* to_string(LeaseState s) noexcept;

class LeaseScheduler;
namespace detail {
struct LeaseAccess;
}
class QuorumLock;
class QuorumLockService;
struct QuorumOptions;

// A handle to a renewing lock. Destroying it releases the lock, and *blocks*
// for that: the destructor calls release(), which waits for Redis's reply (up
// to the client's command timeout) unless it runs on the client's event-loop
// thread, where it sends the release without waiting. A lease already lost is
// not released (the key is someone else's or gone), except one stopped by its
// hard timeout: the key is still ours then, and the scheduler deletes it
// (compare-and-delete) the moment the timeout passes, so the resource is free
// for the next holder without waiting out the TTL. Call release() or
// async_release() yourself where a blocking scope exit would hurt.
// Threads: safe_time_left(), ensure(), lost(), state() and stop_token() may be
// called from any thread; the on_lost callback runs on the event loop.
class Lease {
 public:
  Lease(Lease&&) noexcept;
  Lease& operator=(Lease&&) noexcept;
  ~Lease();

  const std::string& key() const noexcept;
  const std::string& token() const noexcept;
  const std::string& resource() const noexcept;
  std::optional<std::int64_t> fence() const noexcept;
  // The service of the scheduler that renews it (its client runs the
  // renewals). Not for a lease of QuorumLease::adopt: it is renewed on the
  // quorum service's own loop, which has no LockService.
  LockService& service() const noexcept;
  // The single-server locks it renews: 1, or a multi-lock's set
  // (LeaseScheduler::adopt_all) in canonical order; key(), token(),
  // resource() and fence() are the first's. 0 for a quorum lease.
  std::size_t lock_count() const noexcept;
  // Throws std::out_of_range for i >= lock_count().
  const Lock& lock_at(std::size_t i) const;
  // The quorum lock it renews (LeaseScheduler::adopt(QuorumLock)); null for
  // a single-server lease.
  const QuorumLock* quorum_lock() const noexcept;

  // Time the lock is still certainly ours (zero when lost). Computed from the
  // monotonic clock on every call, so a caller resuming from a pause sees the
  // truth before the scheduler has run.
  std::chrono::milliseconds safe_time_left() const noexcept;
  // The monotonic instant until which the lock is certainly ours: the one
  // safe_time_left() counts down to. Every successful renewal moves it later.
  // Once the lease is lost or released it no longer means anything (and
  // safe_time_left() is zero).
  std::chrono::steady_clock::time_point deadline() const noexcept;
  // When the hard timeout (LeaseOptions::hard_timeout) stops the lease,
  // counted from acquisition; nullopt without one.
  std::optional<std::chrono::steady_clock::time_point> hard_deadline() const noexcept;
  // Throws Error(errc::lease_lost) unless at least `min_left` is left: call it
  // before each side effect ("ensure at least 2 s left").
  void ensure(std::chrono::milliseconds min_left) const;
  bool lost() const noexcept;
  LeaseState state() const noexcept;
  std::string reason() const;  // why it was lost, one line; empty while active
  std::uint64_t renewals() const noexcept;

  std::stop_token stop_token() const noexcept;
  // Runs once, on the event loop, when the lease is lost (not on release);
  // immediately (posted) if it is already lost.
  void on_lost(std::function<void(LeaseState, const std::string&)> fn);

  // Stops renewing and releases (compare-and-delete). True if it was still
  // ours (a quorum lease: on a majority). A Redis failure is false too (the
  // TTL frees the lock). On the event-loop thread (a quorum lease: any of its
  // instances' or the scheduler's) it sends the release without waiting and
  // returns true.
  bool release();
  // The non-blocking form, safe from any thread: `done` runs on the event
  // loop, never inside the call, with (no error, true) when the lock was
  // still ours, (no error, false) when the lease was lost or released
  // already, and the Error (naming the server and the key) on a Redis failure.
  void async_release(std::function<void(const Error&, bool)> done);

  // Runs `fn` once on the event loop when the lease ends: lost (the state it
  // was lost in) or released (LeaseState::released), so nobody waits forever
  // on a lease that ended either way; posted at once if it has ended already.
  // Several may wait. The returned canceller, callable from any thread,
  // removes `fn` and returns true if it had not run (and never will).
  // For jobguard::async_wait_lost (<jobguard/async.hpp>), which awaits it.
  std::function<bool()> when_ended(std::function<void(LeaseState)> fn);

  struct State;

 protected:
  explicit Lease(std::shared_ptr<State> s) : s_(std::move(s)) {}

 private:
  friend class LeaseScheduler;
  friend struct detail::LeaseAccess;
  bool stop_for_release();
  bool release_quorum();
  std::vector<Lock*> all_locks() const;
  std::shared_ptr<State> s_;
};

struct LeaseSchedulerStats {
  std::uint64_t active = 0;
  std::uint64_t renewals_sent = 0;
  std::uint64_t renewal_batches = 0;  // script calls that carried renewals (up to 256 each)
  std::uint64_t renewal_failures = 0;
  std::uint64_t lost = 0;
};

// What a LeaseScheduler reads time from and reports to. Every member has a default.
struct LeaseSchedulerOptions {
  // Safe times, renewals and hard timeouts are counted on this clock.
  // Default null = the service's (LockServiceOptions::clock). A lease starts
  // from its lock's acquired_at(), read on the service's clock, so any other
  // clock is refused (Error(invalid_argument)): the two would not agree.
  const MonotonicClock* clock = nullptr;
  // Where lease metrics (renewals, losses, hold time) go, per lock class.
  // Default null = the service's registry (LockServiceOptions::metrics). Not
  // owned: it must outlive the service's client, whose event loop counts
  // into it (a renewal's reply in flight keeps the scheduler alive there
  // after the caller's last reference is gone). A lost lease's counts are
  // in before lost() returns true.
  observe::Registry* metrics = nullptr;
};

// Threads: every member is safe from any thread; renewals and loss callbacks
// run on the client's event loop. Create with LeaseScheduler::create; each
// Lease keeps its scheduler alive.
class LeaseScheduler : public std::enable_shared_from_this<LeaseScheduler> {
 public:
  static std::shared_ptr<LeaseScheduler> create(std::shared_ptr<LockService> service,
                                                LeaseSchedulerOptions options = {});
  ~LeaseScheduler();

  // Takes over a held lock and keeps it renewed.
  Lease adopt(Lock lock, const LeaseOptions& opts = {});
  // Takes over a multi-lock's set as one lease: every key renewed together,
  // the safe time counted from the first grant and moved only when every key
  // was renewed; the lease is lost (one on_lost, one stop_token) when any key
  // is. Releasing it releases them all. Throws Error(invalid_argument) for a
  // set not all held or not granted together (acquire_all).
  Lease adopt_all(MultiLock locks, const LeaseOptions& opts = {});
  // Takes over a held quorum lock (<jobguard/quorum.hpp>) and keeps it
  // renewed from the same deadline queue as this scheduler's single-server
  // leases: each renewal goes to every instance (compare-and-pexpire, each
  // with the lock's per-instance deadline) and counts when a majority took
  // it; the safe time is the last such renewal's send time + ttl - drift
  // (the lock's drift unless LeaseOptions::drift). Lost as token_gone when
  // more than N - quorum instances say the token is not ours, as expired
  // when renewals keep failing until the safe time runs out, as timed_out
  // at the hard timeout (then it is deleted on every instance at once). A
  // failed renewal is retried every quarter period. Its metrics go to lock
  // class "quorum". Error(invalid_argument) for a lock not held, negative
  // options, or a scheduler whose clock is not MonotonicClock::steady() (the
  // quorum lock's times are read on it).
  Lease adopt(QuorumLock lock, const LeaseOptions& opts = {});
  // Acquire + adopt. nullopt when busy for the whole wait.
  std::optional<Lease> acquire(std::string_view resource, const LockOptions& lock_opts,
                               const LeaseOptions& lease_opts = {});
  // The same for a quorum lock: QuorumLockService::acquire + adopt. Throws
  // as QuorumLockService::acquire.
  std::optional<Lease> acquire(QuorumLockService& quorum, std::string_view resource, const QuorumOptions& lock_opts,
                               const LeaseOptions& lease_opts = {});

  LeaseSchedulerStats stats() const;
  LockService& service() noexcept { return *service_; }

  struct Impl;

 private:
  friend class Lease;
  friend struct detail::LeaseAccess;
  LeaseScheduler(std::shared_ptr<LockService> service, const LeaseSchedulerOptions& options);
  // A scheduler of quorum leases only, on a QuorumLockService's own loop.
  explicit LeaseScheduler(std::shared_ptr<Impl> impl);
  std::shared_ptr<LockService> service_;
  std::shared_ptr<Impl> impl_;
};

}  // namespace jobguard
