// Redis locks done right: an owner token only its holder knows, atomic
// compare-and-delete / compare-and-pexpire, optional fencing tokens issued in
// the same script as the grant, waiting woken by pub/sub with full-jitter
// backoff as the fallback, and an optional fair (FIFO) mode.
//
// What a lock protects against and what it does not: docs/lock-safety.md.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "jobguard/redis/client.hpp"

namespace jobguard {
namespace redis {
class Subscriber;
}
namespace observe {
struct LockClassMetrics;
}

// Builds the Redis keys of a lock from the business object it guards
// ("invoice:48291", "tenant:alpha:sync"). Every key of one resource carries
// the resource in a hash tag, so the lock, its fence counter and its wait
// queue live in one Redis Cluster slot and one script can touch them all:
//   <prefix>:lock:{invoice:48291}    the lock (value = owner token)
//   <prefix>:fence:{invoice:48291}   the fencing high-water mark
//   <prefix>:queue:{invoice:48291}   fair-mode waiters (list) + :qexp (zset)
//   <prefix>:released:{invoice:48291} the pub/sub channel for releases
//   <prefix>:grant:<random>          a LockService's channel for fair handoffs
class KeyBuilder {
 public:
  // Throws Error(invalid_argument) on an empty prefix or one containing
  // braces, spaces or control characters.
  explicit KeyBuilder(std::string prefix = "jobguard");
  // Throws Error(invalid_argument) naming the problem for a resource that is
  // empty, longer than 512 bytes, or contains '{', '}', whitespace or control
  // characters (which would break the hash tag or logs).
  std::string lock_key(std::string_view resource) const;
  std::string fence_key(std::string_view resource) const;
  std::string queue_key(std::string_view resource) const;
  std::string queue_expiry_key(std::string_view resource) const;
  std::string channel(std::string_view resource) const;
  // "invoice:48291" from "jobguard:lock:{invoice:48291}"; nullopt if not ours.
  std::optional<std::string> resource_of(std::string_view lock_key) const;
  const std::string& prefix() const noexcept { return prefix_; }
  static void validate_resource(std::string_view resource);

 private:
  std::string key(std::string_view kind, std::string_view resource) const;
  std::string prefix_;
};

// "<host>/<pid>/<job>#<32 hex chars from the OS random source>". The prefix
// tells an operator who holds a lock; the 128 random bits make it unguessable
// and unique. Throws Error(invalid_argument) if job contains '#' or whitespace.
std::string make_token(std::string_view job_id = {});
// The readable part of a token ("web-3/4121/invoice-run"), or the whole value
// for tokens written by other clients (node-redlock, Laravel...).
std::string token_owner(std::string_view token);

// The compare-and-delete(-and-publish) script every jobguard lock is released
// with (KEYS[1] lock key; ARGV[1] token, ARGV[2] release channel), for tools
// that talk to Redis directly, like the raw half of `jobguard bench`. A fair
// lock's release also passes KEYS[2..4] queue, queue expiries, fence counter
// and ARGV[3] the resource, and hands the lock to the queue's live head.
const redis::Script& lock_release_script();

struct LockOptions {
  // Lock time-to-live; a crashed holder's lock frees itself after this.
  // Default 30 s; must be >= 10 ms.
  std::chrono::milliseconds ttl{30000};
  // How long acquire() waits for a busy lock. Default 0 = try once.
  std::chrono::milliseconds wait{0};
  // Issue a fencing token with the grant (see fence()). Default off: the
  // plain form is `SET key token NX PX ttl`, compatible with other clients.
  bool fence = false;
  // FIFO handoff: a releaser (or a newcomer) cannot barge ahead of a waiter;
  // the release hands the lock straight to the head of the queue.
  // Default off. Every client contending on a fair lock must use fair mode.
  bool fair = false;
  // Goes into the token's readable prefix and into logs.
  std::string job_id;
  // Metrics and logs are per lock class, never per key.
  std::string lock_class = "default";
  // Fallback backoff while waiting: full jitter in [0, min(max, min*2^n)];
  // a queued fair waiter, which is told of its grant, refreshes its place
  // every [max/2, max] instead.
  std::chrono::milliseconds backoff_min{5};
  std::chrono::milliseconds backoff_max{200};
};

class LockService;

// What Redis says about one resource's lock right now (LockService::inspect).
// A snapshot taken by one script, so its fields agree with each other; it is
// stale the moment it returns.
struct LockInfo {
  std::string resource;
  std::string key;
  // Held: the lock key exists. The fields below describe its holder.
  bool held = false;
  // The holder's readable owner, token_owner(): "web-3/4121/invoice-run"
  // (host/pid/job) for jobguard tokens, the whole value for other clients'.
  std::string holder;
  // Time left before the key expires (-1 ms: the key has no TTL, which no
  // jobguard client ever writes).
  std::chrono::milliseconds ttl_left{0};
  // The fencing high-water mark of the resource (the last fence issued, by a
  // grant or a force release); nullopt when none was ever issued. It is the
  // current holder's fence only if that holder asked for one.
  std::optional<std::int64_t> fence;
  // Time since `fence` was issued, derived from it: fences are never below
  // the server clock in microseconds (acquire.lua), so a fence that reads as
  // a past server time is its grant time. nullopt when the fence does not
  // read as a time (a counter ahead of the clock) or there is none. It is
  // the holder's age only when the holder is fenced (docs/operations.md).
  std::optional<std::chrono::milliseconds> fence_age;
  // Fair-mode waiters queued for the resource (LLEN of its queue). Plain
  // waiters leave no trace in Redis and are not counted.
  std::int64_t waiters = 0;
  // The server's clock at the snapshot (unix ms), for display.
  std::int64_t server_time_ms = 0;
};

// A held lock. Destroying a Lock that is still held releases it (without
// waiting for the reply): scope exit is release. Movable, not copyable.
// Threads: one owner at a time; release()/extend() block and must not be
// called on the client's event-loop thread.
class Lock {
 public:
  Lock(Lock&&) noexcept;
  Lock& operator=(Lock&&) noexcept;
  ~Lock();

