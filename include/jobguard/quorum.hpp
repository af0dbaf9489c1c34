// Quorum locks over N independent Redis primaries (the Redlock algorithm),
// for users who ask for it: a lock that survives the loss of a minority of
// servers without replication. The same owner token, the same fencing and
// lease contract as the single-server lock; what it guarantees and what it
// does not (clock drift, process pauses, restarts): docs/redlock.md.
//
// Acquire sends the grant to every instance at once, each with a deadline
// much shorter than the TTL, and grants only when a majority (N/2+1) said yes
// and the *validity time* ttl - elapsed - drift (drift = ttl *
// clock_drift_factor + 2 ms) is still positive. A failed attempt is undone on
// every instance, including those whose reply was lost: they may have run it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jobguard/error.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"

namespace jobguard {

struct QuorumOptions {
  // Lock time-to-live on each instance. Default 30 s; must be >= 10 ms and
  // no longer than any instance's max TTL (its `max_ttl` URL option).
  std::chrono::milliseconds ttl{30000};
  // How long acquire() keeps trying. Default 0 = one attempt.
  std::chrono::milliseconds wait{0};
  // Issue a fencing token with the grant (QuorumLock::fence). Costs a
  // second round to every instance (docs/redlock.md, "Fencing").
  bool fence = false;
  // Goes into the token's readable prefix.
  std::string job_id{};
  // The Redlock drift allowance: ttl * factor + 2 ms is taken off the
  // validity time. Default 0.01, as in the Redlock description and
  // node-redlock. Must be in [0, 1).
  double clock_drift_factor = 0.01;
  // Deadline of each call to each instance. Default 0 = min(ttl / 10, 250 ms):
  // an instance that is down or paused must not eat the validity time.
  std::chrono::milliseconds instance_timeout{0};
  // Between attempts: full jitter in [backoff_min, min(backoff_max, backoff_min * 2^n)].
  std::chrono::milliseconds backoff_min{20};
  std::chrono::milliseconds backoff_max{200};
  // Refuse votes from an instance that lost its lock state (restarted
  // without persistence, flushed) until every lease it could have granted
  // has expired: the Redlock "delayed restart", made automatic with the same
  // lock-state record the single-server quarantine keeps (docs/redlock.md).
  // Default on. Off only for instances known to keep their state (AOF with
  // appendfsync always).
  bool quarantine = true;
};

// The drift allowance for `ttl`: ttl * factor + 2 ms.
std::chrono::milliseconds quorum_drift(std::chrono::milliseconds ttl, double clock_drift_factor) noexcept;

class QuorumLockService;

// A lock held on a majority of instances. Destroying a held QuorumLock
// releases it on every instance without waiting for the replies. Movable,
// not copyable. Threads: one owner at a time; the blocking members throw
// errc::invalid_argument on an instance's or the service's event-loop thread.
class QuorumLock {
 public:
  QuorumLock(QuorumLock&&) noexcept;
  QuorumLock& operator=(QuorumLock&&) noexcept;
  ~QuorumLock();

  const std::string& resource() const noexcept { return resource_; }
  const std::string& key() const noexcept { return key_; }
  const std::string& token() const noexcept { return token_; }
  // The maximum of the fences the granting majority issued, raised on a
  // majority before the grant was reported, if QuorumOptions::fence.
  std::optional<std::int64_t> fence() const noexcept { return fence_; }
  std::chrono::milliseconds ttl() const noexcept { return ttl_; }
  // When the granting attempt was sent: every instance's TTL started later.
  std::chrono::steady_clock::time_point acquired_at() const noexcept { return acquired_at_; }
  // acquired_at (or the last extension's send time) + ttl - drift: until
  // then a majority certainly holds the key, clocks drifting by at most the
  // allowance. extend() moves it.
  std::chrono::steady_clock::time_point valid_until() const noexcept { return valid_until_; }
  // valid_until - now, zero when past.
  std::chrono::milliseconds validity_left() const noexcept;
  // How many instances granted (or last extended) it; >= quorum.
  std::size_t granted() const noexcept { return granted_; }
  bool held() const noexcept { return held_; }
  QuorumLockService* service() const noexcept { return service_.get(); }

  // Compare-and-delete on every instance; the number of instances where the
  // token still owned the key. An instance that failed counts as not
  // released (its TTL frees it). Never throws for Redis failures.
  std::size_t release();
  // Compare-and-pexpire on every instance to `ttl` (default: the acquire
  // ttl). True when a majority extended it and validity is left; then
  // valid_until moves. False otherwise (the lock may be lost: a majority
  // no longer has our token, or too few answered).
  bool extend(std::chrono::milliseconds ttl = std::chrono::milliseconds(0));

