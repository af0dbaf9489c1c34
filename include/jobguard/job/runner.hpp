// The guarded job runner: claim -> side effect -> record completion, with the
// guards picked from the lock class's consequence level (lock_class.hpp).
//
//   auto runner = job::GuardedRunner(leases, kInvoiceCharge, {.completions = &store});
//   auto r = runner.run({.id = "48291", .run_id = "2026-11"}, [&](job::JobContext& ctx) {
//     ctx.ensure();                                        // enough lock time left?
//     psp.charge(invoice, ctx.idempotency_key());          // the downstream dedupes on it
//     return std::string("ch_123");                        // stored in the completion record
//   });
//
// Per run, in order:
//  1. skip: a completion record for (class, resource, run_id) exists -> already_done,
//     logged as "skipped". Checked again once the lock is held (another worker
//     may have finished in between).
//  2. claim: the Redis lock (a renewing lease for long-running classes; fenced
//     for high). Busy -> busy. Redis unreachable -> the class's policy:
//     fail-closed returns redis_unavailable; fail-open logs "fail_open",
//     counts it and runs without the lock.
//  3. effect: moderate classes with an IdempotencyStore claim the idempotency
//     key first (a completed key returns its stored result without running the
//     effect again). A unit's first attempt in the one-call claim of a class
//     that is not long-running only checks that the key is missing and leaves
//     its write to the finish: its lease would end with the lock, which keeps
//     every other run out until then (docs/lock-safety.md). High classes run the effect inside a PostgreSQL
//     transaction holding an advisory lock on the resource; the completion
//     record is inserted in that same transaction, so the durable state change
//     and its proof commit together or not at all.
//  4. record: the completion record (per chunk, then for the unit), release.
//
// Chunked units (Unit::chunks > 0) run the effect once per chunk with a
// checkpoint (a completion record per chunk) after each: a retry after a crash
// resumes after the last completed chunk.
//
// What it does not protect against: an effect that is not idempotent, run
// by a fail-open low class while Redis is down, may repeat; a moderate effect
// whose downstream ignores the idempotency key may repeat after a lost lease.
// See docs/runner.md.
//
// Threads: run() may be called from many threads at once (not from the Redis
// client's event-loop thread: it blocks). async_run() is a coroutine on that
// event loop: many runs may be in flight there at once, with no thread each
// (job::StreamWorker runs jobs that way). The runner keeps one PostgreSQL
// connection per concurrent high-class run.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>

#include "jobguard/clock.hpp"
#include "jobguard/guard/postgres.hpp"
#include "jobguard/job/lock_class.hpp"

namespace jobguard {
class Error;
class Lock;
class LeaseScheduler;
struct LockOptions;
namespace guard {
class CompletionStore;
class IdempotencyStore;
}  // namespace guard
namespace observe {
class EventLog;
class Registry;
struct LockClassMetrics;
}
}  // namespace jobguard

