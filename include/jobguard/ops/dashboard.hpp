// The live dashboard `jobguard serve` shows: a page compiled into the
// library (HTML, CSS and script; no CDN, no download) and the JSON API under
// /api that the page polls and scripts may call (docs/dashboard.md lists
// every endpoint and field). The API reuses what `jobguard locks`, `jobs` and
// `stats` are built on: admin::list_locks (SCAN + one pipelined inspect per
// SCAN batch, never a round trip per lock), the FleetReader, the audit
// stream and StreamSource.
//
// Actions (force release, dead-letter retry) exist only when the options
// carry an admin token: without one the server answers them 403, with one
// every request must present it (Authorization: Bearer TOKEN; compared in
// constant time, never logged) or gets 401, must be a POST and must give a
// reason; each action is appended to the audit stream <prefix>:audit.
//
// Threads: routes() once, from the owner. The handlers run on the HTTP
// server's thread and never block it: Redis work goes to the dashboard's own
// worker thread (a bounded queue: when full, 503), which answers. The Client
// must outlive the Dashboard; destroy the Dashboard after the server stops.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "jobguard/ops/http.hpp"

namespace jobguard::redis {
class Client;
}
namespace jobguard::job {
class Catalog;
}

namespace jobguard::ops {

struct DashboardOptions {
  // KeyBuilder's prefix of the fleet's locks. Default "jobguard".
  std::string prefix = "jobguard";
  // Empty (default): read-only, every action answers 403. Otherwise the
  // secret an action request must carry.
  std::string admin_token{};
  // The lock catalog: each lock's class (lock keys do not record it) and the
  // declared TTL drawn against the observed p99 hold. Default none.
  std::shared_ptr<const job::Catalog> catalog{};
  // The job streams the Jobs view shows, and their consumer group.
  std::vector<std::string> streams{};
  std::string group = "jobguard";
  // "user@host" written as `who` into audit records, with " via dashboard".
  // Default empty = admin::default_who().
  std::string who{};
  // Most locks one /api/locks answer lists (the rest are counted as
  // truncated). Default 50,000; must be >= 1.
  std::size_t max_locks = 50000;
  // How long an answer of /api/locks is reused for the same query, so ten
  // open pages cost Redis one listing a second, not ten. Default 500 ms; zero
  // = never reuse.
  std::chrono::milliseconds cache{500};
  // Requests waiting for the worker at most; more get 503 at once. Default 16.
  std::size_t max_queue = 16;
};

class Dashboard {
 public:
  // Throws Error(invalid_argument) for bad options.
  Dashboard(redis::Client& client, DashboardOptions options);
  ~Dashboard();  // stops the worker; requests still queued answer 503
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  // "/", "/app.js", "/style.css" and the /api routes, for MetricsServerOptions::routes.
  // The handlers refer to this Dashboard: it must outlive the server's use of them.
  std::vector<http::Route> routes();
  bool actions_enabled() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace jobguard::ops
