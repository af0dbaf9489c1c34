// Operating live locks: list them without blocking Redis, force-release one
// held by a dead host (advancing its fence), and read the audit trail of
// force releases. The library half of `jobguard locks`.
//
// Cost: list_locks walks the keyspace with SCAN (never KEYS), one SCAN round
// trip per `scan_count` keys examined by the server whatever matches, plus
// one pipelined inspect script per lock found. docs/operations.md gives the
// measured cost on a million unrelated keys.
//
// Threads: every function blocks on Redis and must not be called on the
// client's event-loop thread; any other thread may call them concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "jobguard/lock.hpp"

namespace jobguard::admin {

struct ListOptions {
  // Only resources starting with this ("invoice:"). Default empty = all.
  std::string prefix;
  // Only resources this accepts (e.g. a catalog class's key pattern).
  // Default empty = all.
  std::function<bool(std::string_view resource)> filter;
  // SCAN's COUNT hint: keys the server examines per round trip. Each SCAN
  // call costs the server O(scan_count); bigger means fewer round trips and
  // longer single commands. Default 1000; must be >= 1.
  std::size_t scan_count = 1000;
  // Stop after this many locks. Default 0 = no limit.
  std::size_t limit = 0;
};

struct ListStats {
  std::uint64_t scan_calls = 0;   // SCAN round trips
  std::uint64_t keys_matched = 0; // lock keys SCAN returned
  std::uint64_t inspected = 0;    // inspect scripts run
};

struct ListResult {
  std::vector<LockInfo> locks;  // held ones only, sorted by resource
  ListStats stats;
};

// Lists held locks of `service`'s key prefix. Throws Error on Redis failures.
ListResult list_locks(LockService& service, const ListOptions& opts = {});

struct ForceReleaseOptions {
  // Why: required, goes into the audit record.
  std::string reason;
  // Who: "user@host" of the operator. Default empty = default_who().
  std::string who;
  // Release only if the holder (token_owner) is still this one, so a lock
  // that changed hands since the operator looked is left alone. Default
  // empty = whoever holds it.
  std::string expect_holder;
  // Approximate cap on the audit stream (XADD MAXLEN ~). Default 10000.
  std::size_t audit_maxlen = 10000;
};

struct ForceReleaseResult {
  enum class Outcome { released, not_held, holder_changed };
  Outcome outcome = Outcome::not_held;
  std::string holder;                     // the holder removed (or found, for holder_changed)
  std::chrono::milliseconds ttl_left{0};  // what its lock still had
  std::int64_t new_fence = 0;             // the fence advanced to (released only)
  std::string audit_id;                   // the stream entry id (released only)
};

// Deletes the lock of `resource` whoever holds it, advances the resource's
// fence past every fence issued so far, publishes the release (waking plain
// waiters) and appends an audit record — atomically, in one script. What it
// does NOT do: stop the old holder. A holder that does not check fences (or a
// downstream that does not) can still write; see docs/operations.md.
// Throws Error(invalid_argument) without a reason, Error on Redis failures.
ForceReleaseResult force_release(LockService& service, std::string_view resource, const ForceReleaseOptions& opts);

struct AuditRecord {
  std::string id;              // stream entry id; its first part is the unix time in ms
  std::int64_t at_ms = 0;
  std::string resource, holder, who, reason;
  std::int64_t fence = 0;      // the fence the release advanced to
  std::int64_t ttl_left_ms = 0;
};

// The newest `count` force releases, newest first.
std::vector<AuditRecord> read_audit(LockService& service, std::size_t count = 100);

// "<prefix>:audit": the stream of force releases.
std::string audit_key(const KeyBuilder& keys);
// "$USER@hostname" (the login name from the password database when $USER is unset).
std::string default_who();

}  // namespace jobguard::admin
