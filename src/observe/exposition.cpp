#include "jobguard/observe/exposition.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <iterator>

#ifndef JOBGUARD_VERSION_STRING
#define JOBGUARD_VERSION_STRING "unknown"
#endif

namespace jobguard::observe {

std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string escape_help(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);  // fmt prints the shortest round-trip form
}

namespace {

using CounterField = std::uint64_t LockClassSnapshot::*;
using HistogramField = HistogramSnapshot LockClassSnapshot::*;

struct CounterFamily {
  const char* name;
  const char* help;
  CounterField field;
  // Stored in milliseconds, exposed in seconds (the base unit): 0.001.
  double scale = 1;
};

// Order here is the order on the page; names follow Prometheus conventions:
// jobguard_ namespace, lock_ subsystem, base unit seconds, counters end _total.
constexpr CounterFamily kCounters[] = {
    {"jobguard_lock_acquisitions_total", "Locks granted.", &LockClassSnapshot::acquisitions_total},
    {"jobguard_lock_busy_total", "Acquire attempts answered busy because another owner held the lock (contention).",
     &LockClassSnapshot::busy_total},
    {"jobguard_lock_renewals_total", "Successful lease renewals.", &LockClassSnapshot::renewals_total},
    {"jobguard_lock_renewal_failures_total", "Lease renewals that failed (Redis error or token gone).",
     &LockClassSnapshot::renewal_failures_total},
    {"jobguard_lock_leases_lost_total", "Leases that expired or were taken by another owner while held.",
     &LockClassSnapshot::leases_lost_total},
    {"jobguard_lock_fail_open_total", "Jobs run without the lock because Redis was unavailable (fail-open policy).",
     &LockClassSnapshot::fail_open_total},
    {"jobguard_lock_stale_writes_rejected_total", "Downstream writes rejected because their fencing token was stale.",
     &LockClassSnapshot::stale_writes_rejected_total},
    {"jobguard_lock_redis_errors_total", "Redis errors met while acquiring, renewing or releasing.",
     &LockClassSnapshot::redis_errors_total},
    {"jobguard_lock_releases_total", "Locks released by their owner.", &LockClassSnapshot::releases_total},
    {"jobguard_lock_released_not_owner_total",
     "Releases that found the lock gone or held by another owner (the lease had been lost).",
     &LockClassSnapshot::released_not_owner_total},
    {"jobguard_job_rate_limited_total", "Jobs a stream worker held back for a rate limit before their run.",
     &LockClassSnapshot::rate_limited_total},
    {"jobguard_job_rate_limit_wait_seconds_total", "Time those jobs waited for their turn, in all.",
     &LockClassSnapshot::rate_limit_wait_ms_total, 0.001},
    {"jobguard_job_concurrency_limited_total",
     "Jobs a stream worker held back for a per-key concurrency permit before their run.",
     &LockClassSnapshot::concurrency_limited_total},
    {"jobguard_job_concurrency_limit_wait_seconds_total", "Time those jobs waited for a permit, in all.",
     &LockClassSnapshot::concurrency_limit_wait_ms_total, 0.001},
};

struct HistogramFamily {
  const char* name;
  const char* help;
  HistogramField field;
};

constexpr HistogramFamily kHistograms[] = {
    {"jobguard_lock_wait_seconds", "Time from the first acquire attempt until the lock was granted or the caller gave up.",
     &LockClassSnapshot::wait_seconds},
    {"jobguard_lock_hold_seconds", "Time a lock was held, from grant to release or loss.",
     &LockClassSnapshot::hold_seconds},
};


}  // namespace

void append_family_header(std::string& out, std::string_view name, std::string_view help, std::string_view type) {
  fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name, escape_help(help), name, type);
}

std::string to_prometheus(const std::vector<LockClassSnapshot>& classes) {
  std::string out;
  out.reserve(1024 + classes.size() * 4096);
  auto it = std::back_inserter(out);

  append_family_header(out, "jobguard_build_info", "jobguard build; the value is always 1.", "gauge");
  fmt::format_to(it, "jobguard_build_info{{version=\"{}\"}} 1\n", escape_label_value(JOBGUARD_VERSION_STRING));

  for (const auto& f : kCounters) {
    append_family_header(out, f.name, f.help, "counter");
    for (const auto& c : classes) {
      const std::uint64_t v = c.*(f.field);
      fmt::format_to(it, "{}{{lock_class=\"{}\"}} {}\n", f.name, escape_label_value(c.lock_class),
                     f.scale == 1 ? fmt::format("{}", v) : format_value(static_cast<double>(v) * f.scale));
    }
  }
  for (const auto& f : kHistograms) {
    append_family_header(out, f.name, f.help, "histogram");
    for (const auto& c : classes) {
      const std::string label = escape_label_value(c.lock_class);
      const HistogramSnapshot& h = c.*(f.field);
      for (std::size_t i = 0; i < kSecondsBuckets.size(); ++i)
        fmt::format_to(it, "{}_bucket{{lock_class=\"{}\",le=\"{}\"}} {}\n", f.name, label,
                       format_value(kSecondsBuckets[i]), h.cumulative[i]);
      fmt::format_to(it, "{}_bucket{{lock_class=\"{}\",le=\"+Inf\"}} {}\n", f.name, label, h.count);
      fmt::format_to(it, "{}_sum{{lock_class=\"{}\"}} {}\n", f.name, label, format_value(h.sum_seconds));
      fmt::format_to(it, "{}_count{{lock_class=\"{}\"}} {}\n", f.name, label, h.count);
    }
  }
  return out;
}

std::string to_prometheus(const Registry& registry) { return to_prometheus(registry.snapshot()); }

}  // namespace jobguard::observe