  // The non-blocking release: `done` runs on an instance's event loop or
  // the service's own, never inside the call, with the number of instances
  // that released and, when some instance failed (its TTL frees it there),
  // Error(redis_unavailable) naming each failure with the server's words;
  // the count stands either way. The QuorumLock must outlive the call only
  // until it returns.
  using ReleaseHandler = std::function<void(const Error& failed, std::size_t released)>;
  void async_release(ReleaseHandler done);

  // Forget the lock without releasing it (it expires by its TTL).
  void detach() noexcept { held_ = false; }

 private:
  friend class QuorumLockService;
  friend class LeaseScheduler;
  QuorumLock() = default;
  std::shared_ptr<QuorumLockService> service_;
  std::string resource_, key_, token_;
  std::optional<std::int64_t> fence_;
  std::chrono::milliseconds ttl_{0};
  std::chrono::milliseconds drift_{0};
  double drift_factor_ = 0.01;
  std::chrono::milliseconds instance_timeout_{0};
  std::chrono::steady_clock::time_point acquired_at_{}, valid_until_{};
  std::size_t granted_ = 0;
  bool held_ = false;
};

// The N instances and the keys. Create with QuorumLockService::create.
// Threads: every member is safe from any thread.
class QuorumLockService : public std::enable_shared_from_this<QuorumLockService> {
 public:
  // `instances`: one client per independent primary (not replicas of each
  // other, not a Redis Cluster: Error(invalid_argument)), not owned: they
  // must outlive the service and every lock and lease it grants. At least
  // one; an odd number (3, 5) is what the algorithm is for.
  static std::shared_ptr<QuorumLockService> create(std::vector<redis::Client*> instances,
                                                   KeyBuilder keys = KeyBuilder());
  ~QuorumLockService();

  std::size_t size() const noexcept { return clients_.size(); }
  // N/2 + 1.
  std::size_t quorum() const noexcept { return clients_.size() / 2 + 1; }
  const KeyBuilder& keys() const noexcept { return keys_; }
  redis::Client& instance(std::size_t i) const noexcept { return *clients_[i]; }
  // Instance i's host:port as it was at create(), for messages.
  const std::string& address(std::size_t i) const noexcept { return addresses_[i]; }

  // Acquires or gives up. nullopt when the lock stayed held by someone else
  // (a majority could not be had because instances refused) for the whole
  // wait. Throws Error when the last attempt failed otherwise:
  // errc::redis_unavailable when too few instances answered for a majority
  // (naming each failure), errc::timeout when a majority granted but the
  // validity time was gone (slow instances), errc::server_busy when too many
  // instances are quarantined; and on bad arguments. Blocking.
  std::optional<QuorumLock> acquire(std::string_view resource, const QuorumOptions& opts = {});
  // The asynchronous form; `done` runs on an instance's event loop or the
  // service's own.
  using AcquireHandler = std::function<void(const Error&, std::optional<QuorumLock>)>;
  void async_acquire(std::string resource, QuorumOptions opts, AcquireHandler done);

  struct Impl;

 private:
  QuorumLockService(std::vector<redis::Client*> instances, KeyBuilder keys);
  std::vector<redis::Client*> clients_;
  std::vector<std::string> addresses_;  // for messages written after a client may be gone
  KeyBuilder keys_;
  // The service's own event loop (one thread) for retries, its own lease
  // scheduler (QuorumLease::adopt) and loss callbacks: none of the instances' loops can be it, since an
  // instance's client may be destroyed while another's calls still complete.
  std::shared_ptr<void> loop_;
};

// A QuorumLock kept renewed on a majority: a Lease (<jobguard/lease.hpp>),
// with its whole contract (LeaseState, reason, stop_token, on_lost, ensure,
// release), renewed by the quorum service's own LeaseScheduler on the
// service's own event loop. To renew quorum and single-server leases from
// one scheduler, adopt the lock there instead (LeaseScheduler::adopt(QuorumLock),
// which documents the renewals and the ways it is lost); a QuorumLease is a
// Lease either way. on_lost runs on the scheduler's loop thread, where
// blocking quorum calls are refused. Destroying it releases the lock
// (blocking, except on an event-loop thread). The instances' clients must
// outlive the lease; a renewal still in flight when it is destroyed touches
// no client.
class QuorumLease : public Lease {
 public:
  // Takes over a held lock (Error(invalid_argument) if it is not held).
  static QuorumLease adopt(QuorumLock lock, const LeaseOptions& opts = {});

 private:
  explicit QuorumLease(Lease lease) : Lease(std::move(lease)) {}
};

}  // namespace jobguard
