// The fleet's numbers for `jobguard serve`: a reader thread plus the
// Prometheus rendering. Kept apart from metrics_server.cpp, which only calls
// FleetExporter::text() through MetricsServerOptions::extra_metrics.
#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <optional>

#include "jobguard/error.hpp"
#include "ops/refresher.hpp"
#include "jobguard/observe/exposition.hpp"
#include "jobguard/ops/fleet_exporter.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::ops {

using observe::FleetAccumulator;
using observe::FleetCounts;
using observe::FleetReader;
using observe::FleetReaderOptions;
using observe::HistogramSnapshot;
using observe::unix_minute;
using observe::WallClock;

namespace {

using observe::escape_label_value;
using observe::format_value;
using observe::kSecondsBuckets;

using Field = std::uint64_t FleetCounts::*;
struct CounterFamily {
  const char* name;
  const char* help;
  Field field;  // nullptr: expired() (lost + released_not_owner)
  // Stored in milliseconds, exposed in seconds (the base unit): 0.001.
  double scale = 1;
};

// Names follow Prometheus conventions: namespace jobguard, subsystem
// fleet_lock, counters end in _total, durations in seconds.
constexpr CounterFamily kCounters[] = {
    {"jobguard_fleet_lock_attempts_total", "Acquire calls that ended (granted or gave up), all processes.",
     &FleetCounts::attempts},
    {"jobguard_fleet_lock_acquisitions_total", "Locks granted, all processes.", &FleetCounts::acquisitions},
    {"jobguard_fleet_lock_contended_total",
     "Acquire calls that met at least one busy answer (waited or gave up); contention rate = contended / attempts.",
     &FleetCounts::contended},
    {"jobguard_fleet_lock_busy_total", "Busy answers to acquire attempts (a waiter may get several).",
     &FleetCounts::busy},
    {"jobguard_fleet_lock_expired_total",
     "Locks that expired under their holder: leases lost plus releases that found the key gone or taken.", nullptr},
    {"jobguard_fleet_lock_leases_lost_total", "Leases that expired or were taken by another owner while held.",
     &FleetCounts::leases_lost},
    {"jobguard_fleet_lock_released_not_owner_total",
     "Releases that found the lock gone or held by another token.", &FleetCounts::released_not_owner},
    {"jobguard_fleet_lock_releases_total", "Locks released by their owner.", &FleetCounts::releases},
    {"jobguard_fleet_lock_renewals_total", "Successful lease renewals.", &FleetCounts::renewals},
    {"jobguard_fleet_lock_renewal_failures_total", "Lease renewals that failed.", &FleetCounts::renewal_failures},
    {"jobguard_fleet_lock_fail_open_total", "Jobs run without the lock because Redis was unavailable.",
     &FleetCounts::fail_open},
    {"jobguard_fleet_lock_stale_writes_rejected_total", "Writes rejected for a stale fencing token.",
     &FleetCounts::stale_writes_rejected},
    {"jobguard_fleet_lock_redis_errors_total", "Redis errors met while acquiring, renewing or releasing.",
     &FleetCounts::redis_errors},
    {"jobguard_fleet_job_rate_limited_total", "Jobs stream workers held back for a rate limit, all processes.",
     &FleetCounts::rate_limited},
    {"jobguard_fleet_job_rate_limit_wait_seconds_total", "Time those jobs waited for their turn, all processes.",
     &FleetCounts::rate_limit_wait_ms, 0.001},
    {"jobguard_fleet_job_concurrency_limited_total",
     "Jobs stream workers held back for a per-key concurrency permit, all processes.",
     &FleetCounts::concurrency_limited},
    {"jobguard_fleet_job_concurrency_limit_wait_seconds_total", "Time those jobs waited for a permit, all processes.",
     &FleetCounts::concurrency_limit_wait_ms, 0.001},
};

void histogram(std::string& out, const char* name, const std::string& label, const HistogramSnapshot& h) {
  auto it = std::back_inserter(out);
  for (std::size_t i = 0; i < kSecondsBuckets.size(); ++i)
    fmt::format_to(it, "{}_bucket{{class=\"{}\",le=\"{}\"}} {}\n", name, label, format_value(kSecondsBuckets[i]),
                   h.cumulative[i]);
  fmt::format_to(it, "{}_bucket{{class=\"{}\",le=\"+Inf\"}} {}\n", name, label, h.count);
  fmt::format_to(it, "{}_sum{{class=\"{}\"}} {}\n", name, label, format_value(h.sum_seconds));
  fmt::format_to(it, "{}_count{{class=\"{}\"}} {}\n", name, label, h.count);
}

}  // namespace

