// A lock class: one kind of lock (every invoice lock, every tenant sync) and
// everything the team decided about it, declared in one place — what it
// protects, how bad a repeat is (the consequence level that picks the guards),
// its TTL policy, and what a job does when Redis is unavailable. The runner,
// the metrics (one series per class, never per key) and the logs all read it;
// no other code decides fail-open or fail-closed.
//
//   const job::LockClass kInvoiceCharge{
//       .name = "invoice-charge",
//       .key_pattern = "invoice:{id}",
//       .consequence = job::Consequence::moderate,   // lock + idempotency key
//       .on_redis_down = job::RedisDownPolicy::fail_closed,
//       .ttl = 30s,
//       .owner = "billing-team",
//       .protects = "the card charge of one invoice",
//   };
//
// The decision matrix (docs/runner.md) it enforces:
//   low       high volume, a repeat is cheap       Redis lock with TTL
//   moderate  retryable side effect                Redis lock + idempotency key
//   high      durable state transition             PostgreSQL advisory lock + completion
//                                                  record in the effect's transaction +
//                                                  fencing; Redis only for throughput
//   long_running (any level)                       lease renewal + hard timeout,
//                                                  or chunks with checkpoints
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "jobguard/lock.hpp"

namespace jobguard::job {

enum class Consequence { low, moderate, high };
const char* to_string(Consequence c) noexcept;
// "low" | "moderate" | "high"; nullopt otherwise.
std::optional<Consequence> parse_consequence(std::string_view s) noexcept;

// What a job of this class does when Redis cannot be reached at claim time.
enum class RedisDownPolicy {
  // The job does not run; the caller gets redis_unavailable with the reason.
  // The default: a job that cannot be guarded waits for a retry.
  fail_closed,
  // The job runs without the Redis lock, logged loudly (event "fail_open")
  // and counted (jobguard_fail_open_total). Only for classes where an
  // unguarded run is acceptable: a cheap repeat (low) or a class whose real
  // guard is elsewhere (high: PostgreSQL; moderate: the downstream honours
  // the idempotency key, which is derived without Redis).
  fail_open,
};
const char* to_string(RedisDownPolicy p) noexcept;
// "fail-closed" | "fail-open" (also with '_'); nullopt otherwise.
std::optional<RedisDownPolicy> parse_redis_down_policy(std::string_view s) noexcept;

// Throws Error(invalid_argument) "lock class 'NAME': WHAT" unless `name` is a
// valid class name: [A-Za-z0-9_.-]{1,64}. The one rule for every place a class
// is named (the catalog, `jobs work --class`, `run --class`): the name is a
// metrics label, so the fleet's numbers of one class join its catalog entry.
void validate_class_name(std::string_view name);

struct LockClass {
  // Metrics label and log field: [A-Za-z0-9_.-]{1,64}. Required.
  std::string name{};
  // The lock's resource for a unit: "{id}" is replaced by the unit id
  // ("invoice:{id}" -> "invoice:48291"). Without "{id}" every unit of the
  // class shares one lock ("tenant:alpha:sync"). Default "{id}".
  std::string key_pattern = "{id}";
  Consequence consequence = Consequence::moderate;
  RedisDownPolicy on_redis_down = RedisDownPolicy::fail_closed;
  // Lock TTL: how long a crashed holder keeps others out. Default 30 s; >= 10 ms.
  std::chrono::milliseconds ttl{30000};
  // How long a claim waits for a busy lock. Default 0 = try once (busy is an
  // answer: the job stays queued and comes back).
  std::chrono::milliseconds wait{0};
  // The job may outlive its TTL: the lock is a renewing lease and
  // `hard_timeout` (required) stops it. Otherwise the job must finish within
  // the TTL, checked before every side effect.
  bool long_running = false;
  std::chrono::milliseconds hard_timeout{0};
  // Every grant carries a fencing token (JobContext::fence) for a downstream
  // that checks it. Always on for high classes; opt-in for the others.
  bool fenced = false;
  // A side effect (or a chunk) starts only with at least this much safe lock
  // time left (JobContext::ensure). Default 0 = ttl / 5.
  std::chrono::milliseconds min_time_left{0};
  // Replica-confirmed grants (docs/lock-safety.md): each grant and renewal
  // is confirmed by this many replicas (WAIT) before the job is told it holds
  // the lock. -1 = the connection's `replicas` URL option (default 0 = off).
  int replicas = -1;
  // Too few acknowledgements: fail_closed releases the grant and the claim
  // fails (errc::server_busy, so the job is retried later like Redis being
  // unavailable; on_redis_down decides whether it runs unguarded); warn keeps it
  // with a logged warning.
  Unconfirmed on_unconfirmed = Unconfirmed::fail_closed;
  // What a unit's lock excludes. permits N >= 1: one permit of a counting
  // semaphore of N on the resource (LockOptions::permits; at most N units of
  // the class hold it at once). mode shared / exclusive: a reader or the
  // writer of the resource's read-write lock (LockOptions::mode). Default
  // 0 / mutex: the plain lock. Not both, and neither permits nor shared for a
  // high class (its PostgreSQL advisory lock admits one holder).
  int permits = 0;
  LockMode mode = LockMode::mutex;
  // Documentation, required for the catalog: who owns the lock and what a
  // double run would damage.
  std::string owner{};
  std::string protects{};

  // The lock resource of one unit.
  std::string resource_for(std::string_view unit_id) const;
  // min_time_left with its default applied.
  std::chrono::milliseconds effective_min_time_left() const noexcept;
  // Throws Error(invalid_argument) "lock class 'NAME': WHAT" for a missing
  // field or a declaration that breaks the decision matrix (a long-running
  // class without a hard timeout, a min_time_left not below the TTL, ...).
  void validate() const;
};

}  // namespace jobguard::job
