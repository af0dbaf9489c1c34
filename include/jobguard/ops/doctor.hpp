// `jobguard doctor`: checks that the Redis (and PostgreSQL) a fleet's locks
// live on is fit for locks, one finding per check — OK, WARN or FAIL, what
// was seen and what to do. docs/operations.md explains every finding.
//
// Every check is read-only except the permission probe, which writes and
// deletes <prefix>:doctor:{probe}, <prefix>:doctor:{probe}:audit and
// {<prefix>:fleet}:doctor-probe, and publishes on one channel.
//
// Threads: check_redis / check_postgres block (never on the Redis client's
// event-loop thread); concurrent calls are fine.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "jobguard/redis/client.hpp"

namespace jobguard::job {
class Catalog;
}

namespace jobguard::ops {

enum class CheckStatus { ok, warn, fail };
const char* to_string(CheckStatus s) noexcept;  // "OK" | "WARN" | "FAIL"

struct CheckResult {
  std::string name;    // stable id: "eviction", "persistence", ... (docs/operations.md)
  CheckStatus status = CheckStatus::ok;
  std::string detail;  // what was seen
  std::string advice;  // what to do; empty when OK
  // A failed check whose call failed: the call's code (a refused password is
  // auth_failed, a server that is not there not_connected). Clear otherwise.
  std::error_code code{};
};

struct DoctorOptions {
  // The key prefix of the fleet's locks (KeyBuilder). Default "jobguard".
  std::string key_prefix = "jobguard";
  // PINGs timed for the latency check. Default 5; must be >= 1.
  int pings = 5;
  // Median PING round trip at which latency is WARN / FAIL. Defaults 10 ms /
  // 200 ms: lease renewals and waits are planned in tens of milliseconds.
  std::chrono::milliseconds latency_warn{10};
  std::chrono::milliseconds latency_fail{200};
  // |server TIME - this host's clock| at which the clock check is WARN / FAIL.
  // Defaults 500 ms / 30 s.
  std::chrono::milliseconds clock_warn{500};
  std::chrono::milliseconds clock_fail{30000};
  // A replica whose last acknowledgement is this old (INFO `lag`, seconds)
  // is WARN. Default 2 s.
  std::chrono::seconds replica_lag_warn{2};
  // Shared workload: keys sampled with RANDOMKEY, and the share of keys
  // outside the prefix at which the check is WARN on a server with at least
  // `shared_min_keys` keys. Defaults 64, 0.5, 1000.
  int shared_samples = 64;
  double shared_foreign_share = 0.5;
  std::int64_t shared_min_keys = 1000;
  // This host's wall clock. Default empty = std::chrono::system_clock::now.
  std::function<std::chrono::system_clock::time_point()> now;
  // The semaphores and rwlocks checks: a writer of a read-write lock that
  // has waited this long behind its resource's holders is WARN. Default 60 s.
  std::chrono::milliseconds writer_wait_warn{60000};
  // Most semaphores and read-write locks (each) those checks inspect; the
  // rest are counted as not looked at. Default 1000.
  std::size_t primitives_limit = 1000;
  // The lock catalog: a semaphore or read-write lock whose resource belongs
  // to a class is judged against what the class declares (its permits, its
  // mode). Default none.
  std::shared_ptr<const job::Catalog> catalog{};
};

// Connects nowhere itself: `client` must point at the lock Redis. Returns
// one result per check, in a fixed order. A connection failure is a single
// "connection" FAIL (the other checks are not run).
std::vector<CheckResult> check_redis(redis::Client& client, const DoctorOptions& opts = {});

// Single checks, as check_redis runs them. Latency times `opts.pings`
// sequential PINGs: WARN when the median reaches latency_warn, FAIL when the
// median or the slowest reaches latency_fail (one stall of that length
// delays renewals just the same). Clock compares the server's TIME with
// opts.now at the round trip's midpoint. Both throw Error when Redis fails.
CheckResult check_latency(redis::Client& client, const DoctorOptions& opts = {});
CheckResult check_clock(redis::Client& client, const DoctorOptions& opts = {});

// Whether the server keeps the lock state, as its lock clients wrote it in
// the lock-state record (docs/lock-safety.md): for each server (the one, or
// every primary of a Redis Cluster) a quarantine in force (until when, why),
// the forward steps of its clock the clients found, and what it may evict.
// Read only: looking never starts a quarantine (the lock clients' check
// does). The clock_steps check, the watcher's lock-state gauges and the
// dashboard's /api/lock-state are made from it.
struct LockStateServer {
  std::string address;                   // "host:port"
  bool record = false;                   // the lock-state record exists
  std::string epoch;                     // its epoch id
  std::int64_t server_time_ms = 0;       // the server's clock when read
  std::int64_t quarantine_until_ms = 0;  // grants refused until then (server time); 0: never quarantined
  std::string reason;                    // the record's last reason (of a quarantine, or "trusted as new")
  std::int64_t clock_steps = 0;          // forward steps of its clock found
  std::int64_t last_step_ms = 0;         // the last one's size (0: none)
  std::int64_t last_step_at_ms = 0;      // and when (server time)
  std::string maxmemory_policy;          // INFO maxmemory_policy
  std::int64_t maxmemory = 0;            // bytes; 0: no limit
  std::int64_t evicted_keys = 0;         // INFO evicted_keys
  bool quarantined() const noexcept { return quarantine_until_ms > server_time_ms; }
  // maxmemory set with a policy that evicts keys (the eviction check's FAIL).
  bool evicting() const noexcept { return maxmemory > 0 && maxmemory_policy != "noeviction"; }
};
// Throws Error when a server cannot be read.
std::vector<LockStateServer> read_lock_state(redis::Client& client);
// The clock_steps check of what read_lock_state found: WARN once any server's
// clock was found stepped, naming the latest step (and its primary on a
// cluster).
CheckResult check_clock_steps(const std::vector<LockStateServer>& servers, bool cluster);

// The live semaphores of the prefix (SCAN, then one inspect each): WARN for
// one with more holders than its stored permit count (lowered under them:
// no permit is granted until they are fewer) or than its catalog class
// declares, one whose stored count differs from its class's permits, one
// whose class is not a semaphore, and one whose resource also has a live
// plain lock or read-write lock holder (they do not exclude each other).
CheckResult check_semaphores(redis::Client& client, const DoctorOptions& opts = {});
// The live read-write locks of the prefix: WARN for one whose longest
// waiting writer has waited writer_wait_warn or more (readers holding long:
// new readers queue behind that writer), one whose class declares no mode,
// and one whose resource also has a live plain lock or semaphore permit.
CheckResult check_rwlocks(redis::Client& client, const DoctorOptions& opts = {});

// Connection, primary role, the jobguard tables (`jobguard pg migrate`),
// advisory locks, latency and clock offset of a PostgreSQL server.
std::vector<CheckResult> check_postgres(const std::string& url, const DoctorOptions& opts = {});

// What `jobguard serve` watches on the lock Redis (RedisWatcher): the
// doctor's read-only checks (no probe writes: the acl and shared_workload
// checks are left out) and the numbers behind them, for the gauges that the
// alert rules in deploy/prometheus/ read.
struct RedisFacts {
  bool up = false;  // the server answered PING and INFO
  // connection, role, [sentinel], replicas, replica_confirmation, eviction,
  // evicted_keys, persistence, latency, clock, cluster: as check_redis has them.
  std::vector<CheckResult> checks;
  std::int64_t evicted_keys = 0;        // INFO evicted_keys (since start or CONFIG RESETSTAT)
  bool evicting = false;                // the eviction check FAILs: maxmemory set, an evicting policy
  bool persistent = false;              // the persistence check is OK: AOF, or RDB save points
  std::int64_t replicas_connected = 0;  // INFO connected_slaves
  std::int64_t replicas_healthy = 0;    // of those, online with lag below replica_lag_warn
  int replicas_required = 0;            // the URL's replicas= (0: grants are not replica-confirmed)
  // The lock-state record (docs/lock-safety.md, "Quarantine after lost lock
  // state"), read without changing it. Not read on a Redis Cluster (each
  // primary keeps its own): lock_state_read stays false there.
  bool lock_state_read = false;
  bool lock_state_record = false;              // the record exists
  std::string lock_state_epoch;                // its epoch id
  std::chrono::milliseconds quarantine_left{0};  // by the server's clock; 0 when grants are not refused
  std::string quarantine_reason;
  // Forward steps of the server's clock that lock clients found and wrote
  // to the record (docs/lock-safety.md, "Server clock steps").
  std::int64_t clock_steps = 0;
};

// Connects nowhere itself; never throws for a Redis failure (up = false, one
// "connection" FAIL, as check_redis).
RedisFacts watch_redis(redis::Client& client, const DoctorOptions& opts = {});

// The Prometheus text of one watch (families jobguard_redis_*: docs/alerts.md
// lists them). `lock_state_losses` is the counter RedisWatcher keeps.
std::string redis_facts_to_prometheus(const RedisFacts& facts, std::uint64_t lock_state_losses);

struct RedisWatcherOptions {
  // Time between two watches. Default 15 s: on one server two INFOs, one
  // CONFIG GET, six PINGs, two TIMEs and one HMGET each (docs/alerts.md).
  std::chrono::milliseconds refresh{15000};
  // How long text() waits for the first watch after start. Default 1 s.
  std::chrono::milliseconds first_read_wait{1000};
  DoctorOptions doctor{};
};

// Runs watch_redis on its own thread every `refresh` and keeps the
// Prometheus text ready, so a scrape never waits on Redis. Counts
// jobguard_redis_lock_state_losses_total: each time the lock-state record's
// epoch changed, or the record vanished, between two watches (a restart
// without persistence, a failover, an eviction, a FLUSHALL: grants by an
// earlier incarnation may still be held). Threads: text() from any thread;
// the client must outlive the watcher.
class RedisWatcher {
 public:
  RedisWatcher(redis::Client& client, RedisWatcherOptions options = {});
  ~RedisWatcher();
  RedisWatcher(const RedisWatcher&) = delete;
  RedisWatcher& operator=(const RedisWatcher&) = delete;

  std::string text() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The worst status among `results` (ok for none).
CheckStatus worst(const std::vector<CheckResult>& results) noexcept;

}  // namespace jobguard::ops
