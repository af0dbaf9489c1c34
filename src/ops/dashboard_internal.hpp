// The dashboard's pure half: parameters in, JSON out; the token check. No
// I/O, so tests/unit/ops/dashboard_test.cpp drives it without a server.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jobguard/admin.hpp"
#include "jobguard/job/stream_source.hpp"
#include "jobguard/observe/fleet.hpp"
#include "jobguard/ops/doctor.hpp"
#include "jobguard/ops/http.hpp"
#include "jobguard/rwlock.hpp"
#include "jobguard/semaphore.hpp"
#include "jobguard/text.hpp"

namespace jobguard::job {
class Catalog;
}

namespace jobguard::ops::dash {

using observe::FleetClassStats;
using observe::FleetCounts;
using observe::FleetSeries;
using observe::WallClock;

// Values come from Redis and from the client: shown escaped, never trusted
// as UTF-8.
inline std::string shown(std::string_view s) { return escape_text(s, 1024); }

// A request the API refuses: `status` (400, 401, 403, 404, 409) with a
// one-line message, answered as {"error": message}.
struct ApiError : std::runtime_error {
  ApiError(int code, const std::string& message) : std::runtime_error(message), status(code) {}
  int status;
};

// The parameters of a query string or form body. Throws ApiError(400) for a
// malformed escape, a name not in `allowed` (a typo must not silently mean
// "no filter") or a name given twice.
class Params {
 public:
  Params(std::string_view text, std::vector<std::string_view> allowed);
  // The value, or `fallback` when absent.
  std::string get(std::string_view name, std::string fallback = {}) const;
  bool has(std::string_view name) const;
  // A whole number in [min, max]; `fallback` when absent. ApiError(400) otherwise.
  std::size_t count(std::string_view name, std::size_t fallback, std::size_t min, std::size_t max) const;
  // Present and non-empty; ApiError(400) naming it otherwise.
  std::string required(std::string_view name) const;

 private:
  std::vector<std::pair<std::string, std::string>> values_;
};

// True when `presented` equals `secret`. Takes the same time whatever the
// bytes and wherever they first differ, so response times tell an attacker
// nothing about the secret; only its length may leak.
bool token_matches(std::string_view presented, std::string_view secret) noexcept;

// Refuses an action unless the server has a token (403) and the request
// carries it as "Authorization: Bearer TOKEN" (401). Throws ApiError.
void authorize(const http::Request& req, std::string_view secret);

http::Response json_response(int status, std::string body);
// {"error":"<message>"} on one line.
http::Response json_error(int status, std::string_view message);

// What each lock's class is, by the catalog's key patterns; null without a catalog.
using CatalogPtr = const job::Catalog*;

// /api/locks: the listing as `jobguard locks ls --json` prints it, plus
// server_time_ms, truncated and the catalog's classes with their TTLs.
std::string locks_json(const admin::ListResult& res, CatalogPtr catalog, bool truncated);

// /api/primitives: the semaphores with live permits (holders by slot, the
// stored count, the catalog's declared permits) and the read-write locks
// with a live holder (the writer, the readers, the waiting writers and how
// long the first has waited), each with its catalog class.
std::string primitives_json(const std::vector<SemaphoreInfo>& sems, const std::vector<RwLockInfo>& rws,
                            CatalogPtr catalog, bool truncated);

// /api/lock-state: per server (each primary of a cluster) whether grants are
// quarantined (until when, why), the clock steps lock clients found (how
// many, the last one's size and time) and what it may evict: what `doctor`
// and /metrics read (read_lock_state).
std::string lock_state_json(const std::vector<LockStateServer>& servers, bool cluster);

// /api/classes: the four numbers over the last `window` minutes and per-minute
// series over the hour, per class; the declared TTL when a catalog has the class.
std::string classes_json(const FleetSeries& hour, WallClock::time_point now, std::chrono::minutes window,
                         CatalogPtr catalog);

// /api/incidents: "incidents", one per event with its key, job and time —
// operator actions from the audit stream and the lost leases, stale fencing
// tokens and fail-open runs the library recorded (admin::record_incident) —
// newest first, at most `limit`; and "counts", the fleet's per-class,
// per-minute counts of the same kinds over the hour (every event, recorded
// or not).
std::string incidents_json(const std::vector<admin::AuditRecord>& audit, const std::vector<admin::Incident>& recorded,
                           const FleetSeries& hour, std::size_t limit);

// One stream of /api/jobs.
struct StreamView {
  std::string stream, group, dead_letter;
  std::int64_t length = 0, pending_count = 0, dead_count = 0;
  std::vector<job::PendingEntry> pending;
  std::vector<job::DeadLetter> dead;
  std::string error;  // why the stream could not be read (no group yet, ...)
};
std::string jobs_json(const std::vector<StreamView>& streams);
std::string dead_letter_json(const std::string& stream, const job::DeadLetter& d);

}  // namespace jobguard::ops::dash
