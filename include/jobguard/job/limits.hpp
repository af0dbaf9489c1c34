// Limits for workers, shared by every worker process that names the same
// limit and kept in Redis, so that a restarted worker neither forgets what
// was spent nor gets a fresh burst.
//
// Per-key concurrency (ConcurrencyLimit): at most N jobs with the same value
// of a field running at once, fleet-wide. Each is a permit of a counting
// semaphore (<jobguard/semaphore.hpp>) of N permits on a resource named from
// the field's value, taken before the job's run, renewed by a lease while
// the job runs and released when its run is over; a worker that dies leaves
// its permit to expire with its lease (the semaphore's TTL), not forever.
//
// Rate limits (RateLimit): at most N jobs per period, shared by every worker
// process that names the same limit, kept in Redis so that a restarted worker
// neither forgets what was spent nor gets a fresh burst.
//
// The algorithm is GCRA (the generic cell rate algorithm, a leaky bucket kept
// as one timestamp): the key holds the theoretical arrival time of the next
// job; a job may start when that time has come, and moves it on by
// period / N. Why this one: one key and one short script per start (a
// sliding-window log keeps an entry per job), the server's clock (TIME) for
// every worker, and an even spacing with no burst, so a downstream provider
// sees at most N + 1 in any window of one period (a start late by less than
// one spacing keeps the schedule, and the next may follow it at once), not
// 2N across a window boundary as a fixed-window counter allows. What it
// costs: a limited job waits in its worker slot (a timer, no polling faster
// than its turn), and a start later than one spacing loses that time.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace jobguard::job {

struct RateLimit {
  // The job field whose value picks the budget (one budget per value), or
  // empty: one budget for every job of the lock class.
  std::string field{};
  std::int64_t count = 0;              // jobs...
  std::chrono::milliseconds per{0};    // ...per this period
  // The spacing between two starts: per / count.
  std::chrono::microseconds interval() const noexcept {
    return std::chrono::duration_cast<std::chrono::microseconds>(per) / count;
  }
};

// "FIELD=N/PERIOD" or "N/PERIOD"; PERIOD is s, sec, min, h, or a duration
// ("30s", "1m30s"). Throws Error(invalid_argument) naming what is wrong:
// a count of 0, a period of 0, a spacing under 1 microsecond.
RateLimit parse_rate(std::string_view text);

// The Redis key of a budget: "jobguard:rate:<class>" or
// "jobguard:rate:<field>=<value>" (shared across classes and streams: the
// provider's limit is the same whoever calls it).
std::string rate_key(const RateLimit& r, std::string_view lock_class, std::string_view value);

struct ConcurrencyLimit {
  std::string field{};  // the job field whose value picks the semaphore
  int count = 0;        // jobs of one value running at once, in [1, LockOptions::kMaxPermits]
};

// "FIELD=N". Throws Error(invalid_argument) naming what is wrong: no field,
// no '=', a count that is not a whole number or is outside [1, 10000].
ConcurrencyLimit parse_concurrency(std::string_view text);

// The semaphore resource of one value: "concurrency:<field>=<value>"
// (shared across classes and streams, as a rate budget is). Bytes a lock
// resource cannot hold (braces, whitespace, control characters) and '%' are
// written as %XX, so two values never share a resource by escaping; a value
// too long for a resource is cut at the limit, so values that share a long
// prefix share its permits (a stricter limit, never a looser one).
std::string concurrency_resource(const ConcurrencyLimit& c, std::string_view value);

}  // namespace jobguard::job
