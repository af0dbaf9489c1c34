// The one-call Redis claim path: the claim (record check + grant + the
// unit's key) and the finish (key completed + record + release) as one
// script call each (scripts/claim.lua, scripts/finish.lua, composed in
// fused.cpp from the lock's and guard's pieces), sent in batches per
// event-loop turn (fused.hpp's ScriptBatcher). What one call cannot settle
// goes the step-by-step way, which every step of it allows: each is
// idempotent (a key completed twice, a record that exists, a lock already
// released), so a call that ran but whose reply was lost is finished, not
// repeated.
#include <fmt/format.h>

#include "job/awaiting.hpp"
#include "job/claim_path.hpp"
#include "job/fused.hpp"
#include "jobguard/detail/guard_scripts.hpp"
#include "jobguard/detail/lock_compose.hpp"
#include "jobguard/guard/completion.hpp"
#include "jobguard/job/runner.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::job {
namespace {

namespace asio = boost::asio;
using asio::awaitable;
using std::chrono::milliseconds;
using detail::await_done;

class OneCallClaimPath final : public ClaimPath {
 public:
  OneCallClaimPath(std::unique_ptr<StepClaimPath> steps, LeaseScheduler& leases, const MonotonicClock& clock,
                   const guard::scripts::RecordPiece& records, const guard::scripts::KeyPiece* keys,
                   std::string worker)
      : steps_(std::move(steps)),
        svc_(leases.service()),
        clock_(clock),
        records_(records),
        keys_(keys),
        worker_(std::move(worker)),
        claims_(std::make_shared<detail::ScriptBatcher>(svc_.client(), detail::claim_script(),
                                                       detail::claim_many_script())),
        finishes_(std::make_shared<detail::ScriptBatcher>(svc_.client(), detail::finish_script(),
                                                         detail::finish_many_script())) {}

  awaitable<Claim> claim(const ClaimCall& c) override;
  awaitable<Error> finish(const ClaimCall& c, FinishCall& f) override;
  awaitable<std::optional<std::string>> find_done(const ClaimCall& c, const std::string& run_id) override {
    return steps_->find_done(c, run_id);
  }
  awaitable<void> record(const ClaimCall& c, const std::string& run_id, const std::string& result) override {
    return steps_->record(c, run_id, result);
  }
  bool has_keys() const noexcept override { return keys_ != nullptr; }
  awaitable<guard::BeginResult> begin_key(const ClaimCall& c, const std::string& key, milliseconds lease,
                                          const std::string& owner) override {
    return steps_->begin_key(c, key, lease, owner);
  }
  awaitable<void> abandon_key(const ClaimCall& c, const std::string& key, const std::string& owner) override {
    return steps_->abandon_key(c, key, owner);
  }
  awaitable<void> release(Lock& lock) override { return steps_->release(lock); }
  DurableSteps* durable() noexcept override { return nullptr; }

 private:
  // What the one call settled; `fallback`: nothing, ask step by step.
  struct Attempt {
    enum Kind { granted, done, busy, fallback } kind = fallback;
    Claim claim;
  };
  awaitable<Attempt> one_call_claim(const ClaimCall& c);
  ::jobguard::detail::ComposedAttempt composed(const ClaimCall& c, const std::string& idem_key,
                                               const std::string& owner) const;
  awaitable<bool> one_call_finish(const ClaimCall& c, FinishCall& f);