namespace jobguard::job {

class ClaimPath;
struct Claim;
struct FinishCall;

struct RunnerBackends {
  // Completion records (phases 1 and 4) for low and moderate classes;
  // required for them. PgCompletionStore survives a Redis that loses data;
  // RedisCompletionStore does not. High classes keep theirs in PostgreSQL.
  guard::CompletionStore* completions = nullptr;
  // Moderate classes: the idempotency key is claimed here before the effect
  // and completed with its result after. Optional: without it the key is still
  // derived and handed to the effect for the downstream to honour.
  guard::IdempotencyStore* idempotency = nullptr;
  // High classes: required (run `jobguard pg migrate` first).
  std::optional<guard::PgOptions> postgres{};
  // Where the runner's events go (skipped, acquired, busy, fail_open,
  // completed, failed...); null = none.
  observe::EventLog* log = nullptr;
  // Goes into completion records' completed_by. Default "host/pid".
  std::string worker{};
  // Where the class's numbers are counted. Null (the default): the lock
  // service's registry (LockServiceOptions::metrics; by default the
  // process-wide one that `jobguard serve` and the fleet publisher read).
  observe::Registry* registry = nullptr;
  // The clock a plain lock's safe time and a run's elapsed time are read
  // from. Null (the default): the lock service's (LockServiceOptions::clock),
  // which is the one its grants' acquired_at() is on; another must agree with it.
  const MonotonicClock* clock = nullptr;
};

struct Unit {
  // The business object; fills "{id}" in the class's key pattern. Required.
  std::string id{};
  // Which run of the unit this is ("2026-11" for a monthly charge): a unit
  // completes once per run id. Required.
  std::string run_id{};
  // For logs and the lock token's readable prefix. Default: "<class>:<id>".
  std::string job_id{};
  // The request fingerprint for the idempotency store. Default: run_id.
  std::string fingerprint{};
  // > 0: the effect runs once per chunk 0..chunks-1, checkpointed after each.
  int chunks = 0;
};

enum class Outcome {
  completed,          // the effect ran (all chunks) and the completion was recorded
  already_done,       // a completion record existed: nothing ran
  busy,               // another worker holds the lock (or the idempotency key)
  redis_unavailable,  // fail-closed class and Redis unreachable: nothing ran
  postgres_unavailable,  // the PostgreSQL guard or record store unreachable: nothing recorded
  lease_lost,         // the lock was lost (or its time ran short) mid-job
  timed_out,          // the class's hard timeout stopped the job
  stale,              // the downstream rejected our fencing token
  failed,             // the effect threw, or the records could not be written
  in_doubt,           // the connection broke during the COMMIT of the effect and its
                      // record: it may or may not have committed; the record says
};
const char* to_string(Outcome o) noexcept;

struct RunResult {
  Outcome outcome = Outcome::failed;
  bool fail_open = false;     // ran without the Redis lock by the class's policy
  std::string detail{};       // one line: why (empty when completed)
  std::string result{};       // completed / already_done: the recorded result
  int chunks_run = 0;         // chunks whose effect ran in this call
  int chunks_skipped = 0;     // chunks a checkpoint showed done
  std::optional<std::int64_t> fence{};
  std::chrono::milliseconds elapsed{0};
  bool ok() const noexcept { return outcome == Outcome::completed || outcome == Outcome::already_done; }
};

// What the effect sees. Valid only during the effect call.
class JobContext {
 public:
  const LockClass& lock_class() const noexcept { return *cls_; }
  const Unit& unit() const noexcept { return *unit_; }
  const std::string& resource() const noexcept { return resource_; }
  // The Redis key of the lock; empty when running fail-open.
  const std::string& lock_key() const noexcept { return lock_key_; }
  // False: running fail-open, without the Redis lock.
  bool guarded() const noexcept { return guarded_; }
  std::optional<std::int64_t> fence() const noexcept { return fence_; }
  // A class with permits: this holder's slot in [0, permits) (Lock::permit_slot),
  // which no other live holder has. A downstream fences per slot, as it would
  // a mutex, with fence(): one high-water mark for the whole resource would
  // refuse the other holders' writes (docs/semaphore.md). nullopt otherwise.
  std::optional<int> permit_slot() const noexcept { return permit_slot_; }
  // A class with permits: the count the permit was granted under
  // (Lock::permits): the one stored with set_permits when there is one,
  // which may differ from the class's own. 0 otherwise.
  int permits() const noexcept { return permits_; }
  // The chunk being run; -1 for an unchunked unit.
  int chunk() const noexcept { return chunk_; }
  // "<class>/<resource>/<run_id>[/<chunk>]": stable across retries and
  // workers, derived without Redis. Pass it to the downstream.
  const std::string& idempotency_key() const noexcept { return idem_key_; }
  // A key per item inside the unit (one charge per subscription of a chunk).
  std::string idempotency_key(std::string_view item) const;
  // Lock time that is safe to count on; max() when running fail-open.
  std::chrono::milliseconds safe_time_left() const;
  // Throws Error(lease_lost) when less than `min_left` (default: the class's
  // min_time_left) is safely left, or the lease is already lost. Call it
  // before every side effect.
  void ensure(std::optional<std::chrono::milliseconds> min_left = std::nullopt) const;
  // Requested when the lease is lost or the hard timeout passes.
  std::stop_token stop_token() const noexcept { return stop_; }
  // High classes: the transaction the completion record commits in. Write
  // the durable state change through it (fenced_update with fence()).
  guard::PgTransaction* transaction() const noexcept { return tx_; }

 private:
  friend class GuardedRunner;
  JobContext() = default;
  const LockClass* cls_ = nullptr;
  const Unit* unit_ = nullptr;
  std::string resource_, lock_key_, idem_key_;
  bool guarded_ = false;
  std::optional<std::int64_t> fence_;
  std::optional<int> permit_slot_;
  int permits_ = 0;
  int chunk_ = -1;
  std::stop_token stop_;
  guard::PgTransaction* tx_ = nullptr;
  std::function<std::chrono::milliseconds()> time_left_;
};

// Returns the result to store with the completion record. Throwing
// Error(stale_fence) reports `stale`, Error(lease_lost) `lease_lost`; any other
// exception `failed` with its message. Nothing is recorded for a throwing effect.
using Effect = std::function<std::string(JobContext&)>;
// The same as a coroutine on the Redis client's event loop: it must not block
// (await instead). A supervised process (job::Supervisor) is one.
using AsyncEffect = std::function<boost::asio::awaitable<std::string>(JobContext&)>;

class GuardedRunner {
 public:
  // Throws Error(invalid_argument) for an invalid class or a backend the
  // class's consequence level needs and does not have.
  GuardedRunner(std::shared_ptr<LeaseScheduler> leases, LockClass cls, RunnerBackends backends);
  ~GuardedRunner();
  GuardedRunner(const GuardedRunner&) = delete;
  GuardedRunner& operator=(const GuardedRunner&) = delete;

