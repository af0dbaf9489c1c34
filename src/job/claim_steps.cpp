#include <fmt/format.h>

#include "job/awaiting.hpp"
#include "job/claim_path.hpp"
#include "jobguard/guard/completion.hpp"
#include "jobguard/lease.hpp"

namespace jobguard::job {
namespace {

namespace asio = boost::asio;
using asio::awaitable;
using detail::await_done;
using detail::on_blocking;

// A blocking call needs somewhere to run that is not the event loop.
void need_blocking(const asio::any_io_executor& ex, const ClaimCall& c, std::string_view what) {
  if (!ex)
    throw Error(errc::invalid_argument,
                fmt::format("lock class '{}': {} blocks; async_run needs a blocking executor for it", c.cls->name, what));
}

// A store call in its asynchronous form where the store has one, else its
// blocking form on the blocking executor.
template <class T, class Store, class Async, class Sync>
awaitable<T> store_call(Store& store, const ClaimCall& c, std::string_view what, Async async, Sync sync) {
  if (store.is_async()) co_return co_await await_done<T>(std::move(async));
  need_blocking(c.blocking, c, what);
  co_return co_await on_blocking(c.blocking, std::move(sync));
}

}  // namespace

bool redis_down(const Error& e) {
  // Decided by the error's source: a PostgreSQL statement timeout also asks
  // for a retry but is never a reason to fail open.
  return e.source() == error_source::redis && e.next() == next_step::retry_call;
}

std::string step_idempotency_key(const std::string& cls, const std::string& resource, const std::string& run_id) {
  // Appends, not fmt: once per guarded job, on the client's hot path.
  std::string k;
  k.reserve(cls.size() + resource.size() + run_id.size() + 2);
  k.append(cls).append(1, '/').append(resource).append(1, '/').append(run_id);
  return k;
}

StepClaimPath::StepClaimPath(LeaseScheduler& leases, guard::CompletionStore* completions,
                             guard::IdempotencyStore* idempotency, std::unique_ptr<DurableSteps> durable,
                             std::string worker)
    : leases_(leases),
      completions_(completions),
      idempotency_(idempotency),
      durable_(std::move(durable)),
      worker_(std::move(worker)) {}

StepClaimPath::~StepClaimPath() = default;

awaitable<Claim> StepClaimPath::claim(const ClaimCall& c) {
  // Phase 1 before the lock: a duplicate delivery of finished work costs one
  // read, not a lock round.
  std::optional<std::string> done;
  try {
    done = co_await find_done(c, c.run_id);
  } catch (const Error& e) {
    // Fail-open and the record store is down too: we cannot know; the
    // class declared that running is acceptable, and the grant decides.
    if (!redis_down(e) || !c.may_skip_unreadable_record) throw;
  }
  if (done) {
    Claim out;
    out.kind = Claim::Kind::done;
    out.result = std::move(*done);
    co_return out;
  }
  co_return co_await grant(c);
}

awaitable<Claim> StepClaimPath::grant(const ClaimCall& c) {
  auto lock = co_await await_done<std::optional<Lock>>([&](auto granted) {
    leases_.service().async_acquire(c.resource, c.lock,
                                    [granted = std::move(granted)](const Error& e, std::optional<Lock> l) {
                                      granted(e ? std::make_exception_ptr(e) : nullptr, std::move(l));
                                    });
  });
  Claim out;
  if (lock) {
    out.kind = Claim::Kind::granted;
    out.lock = std::move(lock);
  }
  co_return out;
}

awaitable<std::optional<std::string>> StepClaimPath::find_done(const ClaimCall& c, const std::string& run_id) {
  if (durable_) {
    need_blocking(c.blocking, c, "a PostgreSQL completion record");
    co_return co_await on_blocking(c.blocking, [&] { return durable_->find(c, run_id); });
  }
  auto rec = co_await store_call<std::optional<guard::CompletionRecord>>(
      *completions_, c, "the completion store",
      [&](auto done) { completions_->async_find(c.cls->name, c.resource, run_id, std::move(done)); },
      [&] { return completions_->find(c.cls->name, c.resource, run_id); });
  if (!rec) co_return std::nullopt;
  co_return std::move(rec->result);
}

awaitable<void> StepClaimPath::record(const ClaimCall& c, const std::string& run_id, const std::string& result) {
  if (durable_) {
    need_blocking(c.blocking, c, "a PostgreSQL completion record");
    co_await on_blocking(c.blocking, [&] { durable_->record(c, run_id, worker_, result); });
    co_return;
  }
  co_await store_call<guard::RecordOutcome>(
      *completions_, c, "the completion store",
      [&](auto done) { completions_->async_record(c.cls->name, c.resource, run_id, worker_, result, std::move(done)); },
      [&] { return completions_->record(c.cls->name, c.resource, run_id, worker_, result); });
}

awaitable<guard::BeginResult> StepClaimPath::begin_key(const ClaimCall& c, const std::string& key,
                                                       std::chrono::milliseconds lease, const std::string& owner) {
  co_return co_await store_call<guard::BeginResult>(
      *idempotency_, c, "the idempotency store",
      [&](auto done) { idempotency_->async_begin(key, c.fingerprint, lease, owner, std::move(done)); },
      [&] { return idempotency_->begin(key, c.fingerprint, lease, owner); });
}

awaitable<void> StepClaimPath::abandon_key(const ClaimCall& c, const std::string& key, const std::string& owner) {
  co_await store_call<bool>(
      *idempotency_, c, "the idempotency store",
      [&](auto done) { idempotency_->async_abandon(key, owner, std::move(done)); },
      [&] { return idempotency_->abandon(key, owner); });
}

awaitable<Error> StepClaimPath::finish(const ClaimCall& c, FinishCall& f) {
  if (f.key_ours && f.key_deferred) {
    // The deferred key (the one call failed or its reply was lost): claimed
    // now under our owner, unless the lost reply's finish completed it, or
    // another run has it; the complete below then tells which.
    co_await begin_key(c, f.key, c.cls->ttl, f.owner);
  }
  if (f.key_ours)
    co_await store_call<bool>(
        *idempotency_, c, "the idempotency store",
        [&](auto done) { idempotency_->async_complete(f.key, f.owner, f.result, std::move(done)); },
        [&] {
          idempotency_->complete(f.key, f.owner, f.result);
          return true;
        });
  try {
    co_await record(c, f.run_id, f.result);
  } catch (const Error& e) {
    co_return e;
  }
  co_return Error{};
}

awaitable<void> StepClaimPath::release(Lock& lock) {
  // A Redis gone after the work is no failure of the run: the lock frees
  // itself at its TTL.
  co_await await_done<bool>([&lock](auto done) {
    lock.async_release([done = std::move(done)](const Error&, bool ours) { done(nullptr, ours); });
  });
}

}  // namespace jobguard::job