std::string fleet_to_prometheus(const std::map<std::string, FleetCounts, std::less<>>& totals, bool up) {
  std::string out;
  out.reserve(512 + totals.size() * 6144);
  auto it = std::back_inserter(out);
  observe::append_family_header(out, "jobguard_fleet_up",
                                "1 when the last read of the fleet's numbers from Redis succeeded.", "gauge");
  fmt::format_to(it, "jobguard_fleet_up {}\n", up ? 1 : 0);
  observe::append_family_header(out, "jobguard_fleet_lock_classes", "Lock classes with published numbers.", "gauge");
  fmt::format_to(it, "jobguard_fleet_lock_classes {}\n", totals.size());
  for (const auto& f : kCounters) {
    observe::append_family_header(out, f.name, f.help, "counter");
    for (const auto& [name, c] : totals) {
      const std::uint64_t v = f.field ? c.*(f.field) : c.expired();
      fmt::format_to(it, "{}{{class=\"{}\"}} {}\n", f.name, escape_label_value(name),
                     f.scale == 1 ? fmt::format("{}", v) : format_value(static_cast<double>(v) * f.scale));
    }
  }
  observe::append_family_header(out, "jobguard_fleet_lock_hold_seconds",
                                "Time locks were held, from grant to release or loss, all processes.", "histogram");
  for (const auto& [name, c] : totals)
    histogram(out, "jobguard_fleet_lock_hold_seconds", escape_label_value(name), c.hold());
  observe::append_family_header(out, "jobguard_fleet_lock_wait_seconds",
                                "Time from the first acquire attempt until granted or given up, all processes.", "histogram");
  for (const auto& [name, c] : totals)
    histogram(out, "jobguard_fleet_lock_wait_seconds", escape_label_value(name), c.wait());
  return out;
}

struct FleetExporter::Impl {
  Impl(redis::Client& c, FleetExporterOptions o) : client(c), opts(std::move(o)) {
    if (opts.refresh.count() <= 0) throw Error(errc::invalid_argument, "fleet exporter: refresh must be positive");
    if (!opts.now) opts.now = [] { return WallClock::now(); };
    refresher.emplace(fleet_to_prometheus({}, false), opts.refresh, opts.first_read_wait, [this] { return read_once(); });
  }

  redis::Client& client;
  FleetExporterOptions opts;
  FleetAccumulator acc;                  // reader thread only
  std::optional<std::int64_t> last_ok;  // minute of the last good read; reader thread only

  std::string read_once() {
    const auto now = opts.now();
    const std::int64_t minute = unix_minute(now);
    // Steady state: the current and two earlier minutes (a batch lands at
    // most one publisher interval late). First read, or after a gap: back
    // to the oldest retained minute we have not read, at most an hour.
    std::int64_t back = 60;
    if (last_ok) back = std::clamp<std::int64_t>(minute - *last_ok + 2, 2, 60);
    bool up = true;
    try {
      FleetReaderOptions ro;
      ro.prefix = opts.prefix;
      ro.timeout = opts.timeout;
      ro.now = [now] { return now; };
      acc.add(FleetReader(client, ro).series(std::chrono::minutes(back)));
      last_ok = minute;
    } catch (const std::exception&) {
      up = false;
    }
    return fleet_to_prometheus(acc.totals(), up);
  }

  // Last, and started once the options are checked: its thread calls
  // read_once, which uses everything above.
  std::optional<detail::Refresher> refresher;
};

FleetExporter::FleetExporter(redis::Client& client, FleetExporterOptions options)
    : impl_(std::make_unique<Impl>(client, std::move(options))) {}

FleetExporter::~FleetExporter() = default;

std::string FleetExporter::text() const { return impl_->refresher->text(); }

}  // namespace jobguard::ops
