// The fleet's lock numbers: every jobguard process adds its per-class
// counters and hold-time histograms to per-minute buckets in Redis, and any
// process reads them back, merged over the last 1/5/15/60 minutes.
//
// Key layout (docs/observability.md has the reasoning), for prefix "jobguard":
//   {jobguard:fleet}:classes           ZSET  member = class, score = the last
//                                      unix minute anyone published it
//   {jobguard:fleet}:m:<minute>:<class> HASH  one per class per unix minute;
//                                      counters and histogram buckets as
//                                      fields, added with HINCRBY; EXPIREAT
//                                      the end of the minute + retention
// Every key carries the same hash tag, so under Redis Cluster they share one
// slot: a publisher's whole batch is one script call, a reader's window one
// pipeline to one node.
//
// Publishing never touches the lock's hot path: the hot path updates the
// in-process Registry (relaxed atomics, as before); the publisher's own
// thread takes a snapshot every `interval`, subtracts the previous one and
// sends the difference as ONE EVALSHA. A batch that fails is not lost: the
// snapshot it was computed from is not advanced, so the next batch carries
// its counts too. The one in-doubt case (the script ran but its reply was
// lost) counts that batch twice; the publisher keeps no state that grows
// with time, only one snapshot per lock class (bounded by the Registry's
// max_classes).
//
// Buckets are keyed by wall-clock minute (hosts must agree on time within a
// few seconds for the 1-minute window to be exact) and a batch's counts all
// land in the minute the batch is sent in, so a count may show up one
// interval late: in the next minute's bucket.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jobguard/observe/metrics.hpp"

namespace jobguard::redis {
class Client;
}

namespace jobguard::observe {

using WallClock = std::chrono::system_clock;

// --- pure part: keys, counts, bucket math (no I/O; any thread) ---------------

// What one lock class did during some span: one minute bucket or a merged
// window. Histograms hold per-bucket (NOT cumulative) counts: index i counts
// observations in (kSecondsBuckets[i-1], kSecondsBuckets[i]], the last index
// the +Inf bucket.
struct FleetCounts {
  std::uint64_t attempts = 0;            // acquire calls that ended (granted or gave up)
  std::uint64_t contended = 0;           // ... of which met at least one busy answer
  std::uint64_t acquisitions = 0;        // locks granted
  std::uint64_t busy = 0;                // busy answers (a waiter may get many)
  std::uint64_t releases = 0;            // released by the owner
  std::uint64_t released_not_owner = 0;  // release found the key gone or another token
  std::uint64_t leases_lost = 0;         // leases that expired or were taken while held
  std::uint64_t renewals = 0;
  std::uint64_t renewal_failures = 0;
  std::uint64_t fail_open = 0;
  std::uint64_t stale_writes_rejected = 0;
  std::uint64_t redis_errors = 0;
  std::uint64_t rate_limited = 0;               // jobs a worker held back for a rate limit
  std::uint64_t rate_limit_wait_ms = 0;         // ... the time they waited
  std::uint64_t concurrency_limited = 0;        // jobs held back for a concurrency permit
  std::uint64_t concurrency_limit_wait_ms = 0;  // ... the time they waited
  std::array<std::uint64_t, kSecondsBuckets.size() + 1> hold_buckets{};
  std::uint64_t hold_sum_ns = 0;
  std::array<std::uint64_t, kSecondsBuckets.size() + 1> wait_buckets{};
  std::uint64_t wait_sum_ns = 0;

  FleetCounts& operator+=(const FleetCounts& o) noexcept;
  bool empty() const noexcept;
  std::uint64_t hold_count() const noexcept;
  std::uint64_t wait_count() const noexcept;
  // Leases lost + releases that found the key gone or taken: the article's
  // "expired locks". The two never count the same event (a lost lease is not
  // released; docs/observability.md).
  std::uint64_t expired() const noexcept { return leases_lost + released_not_owner; }
  HistogramSnapshot hold() const noexcept;  // cumulative, for quantiles and exposition
  HistogramSnapshot wait() const noexcept;

  // The hash fields a bucket stores, non-zero ones only ("acq" -> 3,
  // "h4" -> 2, ...). from_fields ignores names it does not know, so a newer
  // publisher can add fields without breaking an older reader.
  std::vector<std::pair<std::string, std::uint64_t>> to_fields() const;
  static FleetCounts from_fields(const std::vector<std::pair<std::string, std::string>>& fields);
};

// What happened between two snapshots of one class (`before` = nullopt: since
// the process started). A counter that went backwards (cannot happen with one
// Registry; defensive) contributes zero.
FleetCounts counts_between(const LockClassSnapshot& now, const LockClassSnapshot* before);

// Keys of one prefix (KeyBuilder's prefix, default "jobguard").
class FleetKeys {
 public:
  explicit FleetKeys(std::string prefix = "jobguard");
  std::string classes() const;
  std::string bucket(std::int64_t unix_minute, std::string_view lock_class) const;
  const std::string& prefix() const noexcept { return prefix_; }

 private:
  std::string prefix_, tag_;
};

std::int64_t unix_minute(WallClock::time_point t) noexcept;

// The buckets a window of `window` minutes reads at time `now`: the `window`
// whole minutes before the current one, plus the current (partial) minute,
// oldest first. `span_seconds` is the time they cover, from the start of the
// oldest to `now`: the divisor for rates.
struct WindowPlan {
  std::vector<std::int64_t> minutes;
  double span_seconds = 0;
};
WindowPlan plan_window(WallClock::time_point now, std::chrono::minutes window);

// "1m", "5m", "15m", "60m" (also "1h") -> minutes; throws
// Error(invalid_argument) naming the text for anything else.
std::chrono::minutes parse_window(std::string_view text);

// One class's numbers over a window, with the article's four numbers.
struct FleetClassStats {
  std::string lock_class;
  FleetCounts counts;
  double span_seconds = 0;

