// The billing scenario of `jobguard demo` as a library call: N subscriptions charged
// in chunks by W workers that take jobs from a Redis Stream, once guarded
// (lease-renewed fenced lock per chunk, idempotency key per charge,
// completion record per chunk) and once naive (plain lock with a fixed TTL,
// nothing else), side by side on one Redis with the same injected faults:
// a worker killed after charging but before acknowledging, a worker paused
// past its TTL between a charge and its ledger write, and a Redis restart
// without persistence. A stand-in billing provider in this process is the
// ground truth for double charges, missed subscriptions and stale writes.
//
// Threads: run_billing_demo blocks the caller for the whole run and starts
// its own worker threads; `progress` is called on the calling thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace jobguard {
class EmbeddedRedis;
}
namespace jobguard::guard {
class CompletionStore;
}

namespace jobguard::job {

struct BillingDemoOptions {
  // Where the streams and locks live; required.
  std::string redis_url{};
  // When set, the Redis restart fault restarts this server (no persistence)
  // mid-run. Null (an external Redis): the restart fault is skipped.
  EmbeddedRedis* restartable = nullptr;
  // When set, the guarded run's completion records go to this store (a
  // guard::PgCompletionStore, durable, what a team would run); it must
  // outlive the call. Null: an in-process store standing in for it.
  guard::CompletionStore* completions = nullptr;
  // Subscriptions to charge. Default 120,000; must be >= 1.
  int subscriptions = 120000;
  // Worker threads per run. Default 8; must be in [1, 256].
  int workers = 8;
  // Multiplies every charge time (200 ms average, the slowest 1% 8 s).
  // Default 0.01; must be in (0, 10].
  double scale = 0.01;
  // Subscriptions per job (one stream entry, one lock, one completion record). Default 100.
  int chunk = 100;
  // Lock class of the guarded run; the naive run uses "<lock_class>-naive".
  std::string lock_class = "billing";
  // Gives up (and reports what is missing) after this long. Default 0 = 10 x ideal + 60 s.
  std::chrono::milliseconds give_up{0};
  // Called about 5 times a second with the completed fraction of each run.
  std::function<void(double guarded, double naive)> progress{};
};

struct BillingRunResult {
  std::int64_t double_charges = 0;         // charges beyond the first, summed over subscriptions
  std::int64_t missing = 0;                // subscriptions never charged or never in the ledger
  std::int64_t stale_writes_rejected = 0;  // ledger writes refused for an older fencing token
  std::int64_t stale_writes_accepted = 0;  // ledger writes after a newer holder's write, let through
  std::int64_t charges = 0;                // charges the provider performed
  std::int64_t idempotent_replays = 0;     // charges answered from an idempotency key
  std::int64_t chunks_reclaimed = 0;       // jobs taken over with XAUTOCLAIM
  std::int64_t chunks_skipped = 0;         // deliveries skipped because a completion record existed
  std::int64_t attempts_abandoned = 0;     // attempts stopped by a lost lease or a rejected write
  std::int64_t dead_lettered = 0;
  double makespan_s = 0;
  double ideal_makespan_s = 0;             // total charge time / workers
};

struct BillingDemoResult {
  BillingRunResult guarded{}, naive{};
  int subscriptions = 0, workers = 0, chunk = 0;
  double scale = 0;
  bool redis_restarted = false;
  // From the observe Registry, the guarded run's lock class (deltas over this run).
  std::uint64_t acquisitions = 0;
  std::uint64_t contention = 0;    // busy answers
  double p99_hold_s = 0;
  std::uint64_t leases_lost = 0;
  std::uint64_t renewals = 0;
  std::uint64_t redis_errors = 0;
};

// Throws Error(invalid_argument) naming a bad option, Error(redis...) when
// Redis cannot be reached at the start.
BillingDemoResult run_billing_demo(const BillingDemoOptions& options);

}  // namespace jobguard::job