  const std::string& resource() const noexcept { return resource_; }
  const std::string& key() const noexcept { return key_; }
  const std::string& token() const noexcept { return token_; }
  // The fencing token issued with this grant, if LockOptions::fence.
  std::optional<std::int64_t> fence() const noexcept { return fence_; }
  std::chrono::milliseconds ttl() const noexcept { return ttl_; }
  std::chrono::steady_clock::time_point acquired_at() const noexcept { return acquired_at_; }
  bool held() const noexcept { return held_; }

  // Per-class metrics this lock reports to (never null for a granted lock).
  observe::LockClassMetrics& metrics() const noexcept { return *metrics_; }

  // Compare-and-delete. True if the lock was still ours; false if it had
  // expired or been taken by someone else (nothing is deleted then).
  bool release();
  // Compare-and-pexpire to `ttl` (default: the acquire ttl). False if no longer ours.
  bool extend(std::chrono::milliseconds ttl = std::chrono::milliseconds(0));
  // Forget the lock without releasing it (it expires by its TTL). For a
  // process that forks and hands the lock to a child, or for tests.
  void detach() noexcept { held_ = false; }

 private:
  friend class LockService;
  Lock() = default;
  std::shared_ptr<LockService> service_;
  std::string resource_, key_, token_, lock_class_;
  std::optional<std::int64_t> fence_;
  observe::LockClassMetrics* metrics_ = nullptr;  // owned by the global registry
  bool fair_ = false;
  std::chrono::milliseconds ttl_{0};
  std::chrono::steady_clock::time_point acquired_at_{};
  bool held_ = false;
};

// Owns the scripts, the release subscriber and the waiters for one Client.
// Create with LockService::create (it is shared by the locks it grants).
// Threads: every member is safe from any thread; async completions run on the
// client's event loop.
class LockService : public std::enable_shared_from_this<LockService> {
 public:
  static std::shared_ptr<LockService> create(redis::Client& client, KeyBuilder keys = KeyBuilder());
  ~LockService();

  const KeyBuilder& keys() const noexcept { return keys_; }
  redis::Client& client() noexcept { return client_; }

  // Acquires or gives up: returns nullopt when the lock stayed busy for the
  // whole wait. Throws Error on Redis failures (errc::timeout, not_connected...)
  // and on bad arguments.
  std::optional<Lock> acquire(std::string_view resource, const LockOptions& opts = {});

  // The asynchronous form; `done` runs on the event loop with ec set on a
  // Redis failure, or ec clear and nullopt when busy.
  using AcquireHandler = std::function<void(std::error_code, std::optional<Lock>)>;
  void async_acquire(std::string resource, LockOptions opts, AcquireHandler done);

  // Raw compare-and-delete / compare-and-pexpire by key and token; `done`
  // gets true when the token still owned the key.
  // `fair`: the lock was taken in fair mode (its release hands it to the queue head).
  void async_release(const std::string& resource, const std::string& token,
                     std::function<void(std::error_code, bool)> done, bool fair = false);
  void async_extend(const std::string& resource, const std::string& token, std::chrono::milliseconds ttl,
                    std::function<void(std::error_code, bool)> done);

  // Who holds `resource`, for how much longer, its fence and its fair queue:
  // one read-only script (EVALSHA), no effect on the lock. Throws Error on
  // Redis failures and on a malformed resource; a free resource is a result
  // (held = false). Blocking: not from the client's event-loop thread.
  LockInfo inspect(std::string_view resource);
  // The asynchronous form; `done` runs on the event loop.
  void async_inspect(std::string resource, std::function<void(std::error_code, LockInfo)> done);

  struct Impl;
  // Internal, for src/lock: building a Lock value.
  Lock make_lock(std::string resource, std::string key, std::string token,
                 std::optional<std::int64_t> fence, const LockOptions& opts,
                 std::chrono::steady_clock::time_point sent_at);

 private:
  LockService(redis::Client& client, KeyBuilder keys);
  redis::Client& client_;
  KeyBuilder keys_;
  std::shared_ptr<Impl> impl_;
};

}  // namespace jobguard
