// The benchmarks behind `jobguard bench`, one call each: what the CLI's thin
// entry (cmd_bench.cpp) runs after it has checked the flags and found the
// server. Each returns a Report: the JSON object `--json` prints, the text
// printed without it, and warnings for stderr. Ratios against a baseline
// measured in the same run, not absolute numbers, are what is compared: the
// machines these run on are shared and noisy.
//
// Threads: every call blocks until its measurement is over; the clients it
// makes run their own event loops.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "jobguard/redis/options.hpp"

namespace jobguard::bench {

struct Report {
  nlohmann::json json;
  std::string text;
  std::vector<std::string> warnings;  // one line each, without a newline
};

// The default: W callers alternate raw_pair (SET NX PX + the release script,
// sent raw) and lock (the same pair through jobguard::Lock) phases for
// `rounds` rounds, then one raw SET phase; the ratio lock/raw_pair is the
// median of the rounds' ratios. Throws Error(redis_unavailable) when the
// client cannot connect.
struct ThroughputConfig {
  int workers = 64;
  double seconds = 3;          // per phase
  std::string mode = "coro";   // coro: coroutines on one event loop; threads: blocking threads
  int connections = 1;         // recorded in the report; the connection options carry it
  int rounds = 3;
  std::string only;            // "raw" or "lock"; empty: both
  bool fleet = true;           // publish the fleet numbers while measuring
};
Report throughput(const redis::ConnectionOptions& opts, const ThroughputConfig& cfg);

// W workers, each with its own connection, contend for ONE resource:
// acquire (waiting) -> hold -> release.
struct ContentionConfig {
  int workers = 8;
  std::chrono::duration<double> seconds{5};
  std::chrono::microseconds hold{1000};
  bool fair = false;
  std::string resource = "bench:contention";  // key jobguard:lock:{bench:contention}, as bench/peers/contention.js
};
Report contention(const redis::ConnectionOptions& opts, const ContentionConfig& cfg);

// W coroutine workers on one connection looping acquire -> release:
// `permits` of one permit of ONE semaphore of N permits; `shared` of a reader
// of ONE read-write lock against a mutex each, in `rounds` alternating rounds.
struct PairsConfig {
  int workers = 64;
  double seconds = 3;
  int rounds = 3;        // shared only
  std::string resource;  // the semaphore or read-write lock
  int permits = 0;       // permits only
};
Report permits(const redis::ConnectionOptions& opts, const PairsConfig& cfg);
Report shared(const redis::ConnectionOptions& opts, const PairsConfig& cfg);

// M guarded no-op jobs through job::StreamWorker at each concurrency, beside
// bare XREADGROUP + XACK in the same run.
struct JobsConfig {
  int jobs = 20000;
  std::vector<int> concurrency{1, 64};
  // Every guarded job enqueued unique (until-executed, one lock per job id,
  // released by the worker at the ack): the peer of BullMQ's deduplication.
  bool unique = false;
};
Report jobs(const redis::ConnectionOptions& opts, const JobsConfig& cfg);

// N live leases held by one LeaseScheduler for `hold`: renewals/s, this
// process's CPU and the server's, leases lost.
struct LeasesConfig {
  int leases = 100000;
  std::chrono::milliseconds ttl{30000};
  std::chrono::milliseconds hold{60000};
};
Report leases(const redis::ConnectionOptions& opts, const LeasesConfig& cfg);

// A server in the lost-lock-state quarantine refuses every grant for up to
// max_ttl: a benchmark would measure refusals. One try first; the
// quarantine's own error is thrown, anything else is left to the benchmark.
void refuse_quarantined(const redis::ConnectionOptions& opts);

}  // namespace jobguard::bench