  std::unique_ptr<StepClaimPath> steps_;
  LockService& svc_;
  const MonotonicClock& clock_;
  guard::scripts::RecordPiece records_;
  const guard::scripts::KeyPiece* keys_;  // null: the class has no key
  std::string worker_;
  // The claims and the finishes one event-loop turn makes, sent together.
  std::shared_ptr<detail::ScriptBatcher> claims_, finishes_;
};

// The one-call scripts take and release the mutex key: a semaphore's permit
// or a read-write lock's place goes the step-by-step way.
bool plain_lock(const LockOptions& lo) noexcept { return lo.permits == 0 && lo.mode == LockMode::mutex; }

awaitable<Claim> OneCallClaimPath::claim(const ClaimCall& c) {
  if (!c.whole_unit || !plain_lock(c.lock)) co_return co_await steps_->claim(c);
  auto a = co_await one_call_claim(c);
  if (a.kind == Attempt::fallback) co_return co_await steps_->claim(c);
  // Busy for a class that waits: the ordinary acquire waits (the record is
  // read again under the lock it gets).
  if (a.kind == Attempt::busy && c.cls->wait.count() > 0) co_return co_await steps_->grant(c);
  co_return std::move(a.claim);
}

awaitable<Error> OneCallClaimPath::finish(const ClaimCall& c, FinishCall& f) {
  if (f.whole_unit && plain_lock(c.lock) && f.lock && f.lock->held() && (f.key_ours || !keys_)) {
    const bool settled = co_await one_call_finish(c, f);
    if (settled) co_return Error{};
  }
  co_return co_await steps_->finish(c, f);
}

::jobguard::detail::ComposedAttempt OneCallClaimPath::composed(const ClaimCall& c, const std::string& idem_key,
                                                               const std::string& owner) const {
  const LockClass& cls = *c.cls;
  ::jobguard::detail::ComposedAttempt out;
  out.script = &detail::claim_script();
  out.eval = [b = claims_](std::vector<std::string> k, std::vector<std::string> v, redis::Completion d,
                           redis::CallOptions o) { b->async_eval(std::move(k), std::move(v), std::move(d), o); };
  out.keys.push_back(records_.store->key_for(cls.name, c.resource, c.run_id));
  if (keys_) {
    const auto lease = cls.long_running ? cls.hard_timeout : cls.ttl;
    out.keys.push_back(keys_->store->key_for(idem_key));
    // A lease that is the lock's TTL from the grant ends with the lock:
    // the key's write can wait for the finish (claim.lua). A long-running
    // class's key outlives a lost lease by its hard timeout: written now.
    out.args = {c.fingerprint, owner, std::to_string(lease.count()), keys_->retention_ms,
                cls.long_running ? "" : "defer"};
  }
  // A unit's first run, the common claim, needs no script where the grant
  // is a bare SET NX PX: the grant, then "neither the record nor the key
  // exists" (lock_compose.hpp, the plain form). A long-running class's key
  // is written at the claim: the script.
  if (!keys_ || !cls.long_running) {
    out.plain_checks = out.keys;
    if (keys_) out.plain_part = "deferred";
  }
  return out;
}

// One call: the record checked, the lock granted, the key claimed
// (scripts/claim.lua). Never throws: what it cannot settle is `fallback`,
// and the step-by-step path then decides (a Redis error, the fail-open
// policy, a waiting acquire) as it always has.
awaitable<OneCallClaimPath::Attempt> OneCallClaimPath::one_call_claim(const ClaimCall& c) {
  Attempt out;
  ::jobguard::detail::ComposedResult res;
  // The key run_step would claim for the whole unit (chunk -1).
  const std::string idem_key = keys_ ? step_idempotency_key(c.cls->name, c.resource, c.run_id) : std::string();
  const std::string owner = keys_ ? guard::make_owner_token() : std::string();
  std::optional<guard::BeginResult> begin;
  try {
    res = co_await await_done<::jobguard::detail::ComposedResult>([&](auto done) {
      ::jobguard::detail::async_attempt_composed(
          svc_, c.resource, c.lock, composed(c, idem_key, owner),
          [done = std::move(done)](const Error& e, ::jobguard::detail::ComposedResult r) {
            done(e ? std::make_exception_ptr(e) : nullptr, std::move(r));
          });
    });
    using S = ::jobguard::detail::ComposedStatus;
    if (res.status == S::declined) {
      out.kind = Attempt::done;
      out.claim.kind = Claim::Kind::done;
      out.claim.result = res.part.str;
      co_return out;
    }
    if (res.status == S::busy) {
      out.kind = Attempt::busy;
      co_return out;
    }
    const bool deferred = keys_ && res.part.is_string() && res.part.str == "deferred";
    if (deferred) begin = guard::BeginResult{.status = guard::BeginStatus::claimed, .owner = owner};
    else if (keys_ && !res.part.is_nil()) begin = guard::RedisIdempotencyStore::parse_begin_reply(res.part);
    if (res.status == S::granted) {
      out.kind = Attempt::granted;
      out.claim.kind = Claim::Kind::granted;
      out.claim.lock = std::move(res.lock);
      out.claim.record_checked = true;
      if (begin && begin->status == guard::BeginStatus::claimed) out.claim.key = KeyClaim{owner, deferred};
      co_return out;
    }
    // A grant handed back (an unchecked connection): the key it claimed for
    // us is dropped too, so the step-by-step claim does not find it in progress.
    if (begin && begin->status == guard::BeginStatus::claimed && !deferred)
      keys_->store->async_abandon(idem_key, owner, [](std::exception_ptr, bool) {});
  } catch (const std::exception&) {
    // In doubt or refused: the step-by-step path asks again and reports.
  }
  co_return Attempt{};
}

// One call: the key completed, the record written, the lock released
// (scripts/finish.lua). False when it did not settle all three; the caller
// then makes the steps one by one.
awaitable<bool> OneCallClaimPath::one_call_finish(const ClaimCall& c, FinishCall& f) {
  Lock& lock = *f.lock;
  const LockClass& cls = *c.cls;
  std::vector<std::string> keys{records_.store->key_for(cls.name, c.resource, f.run_id), lock.key(),
                                svc_.keys().waiters_key(c.resource)};
  if (f.key_ours) keys.push_back(keys_->store->key_for(f.key));
  std::vector<std::string> args{lock.token(),
                                svc_.keys().channel(c.resource),
                                worker_,
                                f.result,
                                records_.retention_ms,
                                f.owner,
                                keys_ ? keys_->retention_ms : std::string(),
                                svc_.client().options().cluster ? "1" : ""};
  const bool deferred = f.key_ours && f.key_deferred;
  if (deferred) {
    const auto held_for = std::chrono::duration_cast<milliseconds>(clock_.now() - lock.acquired_at());
    args.insert(args.end(), {"deferred", c.fingerprint, std::to_string(std::max<std::int64_t>(0, held_for.count())),
                             std::to_string(cls.ttl.count())});
  }
  redis::Reply reply;
  try {
    reply = co_await await_done<redis::Reply>([&](auto done) {
      finishes_->async_eval(std::move(keys), std::move(args), [done = std::move(done)](std::error_code ec, redis::Reply r) {
        done(ec ? std::make_exception_ptr(Error(ec, "finish")) : nullptr, std::move(r));
      });
    });
  } catch (const std::exception&) {
    co_return false;
  }
  const bool shaped = reply.is_array() && reply.elements.size() == 3 && reply.elements[0].is_integer();
  if (!shaped) co_return false;
  const bool released = reply.elements[2].is_integer() && reply.elements[2].integer == 1;
  if (deferred && reply.elements[0].integer == 0) {
    // The key is another run's (or the lock is): our lock released if it
    // was still ours, nothing written; reported as the steps would.
    lock.released_by_script(released);
    guard::RedisIdempotencyStore::check_complete_reply(reply.elements[1], f.key, f.owner);
    co_return false;  // not reached: the reply above is a refusal
  }
  if (reply.elements[0].integer != 1) co_return false;
  lock.released_by_script(released);
  co_return true;
}

}  // namespace

std::unique_ptr<ClaimPath> make_claim_path(LeaseScheduler& leases, const LockClass& cls, const RunnerBackends& b) {
  auto steps = std::make_unique<StepClaimPath>(leases, b.completions, b.idempotency,
                                               cls.consequence == Consequence::high ? make_pg_steps(b) : nullptr,
                                               b.worker);
  // The one call needs the class's records and keys in Redis stores on the
  // lock's own client (one server, one script; on a Redis Cluster the
  // record's and the key's slots are not the lock's), and the low or
  // moderate row (the runner never asks for fair locks; a fair one would go
  // the waiter's way).
  const auto* records = b.completions ? b.completions->script_piece() : nullptr;
  const auto* keys = b.idempotency ? b.idempotency->script_piece() : nullptr;
  redis::Client* lock_client = &leases.service().client();
  if (cls.consequence == Consequence::high || !records || records->client != lock_client ||
      lock_client->options().cluster || (b.idempotency && (!keys || keys->client != lock_client)))
    return steps;
  const MonotonicClock& clock = b.clock ? *b.clock : leases.service().clock();
  return std::make_unique<OneCallClaimPath>(std::move(steps), leases, clock, *records, keys, b.worker);
}

}  // namespace jobguard::job
