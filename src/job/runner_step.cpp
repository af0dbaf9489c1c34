// GuardedRunner's phases 3 and 4 for one step (a chunk, or the whole unit):
// the idempotency key's claim, the effect, and the step's finish.
#include <fmt/format.h>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>

#include "job/awaiting.hpp"
#include "job/claim_path.hpp"
#include "job/runner_attempt.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lease.hpp"

namespace jobguard::job {
namespace {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using std::chrono::milliseconds;
using detail::on_blocking;

std::string step_run_id(const std::string& run_id, int chunk) {
  return chunk < 0 ? run_id : fmt::format("{}#chunk-{}", run_id, chunk);
}

}  // namespace

void GuardedRunner::init_context(const Attempt& a, int chunk, const std::string& run_id, JobContext& ctx) const {
  ctx.cls_ = &cls_;
  ctx.unit_ = a.unit;
  ctx.resource_ = a.call.resource;
  ctx.lock_key_ = a.lock_key();
  ctx.guarded_ = !a.fail_open;
  ctx.chunk_ = chunk;
  ctx.idem_key_ = step_idempotency_key(cls_.name, a.call.resource, run_id);
  if (a.lease) {
    ctx.fence_ = a.lease->fence();
    if (a.lease->lock_count() == 1 && a.lease->lock_at(0).permits() > 0) {
      ctx.permit_slot_ = a.lease->lock_at(0).permit_slot();
      ctx.permits_ = a.lease->lock_at(0).permits();
    }
    ctx.stop_ = a.lease->stop_token();
    const Lease* lease = &*a.lease;
    ctx.time_left_ = [lease] { return lease->safe_time_left(); };
  } else if (a.lock) {
    ctx.fence_ = a.lock->fence();
    if (a.lock->permits() > 0) {
      ctx.permit_slot_ = a.lock->permit_slot();
      ctx.permits_ = a.lock->permits();
    }
    // A plain lock's time is its TTL from the grant, less the same drift
    // allowance a lease takes (the server's clock may run faster than ours).
    const auto expires = a.lock->acquired_at() + a.lock->ttl() - a.lock->ttl() / 100 - milliseconds(2);
    ctx.time_left_ = [expires, clock = clock_] {
      return std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(expires - clock->now()));
    };
  }
}

// The checkpoint: a chunk recorded by an earlier, crashed attempt. True:
// the chunk is done, skip it.
awaitable<bool> GuardedRunner::checkpoint_done(Attempt& a, int chunk, const std::string& run_id, RunResult& r) {
  std::optional<std::string> done;
  try {
    done = co_await path_->find_done(a.call, run_id);
  } catch (const Error& e) {
    if (!a.fail_open) throw;
    emit(a, "record_unreadable", "error", e.what());
  }
  if (!done) co_return false;
  ++r.chunks_skipped;
  emit(a, "skipped", "checkpoint", fmt::format("chunk {} of {} completed earlier", chunk, a.unit->chunks));
  co_return true;
}

// The effect; a failed one frees the step's key at once (so a retry does not
// wait out the claim) and is rethrown. The downstream still sees the same
// key on the retry, which is what protects a half-done effect.
awaitable<std::string> GuardedRunner::run_effect(Attempt& a, JobContext& ctx, const FinishCall& f) {
  std::exception_ptr effect_failed;
  try {
    if (a.body->async) co_return co_await a.body->async(ctx);
    co_return co_await on_blocking(a.body->blocking, [&] { return a.body->sync(ctx); });
  } catch (...) {
    effect_failed = std::current_exception();
  }
  if (f.key_ours && !f.key_deferred) {  // a deferred key was never written
    try {
      co_await path_->abandon_key(a.call, f.key, f.owner);
    } catch (const Error&) {
    }
  }
  std::rethrow_exception(effect_failed);
}

// One effect call (a chunk, or the whole unit) and its completion record.
// False when the run must stop; r.outcome then says why.
awaitable<bool> GuardedRunner::run_step(Attempt& a, int chunk, RunResult& r) {
  const std::string run_id = step_run_id(a.unit->run_id, chunk);
  JobContext ctx;
  init_context(a, chunk, run_id, ctx);
  if (chunk >= 0 && cls_.consequence != Consequence::high) {
    const bool done = co_await checkpoint_done(a, chunk, run_id, r);
    if (done) co_return true;
  }
  if (ctx.guarded_) ctx.ensure();  // a lost lease stops the unit before the next chunk starts
  if (cls_.consequence == Consequence::high)
    co_return co_await on_blocking(a.body->blocking, [&] { return high_step(a, ctx, run_id, chunk, r); });

  // Low and moderate.
  FinishCall f;
  f.run_id = run_id;
  f.whole_unit = chunk < 0;
  f.key = ctx.idem_key_;
  if (chunk < 0 && a.key) {
    f.owner = a.key->owner;
    f.key_ours = true;
    f.key_deferred = a.key->deferred;
  } else if (path_->has_keys()) {
    if (auto stop_here = co_await claim_idempotency(a, ctx, run_id, chunk, r, f)) co_return *stop_here;
  }
  f.result = co_await run_effect(a, ctx, f);
  if (ctx.guarded_ && ctx.safe_time_left().count() <= 0) {
    // The effect finished, but past the time the lock was certainly ours:
    // another worker may have run it too. The record is still written (it
    // states a fact, and stops a third run); the overrun is said loudly.
    emit(a, "overran_lock", "warning",
         fmt::format("the effect of {} ended after its lock's safe time: another worker may have run it too", run_id));
    if (r.detail.empty()) r.detail = fmt::format("{}: the effect outlived its lock", run_id);
  }
  // The key completed, the record written, and where the path can, the lock
  // released with them.
  f.lock = a.lock && a.lock->held() && !a.fail_open ? &*a.lock : nullptr;
  if (const Error e = co_await path_->finish(a.call, f)) {
    if (!a.fail_open)
      throw Error(e.code(), fmt::format("the effect of {} ran but its completion was not recorded: {}", run_id, e.what()),
                  e.source());
    emit(a, "record_failed", "error", e.what());
  }
  if (chunk >= 0) {
    ++r.chunks_run;
    emit(a, "checkpoint", "ok", fmt::format("chunk {} of {}", chunk, a.unit->chunks));
  }
  r.result = std::move(f.result);
  co_return true;
}


