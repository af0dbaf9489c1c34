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
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "jobguard/redis/client.hpp"

namespace jobguard::observe {

enum class CheckStatus { ok, warn, fail };
const char* to_string(CheckStatus s) noexcept;  // "OK" | "WARN" | "FAIL"

struct CheckResult {
  std::string name;    // stable id: "eviction", "persistence", ... (docs/operations.md)
  CheckStatus status = CheckStatus::ok;
  std::string detail;  // what was seen
  std::string advice;  // what to do; empty when OK
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

// Connection, primary role, the jobguard tables (`jobguard pg migrate`),
// advisory locks, latency and clock offset of a PostgreSQL server.
std::vector<CheckResult> check_postgres(const std::string& url, const DoctorOptions& opts = {});

// The worst status among `results` (ok for none).
CheckStatus worst(const std::vector<CheckResult>& results) noexcept;

}  // namespace jobguard::observe
