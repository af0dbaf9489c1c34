// Lock metrics, kept per lock CLASS ("billing", "inventory-sync"), never per
// lock key: a key names a business object (invoice:48291) and there are
// millions of them; one time series per key would take down the Prometheus
// that scrapes us. The lock layer and the job runner update these on the
// acquire/release hot path, so every update is a relaxed atomic add: no
// mutex, no allocation.
//
// Threads: every member of Counter, Histogram, LockClassMetrics and Registry
// may be called from any thread. References returned by Registry::lock_class
// stay valid for the Registry's lifetime (classes are never removed).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

namespace jobguard::observe {

// A monotonically increasing count.
class Counter {
 public:
  void inc(std::uint64_t n = 1) noexcept { v_.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t value() const noexcept { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> v_{0};
};

// Upper bounds (seconds) of the finite histogram buckets, 1-2.5-5 per decade
// from 100 us to 60 s: the range between a local Redis round trip and a lock
// held across a slow payment call. A +Inf bucket follows implicitly.
inline constexpr std::array<double, 18> kSecondsBuckets = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,    0.25,    0.5,    1.0,   2.5,    5.0,   10.0, 30.0,  60.0};

// A consistent-enough copy of a Histogram, taken without stopping writers.
// `cumulative[i]` counts observations <= kSecondsBuckets[i]; the last entry
// (index kSecondsBuckets.size()) is the +Inf bucket and equals `count`.
struct HistogramSnapshot {
  std::array<std::uint64_t, kSecondsBuckets.size() + 1> cumulative{};
  double sum_seconds = 0;
  std::uint64_t count = 0;

  // Estimate of the q-quantile (0 <= q <= 1) by linear interpolation inside
  // the bucket that holds it, as Prometheus' histogram_quantile() does, so the
  // linter and a dashboard agree. nullopt when there are no observations.
  // When the quantile falls in the +Inf bucket the answer is the largest
  // finite bound (60 s): "at least this much", not an exact value.
  std::optional<double> quantile(double q) const;
};

// A fixed-bucket histogram of durations in seconds.
class Histogram {
 public:
  void observe(std::chrono::nanoseconds d) noexcept;
  void observe_seconds(double seconds) noexcept;
  HistogramSnapshot snapshot() const noexcept;
  // Index of the bucket an observation of `seconds` falls in (size() = +Inf).
  static std::size_t bucket_index(double seconds) noexcept;

 private:
  // Per-bucket (not cumulative) counts, so an observation touches one slot.
  std::array<std::atomic<std::uint64_t>, kSecondsBuckets.size() + 1> buckets_{};
  // Sum kept in integer nanoseconds: integer fetch_add is lock-free everywhere
  // and does not lose small values the way a large double sum does.
  std::atomic<std::uint64_t> sum_ns_{0};
};

// Everything we count about one lock class. Members are public so the hot
// path reads as `m.acquisitions_total.inc()`.
struct LockClassMetrics {
  Counter acquisitions_total;           // locks granted
  Counter busy_total;                   // attempts answered "busy" (contention)
  Counter contended_total;              // acquire calls that met >= 1 busy answer (waited or gave up)
  Histogram wait_seconds;               // first attempt -> granted or gave up
  Histogram hold_seconds;               // granted -> released or lost
  Counter renewals_total;               // successful lease renewals
  Counter renewal_failures_total;       // renewals that failed (error or token gone)
  Counter leases_lost_total;            // leases that expired or were taken while held
  Counter fail_open_total;              // jobs run without a lock because Redis was down
  Counter stale_writes_rejected_total;  // downstream writes refused for a stale fence
  Counter redis_errors_total;           // Redis errors met while working for this class
  Counter releases_total;               // successful releases by the owner
  Counter released_not_owner_total;     // releases that found another owner / no key
  // A stream worker's limits (job/limits.hpp), counted under the class its
  // jobs run as: jobs that waited for their turn, and how long in all.
  Counter rate_limited_total;
  Counter rate_limit_wait_ms_total;
  Counter concurrency_limited_total;
  Counter concurrency_limit_wait_ms_total;
};

// A plain copy of one class's numbers.
struct LockClassSnapshot {
  std::string lock_class{};
  std::uint64_t acquisitions_total = 0;
  std::uint64_t busy_total = 0;
  std::uint64_t contended_total = 0;
  HistogramSnapshot wait_seconds{};
  HistogramSnapshot hold_seconds{};
  std::uint64_t renewals_total = 0;
  std::uint64_t renewal_failures_total = 0;
  std::uint64_t leases_lost_total = 0;
  std::uint64_t fail_open_total = 0;
  std::uint64_t stale_writes_rejected_total = 0;
  std::uint64_t redis_errors_total = 0;
  std::uint64_t releases_total = 0;
  std::uint64_t released_not_owner_total = 0;
  std::uint64_t rate_limited_total = 0;
  std::uint64_t rate_limit_wait_ms_total = 0;
  std::uint64_t concurrency_limited_total = 0;
  std::uint64_t concurrency_limit_wait_ms_total = 0;
};

struct RegistryOptions {
  // Most distinct lock classes kept. A caller that passes a lock KEY where a
  // class belongs would otherwise grow the registry (and the scrape) without
  // bound; past the cap every new name shares the class kOverflowClass.
  // Default 512; zero means no new class is ever created (all overflow).
  std::size_t max_classes = 512;
};

inline constexpr std::string_view kOverflowClass = "_overflow";

class Registry {
 public:
  explicit Registry(RegistryOptions options = {});
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;
  ~Registry();

  // The process-wide registry that `jobguard serve` and the job runner expose.
  static Registry& global();

  // The metrics of lock class `name`, created on first use. Looking up an
  // existing class takes a shared lock and does not allocate; callers on a
  // hot path may also keep the reference.
  LockClassMetrics& lock_class(std::string_view name);

  // Copies of every class's numbers, sorted by class name.
  std::vector<LockClassSnapshot> snapshot() const;
  // The numbers of one class, nullopt when it was never used.
  std::optional<LockClassSnapshot> snapshot(std::string_view name) const;

 private:
  RegistryOptions options_;
  mutable std::shared_mutex mu_;
  // unique_ptr: references handed out must survive rehash/rebalancing, and
  // LockClassMetrics (atomics) is not movable anyway.
  std::map<std::string, std::unique_ptr<LockClassMetrics>, std::less<>> classes_;
};

}  // namespace jobguard::observe