// The moderate row's idempotency key, claimed before the effect. nullopt:
// go on to the effect (`f.key_ours`: the key is ours, `f.owner` its token; false
// when a fail-open run could not reach the store). A value: the step ends
// here and run_step returns it.
awaitable<std::optional<bool>> GuardedRunner::claim_idempotency(Attempt& a, JobContext& ctx, const std::string& run_id,
                                                                int chunk, RunResult& r, FinishCall& f) {
  const auto lease = cls_.long_running ? cls_.hard_timeout : cls_.ttl;
  try {
    for (int round = 0;; ++round) {
      auto b = co_await path_->begin_key(a.call, ctx.idem_key_, lease, {});
      if (b.status == guard::BeginStatus::claimed) {
        f.owner = b.owner;
        f.key_ours = true;
        co_return std::nullopt;
      }
      if (b.status == guard::BeginStatus::completed) {
        // The effect ran and its key completed, but the completion record
        // was not written (a crash between the two): record it now.
        r.result = b.result;
        co_await path_->record(a.call, run_id, r.result);
        if (chunk >= 0) ++r.chunks_skipped;
        emit(a, "skipped", "idempotency_completed", ctx.idem_key_);
        if (chunk < 0) {
          r.outcome = Outcome::already_done;
          r.detail = fmt::format("idempotency key {} completed earlier", ctx.idem_key_);
          co_return false;
        }
        co_return true;
      }
      if (b.status == guard::BeginStatus::in_progress) {
        // We hold the unit's lock, so the claim's owner lost its lock or
        // died; a crashed worker's claim passes about when its lock
        // expired, i.e. just about now. Waiting for it once (within our own
        // lock time) beats answering busy: every busy answer costs the job
        // a delivery, and enough of them dead-letter it.
        const auto room = ctx.guarded_ ? ctx.safe_time_left() - cls_.effective_min_time_left() : cls_.wait;
        const auto nap = b.lease_left + milliseconds(20);
        if (round == 0 && nap <= room) {
          emit(a, "idempotency_wait", "in_progress",
               fmt::format("key {} held by {} for {} ms more", ctx.idem_key_, b.owner, b.lease_left.count()));
          asio::steady_timer t(co_await asio::this_coro::executor, nap);
          co_await t.async_wait(use_awaitable);
          if (ctx.guarded_) ctx.ensure();
          continue;
        }
        throw StepVerdict{Outcome::busy,
                          fmt::format("idempotency key {} is in progress by {} for {} ms more", ctx.idem_key_,
                                      b.owner, b.lease_left.count()),
                          {}};
      }
      throw StepVerdict{Outcome::failed,
                        fmt::format("idempotency key {} was used for a different request (fingerprint {})",
                                    ctx.idem_key_, b.stored_fingerprint),
                        {}};
    }
  } catch (const Error& e) {
    if (!a.fail_open || !redis_down(e)) throw;
    f.key_ours = false;  // fail-open: the downstream still gets the key
    emit(a, "idempotency_unavailable", "error", e.what());
  }
  co_return std::nullopt;
}

// The high row's step, on the blocking executor: the effect inside the
// durable store's transaction, which holds the durable guard on the resource
// and commits the completion record. False when the run must stop.
bool GuardedRunner::high_step(Attempt& a, JobContext& ctx, const std::string& run_id, int chunk, RunResult& r) {
  auto step = path_->durable()->transact(a.call, run_id, b_.worker, [&](guard::PgTransaction& tx) {
    ctx.tx_ = &tx;
    auto result = a.body->sync(ctx);
    ctx.tx_ = nullptr;
    return result;
  });
  using K = DurableSteps::Step::Kind;
  if (step.kind == K::busy) throw StepVerdict{Outcome::busy, std::move(step.detail), {}};
  if (step.kind == K::done) {
    if (chunk < 0) {
      already_done(a, r, std::move(step.result));
      return false;
    }
    ++r.chunks_skipped;
    emit(a, "skipped", "checkpoint", fmt::format("chunk {} of {} completed earlier", chunk, a.unit->chunks));
    return true;
  }
  r.result = std::move(step.result);
  if (chunk >= 0) ++r.chunks_run;
  return true;
}

}  // namespace jobguard::job