  const LockClass& lock_class() const noexcept { return cls_; }
  // The scheduler its leases are renewed by (a StreamWorker's concurrency
  // permits are renewed by it too).
  const std::shared_ptr<LeaseScheduler>& leases() const noexcept { return leases_; }
  // Its class's numbers (RunnerBackends::registry's, or the service's):
  // a StreamWorker counts its limits' waits there.
  observe::LockClassMetrics& metrics() const noexcept { return *m_; }
  // The Redis key of the lock a run of unit `unit_id` takes.
  std::string lock_key_for(std::string_view unit_id) const;

  // Throws Error(invalid_argument) for a unit without id or run_id; every
  // other failure is a RunResult.
  RunResult run(const Unit& unit, const Effect& effect);

  // The same run as a coroutine on the event loop of the LeaseScheduler's
  // client (co_spawn it there, or co_await it from a coroutine running
  // there). The blocking parts — a blocking Effect, PostgreSQL statements,
  // a store without an asynchronous form — run on `blocking` (a thread pool
  // of the caller's) while the coroutine waits; Redis calls never block.
  // `blocking` may be empty only when there are none of those (an
  // AsyncEffect, Redis stores, a class below high); Error(invalid_argument)
  // otherwise, as for the arguments run() refuses.
  boost::asio::awaitable<RunResult> async_run(Unit unit, AsyncEffect effect,
                                              boost::asio::any_io_executor blocking = {});
  boost::asio::awaitable<RunResult> async_run(Unit unit, Effect effect, boost::asio::any_io_executor blocking);

  // Internal, for the library and the tests of the runner's decisions: every
  // call a run makes to the lock and the stores goes through `path`
  // (src/job/claim_path.hpp), which must outlive the runner; `backends`
  // then carries no store (the log, worker, registry and clock only).
  GuardedRunner(std::shared_ptr<LeaseScheduler> leases, LockClass cls, RunnerBackends backends, ClaimPath& path);

 private:
  struct Attempt;
  struct Body;
  Error bad(const std::string& what) const;
  void setup();
  LockOptions lock_options(const std::string& job_id) const;
  void check(const Unit& unit, bool has_effect) const;
  boost::asio::awaitable<RunResult> run_coro(Unit unit, Body body);
  void record_incidents(const Attempt& a, const RunResult& r);
  boost::asio::awaitable<std::optional<Claim>> claim(Attempt& a);
  void hold(Attempt& a, Lock lock);
  void already_done(const Attempt& a, RunResult& r, std::string result) const;
  boost::asio::awaitable<void> run_guarded(Attempt& a, RunResult& r);
  void init_context(const Attempt& a, int chunk, const std::string& run_id, JobContext& ctx) const;
  boost::asio::awaitable<bool> checkpoint_done(Attempt& a, int chunk, const std::string& run_id, RunResult& r);
  boost::asio::awaitable<std::string> run_effect(Attempt& a, JobContext& ctx, const FinishCall& f);
  boost::asio::awaitable<bool> run_step(Attempt& a, int chunk, RunResult& r);
  boost::asio::awaitable<std::optional<bool>> claim_idempotency(Attempt& a, JobContext& ctx, const std::string& run_id,
                                                                int chunk, RunResult& r, FinishCall& f);
  bool high_step(Attempt& a, JobContext& ctx, const std::string& run_id, int chunk, RunResult& r);
  void emit(const Attempt& a, std::string_view event, std::string_view outcome, std::string_view detail = {});

  std::shared_ptr<LeaseScheduler> leases_;
  LockClass cls_;
  RunnerBackends b_;
  observe::LockClassMetrics* m_ = nullptr;  // b_.registry's (or the service's) numbers of cls_
  const MonotonicClock* clock_ = nullptr;   // b_.clock or the service's
  std::unique_ptr<ClaimPath> own_path_;     // the path built from b_ (null: given one)
  ClaimPath* path_ = nullptr;               // every call to the lock and the stores
};

}  // namespace jobguard::job
