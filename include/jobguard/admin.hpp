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
#include <optional>
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
  int permit_slot = -1;                   // force_release_permit: the slot freed (released only)
  // With the connection's `replicas` option set, the release and its fence
  // advance are confirmed with WAIT like a grant. Empty when confirmed (or
  // none was asked); otherwise what the confirmation found ("0 of 1 replicas
  // acknowledged ..."): the release happened on the primary, but a promoted
  // replica may still hold the old lock and fence. It cannot be undone, so it
  // is reported, not thrown.
  std::string unconfirmed;
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
  // "force_release" (also for records written before actions had names), or
  // another operator action ("retry_dead_letter": the dashboard's retry).
  std::string action = "force_release";
  std::string resource, holder, who, reason;
  std::int64_t fence = 0;      // the fence the release advanced to
  std::int64_t ttl_left_ms = 0;
  std::string job;             // retry_dead_letter: "<dead-letter id> -> <new id>"
};

// The newest `count` audit records (force releases and other operator
// actions), newest first. On a Redis Cluster also those of every resource's
// own stream (audit_key(keys, resource)), found by SCAN on each primary.
std::vector<AuditRecord> read_audit(LockService& service, std::size_t count = 100);

// Appends an operator action other than a force release (which its script
// records atomically) to the audit stream: action, resource, job, who,
// reason (required: Error(invalid_argument) without one). Returns the entry id.
std::string append_audit(LockService& service, const AuditRecord& record, std::size_t maxlen = 10000);

// --- incidents: what went wrong, one record each, for the dashboard's timeline ---
// The library appends one when a lease is lost (LeaseScheduler), a stale
// fencing token is rejected or a job ran fail-open (job::GuardedRunner), to
// the capped stream "<prefix>:incidents". The fleet's counters count every
// such event; these records add the key, the job and the time, best effort:
// an incident that happens while Redis is unreachable (a fail-open run, a
// lease lost to a partition) is counted but may not be recorded.

struct Incident {
  std::string id;        // stream entry id (read_incidents)
  std::int64_t at_ms = 0;
  std::string kind;      // "lease_lost", "stale_fence_rejected", "fail_open"
  std::string resource;  // the lock's resource
  std::string job;       // the holder's owner ("host/pid/job") or the job id
  std::string lock_class;
  std::string detail;    // why, one line
};

// "<prefix>:incidents".
std::string incidents_key(const KeyBuilder& keys);
// Appends `incident` (XADD MAXLEN ~ 10000) without waiting for the answer:
// never blocks, never throws, so the loop thread may call it; a failure is
// dropped. The fields are cut to 512 bytes each.
void record_incident(redis::Client& client, const KeyBuilder& keys, const Incident& incident);
// The newest `count` incidents, newest first. Blocking.
std::vector<Incident> read_incidents(LockService& service, std::size_t count = 100);

// --- what `jobguard locks` prints (pure; any thread) -----------------------------
// The CLI is a thin layer over these, so another tool (a chat bot, a web page)
// shows the same columns and the same JSON as the command line.

// "invoice:1" or "jobguard:lock:{invoice:1}" (a lock key of `keys`' prefix)
// -> "invoice:1". Throws Error(invalid_argument) for a malformed resource.
std::string parse_resource(const KeyBuilder& keys, std::string_view key_or_resource);

// What a listing knows of a lock's class. Lock keys do not record their class
// (that would cost every grant a write), so it comes from the caller — the
// lock catalog's key patterns for `jobguard locks ls --catalog`.
struct ClassTag {
  std::string name;
  // The catalog says the class is fenced. When false the resource's fence
  // (and so the age column) belongs to an earlier fenced grant, not to this
  // holder, and the age is shown as "-".
  bool fenced = true;
};
// nullopt: the resource matches no class. An empty ClassOf means "no catalog":
// no class column, ages shown as "at most" (docs/operations.md).
using ClassOf = std::function<std::optional<ClassTag>(std::string_view resource)>;

// The `locks ls` table: RESOURCE HOLDER AGE TTL_LEFT FENCE WAITERS [CLASS],
// aligned, then "N locks (M SCAN round trips)".
std::string format_list(const ListResult& res, const ClassOf& class_of = {});
// `locks show`: one field per line.
std::string format_info(const LockInfo& info);
// `locks release`: the line printed for each outcome (the holder_changed one
// names `expected_holder`, and goes to stderr).
std::string format_release(std::string_view resource, const ForceReleaseResult& r,
                           std::string_view expected_holder);
// `locks audit`: one line per record, "2026-12-01T04:29:10.454Z  resource  by who  removed holder ...".
std::string format_audit(const std::vector<AuditRecord>& records);

// The same as one JSON document each (the CLI's --json): {"locks":[...],
// "scan_calls", "keys_matched"}; one lock object; {"resource","outcome",...};
// {"releases":[...]}. Field names are documented in docs/operations.md.
std::string list_json(const ListResult& res, const ClassOf& class_of = {});
std::string info_json(const LockInfo& info);
std::string release_json(std::string_view resource, const ForceReleaseResult& r);
std::string audit_json(const std::vector<AuditRecord>& records);

// "<prefix>:audit": the stream of force releases and other operator actions.
std::string audit_key(const KeyBuilder& keys);
// "<prefix>:audit:{<resource>}": on a Redis Cluster, the stream a force
// release of `resource` is recorded in, in the resource's slot (its script
// writes the record with the release). read_audit reads them all.
std::string audit_key(const KeyBuilder& keys, std::string_view resource);
// The hash in which every client of a single server keeps the server's lock
// state (its epoch, a quarantine's end and reason, the clock steps seen),
// for tools that read it; only the lock part writes it. On a Redis Cluster
// each primary keeps its own, in a slot of that primary's.
std::string_view lock_state_key() noexcept;
// Where the lock-state records are, to read each on its own node: one on a
// single server (node ""), one per primary on a cluster (each in a slot of
// its own primary, at CallOptions::node = node). Throws Error when the
// cluster's slot map cannot be read or names no primary.
struct LockStateRecord {
  std::string node;     // CallOptions::node ("" on one server)
  std::string address;  // "host:port", for messages
  std::string key;      // the record's key
};
std::vector<LockStateRecord> lock_state_records(redis::Client& client);
// "$USER@hostname" (the login name from the password database when $USER is unset).
std::string default_who();

}  // namespace jobguard::admin
