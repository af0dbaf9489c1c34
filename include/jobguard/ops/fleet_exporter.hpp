// The fleet's numbers as Prometheus counters for `jobguard serve`: a thread
// that reads the minute buckets FleetPublisher writes (observe/fleet.hpp),
// adds them up with a FleetAccumulator and keeps the text a scrape returns
// (MetricsServerOptions::extra_metrics).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "jobguard/observe/fleet.hpp"

namespace jobguard::redis {
class Client;
}

namespace jobguard::ops {

// The fleet families in Prometheus text 0.0.4 (HELP/TYPE always present):
// jobguard_fleet_up, jobguard_fleet_lock_*_total{class=...} counters and
// the jobguard_fleet_lock_hold_seconds / _wait_seconds histograms.
std::string fleet_to_prometheus(const std::map<std::string, observe::FleetCounts, std::less<>>& totals, bool up);

struct FleetExporterOptions {
  std::string prefix = "jobguard";  // KeyBuilder's prefix
  // Time between reads of Redis. Default 5 s; must be positive.
  std::chrono::milliseconds refresh{5000};
  // Deadline for one read. Default 2 s.
  std::chrono::milliseconds timeout{2000};
  // How long text() waits for the first read after start. Default 1 s; zero =
  // never wait (a scrape before the first read shows no classes, fleet_up 0).
  std::chrono::milliseconds first_read_wait{1000};
  std::function<observe::WallClock::time_point()> now;  // for tests; default system_clock::now
};

// Reads the fleet's buckets on its own thread every `refresh` and keeps the
// Prometheus text ready, so a scrape never waits on Redis (the HTTP loop
// must not block). Threads: text() from any thread; the Client must outlive
// the exporter.
class FleetExporter {
 public:
  FleetExporter(redis::Client& client, FleetExporterOptions options = {});
  ~FleetExporter();
  FleetExporter(const FleetExporter&) = delete;
  FleetExporter& operator=(const FleetExporter&) = delete;

  // The latest text. Until the first read has finished (or failed) it waits
  // for it, at most `first_read_wait`, so the first scrape after start
  // usually has the numbers without a down Redis stalling the HTTP loop.
  std::string text() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace jobguard::ops
