// Private to src/job: the guarded runner's claim path, everything it asks of
// the lock and the stores around one run (GuardedRunner decides what to do
// with the answers; the path only asks).
//
//   claim   phases 1 and 2: the completion record checked, the lock granted,
//           and where the path can, the unit's idempotency key claimed;
//   finish  phase 4: the key completed, the record written, and where the
//           path can, the lock released in the same call;
//   and the single steps the runner's decisions need in between (a chunk's
//   checkpoint, a key's claim or abandon, a record on its own, a release).
//
// Two implementations: StepClaimPath makes each step its own call on any
// stores (a CompletionStore, an IdempotencyStore, the lock service; the high
// row's DurableSteps); the one-call Redis path (make_claim_path) makes the
// claim and the finish one script call each where the stores lend their
// script pieces (guard::scripts::RecordPiece / KeyPiece) on the lock's own
// server, and goes the step-by-step way for what that call cannot settle.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "jobguard/error.hpp"
#include "jobguard/guard/idempotency.hpp"
#include "jobguard/job/lock_class.hpp"
#include "jobguard/lock.hpp"

namespace jobguard {
class LeaseScheduler;
namespace guard {
class CompletionStore;
class PgTransaction;
}  // namespace guard
}  // namespace jobguard

namespace jobguard::job {

struct RunnerBackends;

// One run as the path sees it; lives as long as the run.
struct ClaimCall {
  const LockClass* cls = nullptr;
  std::string resource, run_id, fingerprint, job_id;  // run_id: the unit's
  LockOptions lock;
  // Unchunked: the unit's key may be claimed with the lock (the key run_step
  // would claim for chunk -1).
  bool whole_unit = false;
  // A fail-open class: a record store that cannot be reached before the
  // grant is not a reason to stop (the grant decides).
  bool may_skip_unreadable_record = false;
  boost::asio::any_io_executor blocking;  // where blocking store calls run
};

// The unit's idempotency key, claimed with the lock under `owner`.
struct KeyClaim {
  std::string owner;
  bool deferred = false;  // not written: the finish writes it, completed
};

struct Claim {
  enum class Kind { done, busy, granted };
  Kind kind = Kind::busy;
  std::string result;              // done: the recorded result
  std::optional<Lock> lock;        // granted
  std::optional<KeyClaim> key;     // granted with the unit's key ours
  bool record_checked = false;     // granted: the record was read with the grant, atomically
};

// One step's phase 4.
struct FinishCall {
  std::string run_id;       // the step's (a chunk's carries "#chunk-N")
  bool whole_unit = false;  // chunk -1
  std::string key;          // the step's idempotency key (without the store's prefix)
  std::string owner;        // ours, when key_ours
  bool key_ours = false;
  bool key_deferred = false;  // claimed with the lock but not written
  std::string result;
  Lock* lock = nullptr;  // the plain lock still held (null: a lease, or fail-open); the path may release it
};

// The high row: the record in the durable store, the effect inside its
// transaction, which holds the durable guard on the resource.
class DurableSteps {
 public:
  virtual ~DurableSteps() = default;
  // Blocking; not on the event loop.
  virtual std::optional<std::string> find(const ClaimCall& c, const std::string& run_id) = 0;
  virtual void record(const ClaimCall& c, const std::string& run_id, const std::string& worker,
                      const std::string& result) = 0;
  struct Step {
    enum class Kind { ran, done, busy } kind = Kind::ran;
    std::string result;  // ran: the effect's; done: the record's
    std::string detail;  // busy: why
  };
  // `effect` runs inside the transaction; the record commits with its writes.
  virtual Step transact(const ClaimCall& c, const std::string& run_id, const std::string& worker,
                        const std::function<std::string(guard::PgTransaction&)>& effect) = 0;
};

class ClaimPath {
 public:
  virtual ~ClaimPath() = default;