  double acquisitions_per_second() const noexcept;
  // Share of acquire calls that met a busy answer (waited or gave up);
  // nullopt when there were no calls.
  std::optional<double> contention_ratio() const noexcept;
  std::optional<double> hold_avg_seconds() const noexcept;
  std::optional<double> hold_quantile_seconds(double q) const noexcept;
  double expired_per_minute() const noexcept;
};

struct FleetSnapshot {
  std::chrono::minutes window{0};
  WallClock::time_point as_of;
  double span_seconds = 0;
  std::vector<FleetClassStats> classes;  // sorted by class name
  const FleetClassStats* find(std::string_view lock_class) const noexcept;
};

// Per-class, per-minute series (for plots): minutes[i] is a unix minute;
// each class's vector has one FleetCounts per minute (empty counts where
// nothing was published).
struct FleetSeries {
  std::vector<std::int64_t> minutes;
  std::map<std::string, std::vector<FleetCounts>, std::less<>> classes;
};

// --- reading (blocking; never from a Client's event-loop thread) -------------

struct FleetReaderOptions {
  std::string prefix = "jobguard";  // KeyBuilder's prefix
  // Deadline for the whole read. Default 5 s; zero = the client's command_timeout per call.
  std::chrono::milliseconds timeout{5000};
  // Most classes read; the rest are left out (fleet_reader logs nothing: the
  // snapshot just has this many). Default 1000.
  std::size_t max_classes = 1000;
  // Time source, for tests. Default: system_clock::now.
  std::function<WallClock::time_point()> now;
};

// Threads: read()/series() from any thread but the client's loop thread; the
// Client must outlive the reader. Throws jobguard::Error when Redis fails.
class FleetReader {
 public:
  explicit FleetReader(redis::Client& client, FleetReaderOptions options = {});
  // The numbers of every class published within the window, merged.
  FleetSnapshot read(std::chrono::minutes window) const;
  // The minute-by-minute buckets behind read(): minutes [now-window, now].
  FleetSeries series(std::chrono::minutes window) const;

 private:
  redis::Client& client_;
  FleetReaderOptions options_;
  FleetKeys keys_;
};

// --- publishing ---------------------------------------------------------------

struct FleetPublisherOptions {
  std::string prefix = "jobguard";  // KeyBuilder's prefix
  // Time between batches. Default 5 s; zero = publish only on flush() and
  // on destruction.
  std::chrono::milliseconds interval{5000};
  // How long a minute bucket is kept after its minute ends. Default 65 min
  // (a 60-minute window plus late batches); must be >= 1 min.
  std::chrono::minutes retention{65};
  // Deadline for one batch's round trip, the final one included. Default 2 s.
  std::chrono::milliseconds timeout{2000};
  // The registry published. nullptr (default) = Registry::global().
  Registry* registry = nullptr;
  // Wall-clock source, for tests. Default: system_clock::now.
  std::function<WallClock::time_point()> now;
};

struct FleetPublisherStats {
  std::uint64_t batches = 0;   // script calls that succeeded
  std::uint64_t failures = 0;  // script calls that failed (their counts go in the next batch)
  std::uint64_t classes_sent = 0;
};

// Publishes a Registry to Redis from its own thread. One line in a library
// user's program:  jobguard::observe::FleetPublisher fleet(client);
// The destructor sends a final batch (bounded by `timeout`), so a short-lived
// process loses nothing on an orderly exit. Declare it after the Client (so
// it is destroyed first) and destroy it after the last Lock/Lease is released.
//
// Threads: flush()/stats() from any thread but the client's loop thread; the
// destructor likewise (it waits for the last batch).
class FleetPublisher {
 public:
  explicit FleetPublisher(redis::Client& client, FleetPublisherOptions options = {});
  ~FleetPublisher();
  FleetPublisher(const FleetPublisher&) = delete;
  FleetPublisher& operator=(const FleetPublisher&) = delete;

  // Publishes what changed since the last batch now; true when Redis
  // confirmed it (or nothing had changed), false when it failed.
  bool flush();
  FleetPublisherStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// --- accumulating (jobguard serve's counters, ops/fleet_exporter.hpp) ----------

// Field-wise a - b, each field clamped at zero.
FleetCounts counts_minus(const FleetCounts& a, const FleetCounts& b) noexcept;

// Turns the fleet's minute buckets, read again and again, into totals that
// only grow: Prometheus counters. Each read adds, per (class, minute), what
// that bucket gained since it was last read; a bucket that shrank (Redis
// restarted empty) adds nothing. So the totals count everything published
// since this accumulator's first read (which brings in the retained past)
// and reset only when the process holding it restarts, as counters may.
// Pure; one owner thread.
class FleetAccumulator {
 public:
  void add(const FleetSeries& s);
  const std::map<std::string, FleetCounts, std::less<>>& totals() const noexcept { return totals_; }
  // (class, minute) buckets remembered to compute the next read's gains: at
  // most one window's minutes per class, however long the exporter runs.
  std::size_t tracked_buckets() const noexcept { return seen_.size(); }

 private:
  std::map<std::string, FleetCounts, std::less<>> totals_;
  std::map<std::pair<std::string, std::int64_t>, FleetCounts> seen_;
  // Minutes below this were forgotten and are skipped if a later read
  // reaches back that far again (they would be counted twice).
  std::int64_t floor_ = std::numeric_limits<std::int64_t>::min();
};

}  // namespace jobguard::observe
