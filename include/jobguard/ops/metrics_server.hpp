// A small HTTP server for scrapes: GET /metrics (Prometheus text 0.0.4),
// GET /metrics.json (the same numbers as JSON), GET /healthz (HEAD too),
// and whatever routes the options add (the dashboard).
// An unknown path is 404, another method 405, a malformed request 400,
// oversized headers 431, a body over 4 KiB 413. It runs its own event loop on
// its own thread, so scrapes never touch the Redis event loop or job threads.
//
// Every read and write has a deadline: a client that connects and sends
// nothing (or reads nothing) is dropped when it expires, and because the loop
// is asynchronous it never delays other scrapes meanwhile. At the connection
// limit the longest-idle connection is evicted for a new one, so a flood of
// idle connections cannot lock scrapes out (docs/observability.md).
//
// Threads: start/stop/port from one owner thread. The Registry must outlive
// the server. The Asio machinery lives in metrics_server.cpp only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "jobguard/ops/http.hpp"
#include "jobguard/observe/metrics.hpp"

namespace jobguard::ops {

struct ListenAddress {
  std::string host{};  // "127.0.0.1", "0.0.0.0", "::1" (no brackets), "localhost"
  std::uint16_t port = 0;
};

// Parses "host:port" or "[ipv6]:port"; port 0..65535 (0 = pick a free one).
// Throws jobguard::Error(invalid_argument) with a one-line message naming
// the bad part, e.g. `--listen "localhost:99999": port must be 0..65535`.
ListenAddress parse_listen_address(std::string_view text);

struct MetricsServerOptions {
  ListenAddress listen{"127.0.0.1", 9464};
  // How long a connection may stay open without sending a byte of a request:
  // after it is accepted and between keep-alive requests (at most
  // read_timeout, which counts from the same moment). Default 5 s; must be
  // positive.
  std::chrono::milliseconds idle_timeout{5000};
  // Deadline for receiving one whole request, from when the connection is
  // accepted (or the previous response was written), so a client trickling
  // a byte a second is dropped too. Default 5 s; zero is not allowed (a
  // client could hold a connection forever).
  std::chrono::milliseconds read_timeout{5000};
  // Deadline for writing one response. Default 5 s; must be positive.
  std::chrono::milliseconds write_timeout{5000};
  // Open connections at most. When a new one arrives at the limit, the one
  // idle longest (no request in progress) is closed to make room, so idle
  // connections can never lock scrapes out; if none is idle, the new one is
  // closed. Default 64; must be positive.
  std::size_t max_connections = 64;
  // More families appended to the /metrics body (serve: the fleet's
  // numbers, ops/fleet_exporter.hpp). Called on the server thread per scrape: it
  // must return quickly. Default: none.
  std::function<std::string()> extra_metrics{};
  // /healthz: called on the server thread for each request, must not block;
  // calls `done` once, from any thread, with ok=false and a reason for a 503.
  // Empty = always "ok". (`jobguard serve` PINGs Redis here.)
  std::function<void(std::function<void(bool ok, std::string detail)> done)> health_check{};
  // How long a request waits for an asynchronous answer (the health check)
  // before it gets a 503. Default 2 s; must be positive.
  std::chrono::milliseconds handler_timeout{2000};
  // More routes (serve: the dashboard and its /api, ops/dashboard.hpp).
  // Handlers run on the server thread and must not block: one that needs
  // Redis answers later, from its own thread. A path that is also built in
  // (/metrics, /metrics.json, /healthz) keeps the built-in one. Default: none.
  std::vector<http::Route> routes{};
};

class MetricsServer {
 public:
  MetricsServer(observe::Registry& registry, MetricsServerOptions options);
  ~MetricsServer();  // stop()
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Binds and starts serving; returns once the socket listens, so port() is
  // valid. Throws jobguard::Error(invalid_argument) when the address cannot
  // be resolved or bound (in use, not local).
  void start();
  // Closes the listener and every connection, joins the thread. Idempotent.
  void stop();
  // The bound port (the real one when options asked for port 0).
  std::uint16_t port() const noexcept;
  // "http://127.0.0.1:9464" (IPv6 hosts in brackets).
  std::string base_url() const;
  // False when the bound address is reachable from other hosts (0.0.0.0, a
  // routable address): `serve` warns, since the endpoints have no auth.
  bool loopback_only() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace jobguard::ops