  // Phases 1 and 2. busy: the lock stayed busy for the class's wait. Throws
  // the lock's or the record store's Error (the runner applies the class's
  // Redis policy to it).
  virtual boost::asio::awaitable<Claim> claim(const ClaimCall& c) = 0;
  // Phase 4 of a step. The key's failures are thrown; a record that could not
  // be written is returned (the key is completed by then): whether that
  // stops the run is the runner's decision.
  virtual boost::asio::awaitable<Error> finish(const ClaimCall& c, FinishCall& f) = 0;

  virtual boost::asio::awaitable<std::optional<std::string>> find_done(const ClaimCall& c,
                                                                       const std::string& run_id) = 0;
  virtual boost::asio::awaitable<void> record(const ClaimCall& c, const std::string& run_id,
                                              const std::string& result) = 0;
  // The class keeps idempotency keys (the moderate row's guard).
  virtual bool has_keys() const noexcept = 0;
  // `owner` empty: a fresh one.
  virtual boost::asio::awaitable<guard::BeginResult> begin_key(const ClaimCall& c, const std::string& key,
                                                               std::chrono::milliseconds lease,
                                                               const std::string& owner) = 0;
  virtual boost::asio::awaitable<void> abandon_key(const ClaimCall& c, const std::string& key,
                                                   const std::string& owner) = 0;
  // The plain lock's release at the run's end (a lease releases itself).
  virtual boost::asio::awaitable<void> release(Lock& lock) = 0;
  // The high row's steps; null for the others.
  virtual DurableSteps* durable() noexcept = 0;
};

// Each step its own call. Stores may be null where the class has none
// (`durable` for high classes instead of `completions`). Not owned.
class StepClaimPath final : public ClaimPath {
 public:
  StepClaimPath(LeaseScheduler& leases, guard::CompletionStore* completions, guard::IdempotencyStore* idempotency,
                std::unique_ptr<DurableSteps> durable, std::string worker);
  ~StepClaimPath() override;

  boost::asio::awaitable<Claim> claim(const ClaimCall& c) override;
  // The grant alone (the record not read first).
  boost::asio::awaitable<Claim> grant(const ClaimCall& c);
  boost::asio::awaitable<Error> finish(const ClaimCall& c, FinishCall& f) override;
  boost::asio::awaitable<std::optional<std::string>> find_done(const ClaimCall& c, const std::string& run_id) override;
  boost::asio::awaitable<void> record(const ClaimCall& c, const std::string& run_id, const std::string& result) override;
  bool has_keys() const noexcept override { return idempotency_ != nullptr; }
  boost::asio::awaitable<guard::BeginResult> begin_key(const ClaimCall& c, const std::string& key,
                                                       std::chrono::milliseconds lease,
                                                       const std::string& owner) override;
  boost::asio::awaitable<void> abandon_key(const ClaimCall& c, const std::string& key,
                                           const std::string& owner) override;
  boost::asio::awaitable<void> release(Lock& lock) override;
  DurableSteps* durable() noexcept override { return durable_.get(); }

 private:
  LeaseScheduler& leases_;
  guard::CompletionStore* completions_;
  guard::IdempotencyStore* idempotency_;
  std::unique_ptr<DurableSteps> durable_;
  std::string worker_;
};

// Redis could not serve us (as opposed to refusing what we asked): the only
// errors a class's fail-open policy applies to.
bool redis_down(const Error& e);

// The runner's path for `b` (checked against the class's row, its worker
// set): the one-call path where the class's records and keys lend their
// pieces on the lock's own server, else StepClaimPath.
std::unique_ptr<ClaimPath> make_claim_path(LeaseScheduler& leases, const LockClass& cls, const RunnerBackends& b);

// The blocking PostgreSQL steps of the high row (durable_pg.cpp); where
// jobguard is built without PostgreSQL, Error(invalid_argument).
std::unique_ptr<DurableSteps> make_pg_steps(const RunnerBackends& b);

// The idempotency key of one step: the same for the one-call claim and
// finish as for the step-by-step path (JobContext::idempotency_key()).
std::string step_idempotency_key(const std::string& cls, const std::string& resource, const std::string& run_id);

}  // namespace jobguard::job
