#include "jobguard/job/runner.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <limits>

#include "jobguard/admin.hpp"
#include "jobguard/error.hpp"
#include "jobguard/guard/completion.hpp"
#include "jobguard/guard/idempotency.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/event_log.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/redis/client.hpp"
#include "job/awaiting.hpp"
#include "job/fused.hpp"
#include "jobguard/detail/lock_compose.hpp"

namespace jobguard::job {
namespace {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using std::chrono::milliseconds;
using detail::await_done;
using detail::on_blocking;

// Redis could not serve us (as opposed to refusing what we asked): the only
// errors a class's fail-open policy applies to. Decided by the error's
// source: a PostgreSQL statement timeout also asks for a retry but is never
// a reason to fail open.
bool redis_down(const Error& e) {
  return e.source() == error_source::redis && e.next() == next_step::retry_call;
}

bool postgres_down(const Error& e) {
  return e.code() == make_error_code(errc::postgres_unavailable) ||
         (e.source() == error_source::postgres && e.next() == next_step::retry_call);
}

Outcome classify(const Error& e) {
  if (e.code() == make_error_code(errc::in_doubt)) return Outcome::in_doubt;
  if (postgres_down(e)) return Outcome::postgres_unavailable;
  if (redis_down(e)) return Outcome::redis_unavailable;
  if (e.code() == make_error_code(errc::lease_lost)) return Outcome::lease_lost;
  if (e.code() == make_error_code(errc::stale_fence)) return Outcome::stale;
  return Outcome::failed;
}

std::string default_worker() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return fmt::format("{}/{}", host[0] ? host : "unknown-host", ::getpid());
}

// The idempotency key of one step: the same for the one-call claim and
// finish as for the step-by-step path (JobContext::idempotency_key()).
std::string step_idempotency_key(const std::string& cls, const std::string& resource, const std::string& run_id) {
  // Appends, not fmt: once per guarded job, on the client's hot path.
  std::string k;
  k.reserve(cls.size() + resource.size() + run_id.size() + 2);
  k.append(cls).append(1, '/').append(resource).append(1, '/').append(run_id);
  return k;
}

std::string step_run_id(const std::string& run_id, int chunk) {
  return chunk < 0 ? run_id : fmt::format("{}#chunk-{}", run_id, chunk);
}

// Thrown inside a high-class transaction to roll it back with a verdict that
// is not an error of the effect.
struct StepVerdict {
  Outcome outcome;
  std::string detail;
  std::string result;
};

constexpr std::string_view kSelectDone =
    "SELECT result FROM jobguard_completions WHERE job_kind = $1 AND entity = $2 AND run_id = $3";
constexpr std::string_view kInsertDone =
    "INSERT INTO jobguard_completions (job_kind, entity, run_id, completed_by, result) VALUES ($1, $2, $3, $4, $5)";

}  // namespace

const char* to_string(Outcome o) noexcept {
  switch (o) {
    case Outcome::completed: return "completed";
    case Outcome::already_done: return "already_done";
    case Outcome::busy: return "busy";
    case Outcome::redis_unavailable: return "redis_unavailable";
    case Outcome::postgres_unavailable: return "postgres_unavailable";
    case Outcome::lease_lost: return "lease_lost";
    case Outcome::timed_out: return "timed_out";
    case Outcome::stale: return "stale";
    case Outcome::failed: return "failed";
    case Outcome::in_doubt: return "in_doubt";
  }
  return "?";
}

std::string JobContext::idempotency_key(std::string_view item) const {
  std::string k;
  k.reserve(idem_key_.size() + 1 + item.size());
  k.append(idem_key_).append(1, '/').append(item);
  return k;
}

std::chrono::milliseconds JobContext::safe_time_left() const {
  return time_left_ ? time_left_() : milliseconds::max();
}

void JobContext::ensure(std::optional<std::chrono::milliseconds> min_left) const {
  if (!guarded_) return;  // fail-open: there is no lock whose time could run out
  const auto need = min_left.value_or(cls_->effective_min_time_left());
  const auto left = safe_time_left();
  if (left < need || stop_.stop_requested())
    throw Error(errc::lease_lost, fmt::format("lock {}: {} ms safely left, {} ms needed before the side effect",
                                              lock_key_, std::max<std::int64_t>(0, left.count()), need.count()));
}

// What the effect is and where blocking work goes.
struct GuardedRunner::Body {
  Effect sync;         // runs on `blocking`
  AsyncEffect async;   // runs on the event loop
  asio::any_io_executor blocking;
};

struct GuardedRunner::Attempt {
  const Unit* unit = nullptr;
  const Body* body = nullptr;
  std::string resource, job_id, fingerprint;
  std::optional<Lock> lock;
  std::optional<Lease> lease;
  bool fail_open = false;
  // The one-call claim left the unit's idempotency key unwritten
  // (claim.lua's 'defer'): the finish writes it, completed.
  bool idem_deferred = false;
  observe::LockClassMetrics* m = nullptr;
  std::chrono::steady_clock::time_point t0;

  const std::string& lock_key() const {
    static const std::string none;
    return lease ? lease->key() : lock ? lock->key() : none;
  }
};

// The one-call claim and finish need the class's completion records and
// idempotency keys in Redis stores on the lock's own client (one server,
// one script), and the low or moderate row (the runner never asks for fair
// locks; a fair one would go the waiter's way).
struct GuardedRunner::Fused {
  guard::RedisCompletionStore* completions = nullptr;
  guard::RedisIdempotencyStore* idempotency = nullptr;  // null: the class has no key
  std::string record_retention, idem_retention;         // ms, as the scripts take them
  // The claims and the finishes one event-loop turn makes, sent together.
  std::shared_ptr<detail::ScriptBatcher> claims, finishes;
};

struct GuardedRunner::FusedClaim {
  enum Kind { granted, done, busy, fallback } kind = fallback;
  std::string result;        // done: the recorded result
  std::optional<Lock> lock;  // granted
  // granted with a key: what its claim found (claimed: `owner` is ours)
  std::optional<guard::BeginResult> begin;
  std::string owner;
  bool deferred = false;  // granted, the key's write left to the finish
};

GuardedRunner::GuardedRunner(std::shared_ptr<LeaseScheduler> leases, LockClass cls, RunnerBackends backends)
    : leases_(std::move(leases)), cls_(std::move(cls)), b_(std::move(backends)) {
  cls_.validate();
  auto bad = [&](const std::string& what) {
    return Error(errc::invalid_argument, fmt::format("lock class '{}': {}", cls_.name, what));
  };
  if (!leases_) throw bad("the runner needs a LeaseScheduler");
  // The acquire's own checks, here, not at the first job: every acquire of
  // this class would refuse them, and a worker would turn each of its jobs
  // into that error.
  try {
    LockOptions lo;
    lo.ttl = cls_.ttl;
    lo.wait = cls_.wait;
    leases_->service().check_options(lo);
  } catch (const Error& e) {
    throw bad(std::string(e.detail()));
  }
  if (cls_.consequence == Consequence::high) {
    // The decision matrix's high row: the durable guard lives where the
    // durable state does. Redis alone (lost on a restart or a failover)
    // cannot be what stops a second run of a state transition.
    if (!b_.postgres) throw bad("consequence high needs PostgreSQL (RunnerBackends::postgres)");
    if (b_.completions)
      throw bad("consequence high records completions in PostgreSQL, in the effect's transaction; "
                "do not pass a separate completion store");
  } else if (!b_.completions) {
    throw bad(fmt::format("consequence {} needs a completion store (RunnerBackends::completions)",
                          to_string(cls_.consequence)));
  }
  if (b_.idempotency && cls_.consequence != Consequence::moderate)
    throw bad(fmt::format("an idempotency store is the moderate row's guard, not the {} row's",
                          to_string(cls_.consequence)));
  if (b_.worker.empty()) b_.worker = default_worker();
  m_ = &(b_.registry ? *b_.registry : leases_->service().metrics_registry()).lock_class(cls_.name);
  clock_ = b_.clock ? b_.clock : &leases_->service().clock();

  auto* rc = dynamic_cast<guard::RedisCompletionStore*>(b_.completions);
  auto* ri = dynamic_cast<guard::RedisIdempotencyStore*>(b_.idempotency);
  redis::Client* lock_client = &leases_->service().client();
  // (On a Redis Cluster the record's and the key's slots are not the lock's.)
  // (The one-call scripts take and release the mutex key: a semaphore's or
  // read-write lock's class goes the step-by-step way.)
  if (cls_.consequence != Consequence::high && cls_.permits == 0 && cls_.mode == LockMode::mutex && rc &&
      &rc->client() == lock_client && !lock_client->options().cluster &&
      (!b_.idempotency || (ri && &ri->client() == lock_client && ri->options().retention.count() > 0))) {
    auto f = std::make_shared<Fused>();
    f->completions = rc;
    f->idempotency = ri;
    f->record_retention = std::to_string(rc->options().retention.count());
    if (ri) f->idem_retention = std::to_string(ri->options().retention.count());
    f->claims = std::make_shared<detail::ScriptBatcher>(*lock_client, detail::claim_script(),
                                                        detail::claim_many_script());
    f->finishes = std::make_shared<detail::ScriptBatcher>(*lock_client, detail::finish_script(),
                                                          detail::finish_many_script());
    fused_ = std::move(f);
  }
}

GuardedRunner::~GuardedRunner() = default;

std::string GuardedRunner::lock_key_for(std::string_view unit_id) const {
  const auto& k = leases_->service().keys();
  const auto resource = cls_.resource_for(unit_id);
  if (cls_.permits > 0) return k.permit_holders_key(resource);
  if (cls_.mode == LockMode::shared) return k.rw_readers_key(resource);
  if (cls_.mode == LockMode::exclusive) return k.rw_writer_key(resource);
  return k.lock_key(resource);
}

std::unique_ptr<guard::PgConnection> GuardedRunner::take_pg() {
  {
    std::lock_guard lk(pg_mu_);
    if (!pg_idle_.empty()) {
      auto c = std::move(pg_idle_.back());
      pg_idle_.pop_back();
      return c;
    }
  }
  return std::make_unique<guard::PgConnection>(*b_.postgres);
}

void GuardedRunner::give_pg(std::unique_ptr<guard::PgConnection> c) {
  std::lock_guard lk(pg_mu_);
  pg_idle_.push_back(std::move(c));
}

void GuardedRunner::emit(const Attempt& a, std::string_view event, std::string_view outcome,
                         std::string_view detail) {
  if (!b_.log) return;
  observe::Event e{.event = event,
                   .lock_key = a.lock_key(),
                   .job_id = a.job_id,
                   .lock_class = cls_.name,
                   .outcome = outcome,
                   .elapsed_ms = std::chrono::duration<double, std::milli>(clock_->now() - a.t0).count()};
  if (!detail.empty()) e.extra.emplace_back("detail", std::string(detail));
  b_.log->emit(e);
}

namespace {
// A blocking call needs somewhere to run that is not the event loop.
void need_blocking(const asio::any_io_executor& ex, std::string_view cls, std::string_view what) {
  if (!ex)
    throw Error(errc::invalid_argument,
                fmt::format("lock class '{}': {} blocks; async_run needs a blocking executor for it", cls, what));
}
}  // namespace

awaitable<std::optional<std::string>> GuardedRunner::find_done(Attempt& a, const std::string& run_id) {
  if (cls_.consequence == Consequence::high) {
    need_blocking(a.body->blocking, cls_.name, "a PostgreSQL completion record");
    auto res = co_await on_blocking(a.body->blocking, [&] {
      auto conn = take_pg();
      auto rows = conn->exec(kSelectDone, {cls_.name, a.resource, run_id});
      give_pg(std::move(conn));
      return rows;
    });
    if (res.empty()) co_return std::nullopt;
    co_return res.rows[0][0].value_or("");
  }
  std::optional<guard::CompletionRecord> rec;
  if (b_.completions->is_async()) {
    rec = co_await await_done<std::optional<guard::CompletionRecord>>(
        [&](auto done) { b_.completions->async_find(cls_.name, a.resource, run_id, std::move(done)); });
  } else {
    need_blocking(a.body->blocking, cls_.name, "the completion store");
    rec = co_await on_blocking(a.body->blocking, [&] { return b_.completions->find(cls_.name, a.resource, run_id); });
  }
  if (!rec) co_return std::nullopt;
  co_return rec->result;
}

awaitable<void> GuardedRunner::record_done(Attempt& a, const std::string& run_id, const std::string& result) {
  if (cls_.consequence == Consequence::high) {
    need_blocking(a.body->blocking, cls_.name, "a PostgreSQL completion record");
    co_await on_blocking(a.body->blocking, [&] {
      auto conn = take_pg();
      // ON CONFLICT: a chunked unit's final record may race a fail-open twin;
      // either record proves the same thing.
      conn->exec(std::string(kInsertDone) + " ON CONFLICT DO NOTHING",
                 {cls_.name, a.resource, run_id, b_.worker, result});
      give_pg(std::move(conn));
    });
    co_return;
  }
  if (b_.completions->is_async()) {
    co_await await_done<guard::RecordOutcome>([&](auto done) {
      b_.completions->async_record(cls_.name, a.resource, run_id, b_.worker, result, std::move(done));
    });
  } else {
    need_blocking(a.body->blocking, cls_.name, "the completion store");
    co_await on_blocking(a.body->blocking,
                         [&] { b_.completions->record(cls_.name, a.resource, run_id, b_.worker, result); });
  }
}

namespace {
// A store call in its asynchronous form where the store has one, else its
// blocking form on the blocking executor.
template <class T, class Store, class Async, class Sync>
awaitable<T> store_call(Store& store, const asio::any_io_executor& blocking, std::string_view cls, Async async,
                        Sync sync) {
  if (store.is_async()) co_return co_await await_done<T>(std::move(async));
  need_blocking(blocking, cls, "the idempotency store");
  co_return co_await on_blocking(blocking, std::move(sync));
}
}  // namespace

// The moderate row's idempotency key, claimed before the effect. nullopt:
// go on to the effect (`idem_ok`: the key is ours, `owner` its token; false
// when a fail-open run could not reach the store). A value: the step ends
// here and run_step returns it.
awaitable<std::optional<bool>> GuardedRunner::claim_idempotency(Attempt& a, JobContext& ctx, const std::string& run_id,
                                                                int chunk, RunResult& r, std::string& owner,
                                                                bool& idem_ok) {
  const auto lease = cls_.long_running ? cls_.hard_timeout : cls_.ttl;
  try {
    for (int round = 0;; ++round) {
      auto b = co_await store_call<guard::BeginResult>(
          *b_.idempotency, a.body->blocking, cls_.name,
          [&](auto done) { b_.idempotency->async_begin(ctx.idem_key_, a.fingerprint, lease, {}, std::move(done)); },
          [&] { return b_.idempotency->begin(ctx.idem_key_, a.fingerprint, lease); });
      if (b.status == guard::BeginStatus::claimed) {
        owner = b.owner;
        idem_ok = true;
        co_return std::nullopt;
      }
      if (b.status == guard::BeginStatus::completed) {
        // The effect ran and its key completed, but the completion record
        // was not written (a crash between the two): record it now.
        r.result = b.result;
        co_await record_done(a, run_id, r.result);
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
    idem_ok = false;  // fail-open: the downstream still gets the key
    emit(a, "idempotency_unavailable", "error", e.what());
  }
  co_return std::nullopt;
}

void GuardedRunner::check(const Unit& unit, bool has_effect) const {
  if (unit.id.empty()) throw Error(errc::invalid_argument, fmt::format("lock class '{}': unit without id", cls_.name));
  if (unit.run_id.empty())
    throw Error(errc::invalid_argument, fmt::format("lock class '{}': unit '{}' without run_id", cls_.name, unit.id));
  if (unit.chunks < 0)
    throw Error(errc::invalid_argument, fmt::format("lock class '{}': unit '{}' has {} chunks", cls_.name, unit.id,
                                                    unit.chunks));
  if (!has_effect) throw Error(errc::invalid_argument, fmt::format("lock class '{}': empty effect", cls_.name));
  KeyBuilder::validate_resource(cls_.resource_for(unit.id));
}

RunResult GuardedRunner::run(const Unit& unit, const Effect& effect) {
  check(unit, static_cast<bool>(effect));
  auto& client = leases_->service().client();
  if (client.running_in_loop_thread())
    throw Error(errc::invalid_argument,
                fmt::format("lock class '{}': run() blocks; on the event loop use async_run", cls_.name));
  // The run is a coroutine on the client's loop; this thread is its
  // `blocking` executor, so the effect and PostgreSQL run here, as a
  // blocking caller expects.
  // Shared with the completion handler: the loop thread is still inside
  // post() into it when this thread wakes, returns and would destroy it.
  auto here = std::make_shared<asio::io_context>();
  auto work = asio::make_work_guard(*here);
  std::exception_ptr failure;
  RunResult out;
  asio::co_spawn(client.get_executor(), async_run(unit, effect, here->get_executor()),
                 [&, here](std::exception_ptr e, RunResult r) {
                   asio::post(*here, [&, e, r = std::move(r)]() mutable {
                     failure = e;
                     out = std::move(r);
                     work.reset();
                   });
                 });
  here->run();
  if (failure) std::rethrow_exception(failure);
  return out;
}

awaitable<RunResult> GuardedRunner::async_run(Unit unit, AsyncEffect effect, asio::any_io_executor blocking) {
  check(unit, static_cast<bool>(effect));
  if (cls_.consequence == Consequence::high)
    throw Error(errc::invalid_argument,
                fmt::format("lock class '{}' is high: its effect runs inside a PostgreSQL transaction and must be a "
                            "blocking Effect",
                            cls_.name));
  // Named: g++ 12 destroys a temporary inside a co_await expression twice.
  Body body{{}, std::move(effect), std::move(blocking)};
  co_return co_await run_coro(std::move(unit), std::move(body));
}

awaitable<RunResult> GuardedRunner::async_run(Unit unit, Effect effect, asio::any_io_executor blocking) {
  check(unit, static_cast<bool>(effect));
  need_blocking(blocking, cls_.name, "a blocking Effect");
  Body body{std::move(effect), {}, std::move(blocking)};
  co_return co_await run_coro(std::move(unit), std::move(body));
}

awaitable<RunResult> GuardedRunner::run_coro(Unit unit, Body body) {
  Attempt a;
  a.unit = &unit;
  a.body = &body;
  a.t0 = clock_->now();
  a.resource = cls_.resource_for(unit.id);
  a.job_id = unit.job_id.empty() ? cls_.name + ":" + unit.id : unit.job_id;
  a.fingerprint = unit.fingerprint.empty() ? unit.run_id : unit.fingerprint;
  a.m = m_;

  RunResult r;
  try {
    co_await run_guarded(a, r);
  } catch (const StepVerdict& v) {
    r.outcome = v.outcome;
    r.detail = v.detail;
  } catch (const Error& e) {
    r.outcome = classify(e);
    r.detail = e.what();
    if (r.outcome == Outcome::redis_unavailable) a.m->redis_errors_total.inc();
  } catch (const std::exception& e) {
    r.outcome = Outcome::failed;
    r.detail = e.what();
  }
  if (a.lease && r.outcome == Outcome::lease_lost && a.lease->state() == LeaseState::timed_out) {
    r.outcome = Outcome::timed_out;
    r.detail = "hard timeout: " + a.lease->reason();
  }
  if (r.outcome == Outcome::stale) a.m->stale_writes_rejected_total.inc();
  r.fail_open = a.fail_open;
  if (a.lease) r.fence = a.lease->fence();
  if (a.lock) r.fence = a.lock->fence();
  // Release before reporting: the next worker may start as soon as it hears.
  // A Redis gone after the work is no failure of the run: the lock frees
  // itself at its TTL.
  auto release = [](auto& held) {
    return await_done<bool>([&held](auto done) {
      held.async_release([done = std::move(done)](const Error&, bool ours) { done(nullptr, ours); });
    });
  };
  if (a.lease) co_await release(*a.lease);
  if (a.lock && a.lock->held()) co_await release(*a.lock);  // not when the one-call finish released it
  // The dashboard timeline's records (admin::record_incident; lost leases
  // are recorded by the lease itself). After the release, so a fail-open run
  // is recorded if Redis answers again by now; dropped if it does not.
  auto& svc = leases_->service();
  admin::Incident incident;
  incident.resource = a.resource;
  incident.job = a.job_id;
  incident.lock_class = cls_.name;
  if (r.outcome == Outcome::stale) {
    incident.kind = "stale_fence_rejected";
    incident.detail = r.detail;
    admin::record_incident(svc.client(), svc.keys(), incident);
  }
  if (a.fail_open) {
    incident.kind = "fail_open";
    incident.detail = fmt::format("ran without the lock: {}", to_string(r.outcome));
    admin::record_incident(svc.client(), svc.keys(), incident);
  }
  r.elapsed = std::chrono::duration_cast<milliseconds>(clock_->now() - a.t0);
  emit(a, r.outcome == Outcome::already_done ? "skipped" : r.ok() ? "completed" : "failed", to_string(r.outcome),
       r.detail);
  co_return r;
}

awaitable<void> GuardedRunner::run_guarded(Attempt& a, RunResult& r) {
  const Unit& unit = *a.unit;
  // Phase 1 before the lock: a duplicate delivery of finished work costs one
  // read, not a lock round.
  auto already_done = [&](std::string result) {
    r.outcome = Outcome::already_done;
    r.result = std::move(result);
    r.detail = fmt::format("{} {} run {} already completed", cls_.name, a.resource, unit.run_id);
  };
  auto closed = [&](const Error& e) {
    a.m->redis_errors_total.inc();
    return StepVerdict{Outcome::redis_unavailable,
                       fmt::format("Redis unavailable and lock class '{}' is fail-closed, so {} did not run: {}",
                                   cls_.name, a.job_id, e.what()),
                       {}};
  };
  LockOptions lo;
  lo.ttl = cls_.ttl;
  lo.wait = cls_.wait;
  lo.fence = cls_.fenced || cls_.consequence == Consequence::high;
  lo.job_id = a.job_id;
  lo.lock_class = cls_.name;
  lo.replicas = cls_.replicas;
  lo.on_unconfirmed = cls_.on_unconfirmed;
  lo.permits = cls_.permits;
  lo.mode = cls_.mode;
  auto hold = [&](Lock lock) {
    if (cls_.long_running) {
      LeaseOptions leo;
      leo.hard_timeout = cls_.hard_timeout;
      a.lease = leases_->adopt(std::move(lock), leo);
    } else {
      a.lock = std::move(lock);
    }
  };
  auto busy = [&] { return StepVerdict{Outcome::busy, fmt::format("lock {} is held by another worker", a.resource), {}}; };

  // The record check, the grant and the key's claim in one call where the
  // class allows it; anything it cannot settle goes the step-by-step way.
  FusedClaim fc;
  if (fused_ && unit.chunks == 0) fc = co_await one_call_claim(a, lo);
  if (fc.kind == FusedClaim::done) co_return already_done(std::move(fc.result));
  if (fc.kind == FusedClaim::busy && cls_.wait.count() == 0) throw busy();

  std::optional<std::string> done;
  if (fc.kind == FusedClaim::fallback) {
    try {
      done = co_await find_done(a, unit.run_id);
    } catch (const Error& e) {
      if (!redis_down(e)) throw;
      if (cls_.on_redis_down == RedisDownPolicy::fail_closed) throw closed(e);
      // Fail-open and the record store is down too: we cannot know; the class
      // declared that running is acceptable. Counted with the fail-open below.
    }
    if (done) co_return already_done(*done);
  }

  // Phase 2: claim.
  if (fc.kind == FusedClaim::granted) {
    hold(std::move(*fc.lock));
    a.idem_deferred = fc.deferred;
  } else {
    try {
      auto lock = co_await await_done<std::optional<Lock>>([&](auto granted) {
        leases_->service().async_acquire(a.resource, lo,
                                         [granted = std::move(granted)](const Error& e, std::optional<Lock> l) {
                                           granted(e ? std::make_exception_ptr(e) : nullptr, std::move(l));
                                         });
      });
      if (!lock) throw busy();
      hold(std::move(*lock));
    } catch (const Error& e) {
      if (!redis_down(e)) throw;
      if (cls_.on_redis_down == RedisDownPolicy::fail_closed) throw closed(e);
      a.m->redis_errors_total.inc();
      a.fail_open = true;
      a.m->fail_open_total.inc();
      emit(a, "fail_open", "unguarded",
           fmt::format("Redis unavailable; lock class '{}' is fail-open: running {} WITHOUT the lock: {}", cls_.name,
                       a.job_id, e.what()));
    }
  }
  if (!a.fail_open) emit(a, "acquired", "ok");

  // Phase 1 again, under the lock: another worker may have finished between
  // our first look and our grant (the one-call claim looked in the same
  // call as its grant).
  if (!a.fail_open && fc.kind != FusedClaim::granted) {
    done = co_await find_done(a, unit.run_id);
    if (done) co_return already_done(*done);
  }
  const std::string* claimed =
      fc.begin && fc.begin->status == guard::BeginStatus::claimed ? &fc.owner : nullptr;

  // Phases 3 and 4.
  if (unit.chunks == 0) {
    if (!co_await run_step(a, -1, r, claimed)) co_return;
  } else {
    for (int c = 0; c < unit.chunks; ++c)
      if (!co_await run_step(a, c, r)) co_return;
    // The unit's own record: the next delivery skips it with one read.
    try {
      co_await record_done(a, unit.run_id, r.result);
    } catch (const Error& e) {
      if (!a.fail_open) throw;
      emit(a, "record_failed", "error", e.what());
    }
  }
  r.outcome = Outcome::completed;
}

// One call: the record checked, the lock granted, the key claimed
// (scripts/claim.lua). Never throws: what it cannot settle is `fallback`,
// and the step-by-step path then decides (a Redis error, the fail-open
// policy, a waiting acquire) as it always has.
awaitable<GuardedRunner::FusedClaim> GuardedRunner::one_call_claim(Attempt& a, const LockOptions& lo) {
  const Unit& unit = *a.unit;
  FusedClaim out;
  ::jobguard::detail::ComposedResult res;
  std::string idem_key;
  try {
    ::jobguard::detail::ComposedAttempt c;
    c.script = &detail::claim_script();
    c.eval = [b = fused_->claims](std::vector<std::string> k, std::vector<std::string> v, redis::Completion d,
                                  redis::CallOptions o) { b->async_eval(std::move(k), std::move(v), std::move(d), o); };
    c.keys.push_back(fused_->completions->key_for(cls_.name, a.resource, unit.run_id));
    if (fused_->idempotency) {
      // The key run_step would claim for the whole unit (chunk -1).
      idem_key = step_idempotency_key(cls_.name, a.resource, unit.run_id);
      out.owner = guard::make_owner_token();
      const auto lease = cls_.long_running ? cls_.hard_timeout : cls_.ttl;
      c.keys.push_back(fused_->idempotency->key_for(idem_key));
      // A lease that is the lock's TTL from the grant ends with the lock:
      // the key's write can wait for the finish (claim.lua). A long-running
      // class's key outlives a lost lease by its hard timeout: written now.
      c.args = {a.fingerprint, out.owner, std::to_string(lease.count()), fused_->idem_retention,
                cls_.long_running ? "" : "defer"};
    }
    // A unit's first run, the common claim, needs no script where the grant
    // is a bare SET NX PX: the grant, then "neither the record nor the key
    // exists" (composed.hpp, the plain form). A long-running class's key is
    // written at the claim: the script.
    if (!fused_->idempotency || !cls_.long_running) {
      c.plain_checks = c.keys;
      if (fused_->idempotency) c.plain_part = "deferred";
    }
    res = co_await await_done<::jobguard::detail::ComposedResult>([&](auto done) {
      ::jobguard::detail::async_attempt_composed(
          leases_->service(), a.resource, lo, std::move(c),
          [done = std::move(done)](const Error& e, ::jobguard::detail::ComposedResult r) {
            done(e ? std::make_exception_ptr(e) : nullptr, std::move(r));
          });
    });
    using S = ::jobguard::detail::ComposedStatus;
    if (res.status == S::declined) {
      out.kind = FusedClaim::done;
      out.result = res.part.str;
      co_return out;
    }
    if (res.status == S::busy) {
      out.kind = FusedClaim::busy;
      co_return out;
    }
    if (fused_->idempotency && res.part.is_string() && res.part.str == "deferred") {
      out.deferred = true;
      out.begin = guard::BeginResult{.status = guard::BeginStatus::claimed, .owner = out.owner};
    } else if (fused_->idempotency && !res.part.is_nil()) {
      out.begin = guard::RedisIdempotencyStore::parse_begin_reply(res.part);
    }
    if (res.status == S::granted) {
      out.kind = FusedClaim::granted;
      out.lock = std::move(res.lock);
      co_return out;
    }
  } catch (const std::exception&) {
    // In doubt or refused: the step-by-step path asks again and reports.
    FusedClaim ask_again;
    co_return ask_again;
  }
  // A grant handed back (an unchecked connection): the key it claimed for
  // us is dropped too, so the step-by-step claim does not find it in progress.
  if (out.begin && out.begin->status == guard::BeginStatus::claimed && !out.deferred)
    fused_->idempotency->async_abandon(idem_key, out.owner, [](std::exception_ptr, bool) {});
  FusedClaim ask_again;
  co_return ask_again;
}

// One call: the key completed, the record written, the lock released
// (scripts/finish.lua). False when it did not settle all three; the caller
// then makes the steps one by one.
awaitable<bool> GuardedRunner::one_call_finish(Attempt& a, const std::string& run_id, const std::string& owner,
                                               bool idem_ok, const std::string& result) {
  auto& svc = leases_->service();
  std::vector<std::string> keys{fused_->completions->key_for(cls_.name, a.resource, run_id), a.lock->key(),
                                svc.keys().waiters_key(a.resource)};
  if (idem_ok) keys.push_back(fused_->idempotency->key_for(step_idempotency_key(cls_.name, a.resource, run_id)));
  std::vector<std::string> args{a.lock->token(), svc.keys().channel(a.resource), b_.worker, result,
                                fused_->record_retention, owner, fused_->idem_retention,
                                svc.client().options().cluster ? "1" : ""};
  const bool deferred = idem_ok && a.idem_deferred;
  if (deferred) {
    const auto held_for = std::chrono::duration_cast<milliseconds>(clock_->now() - a.lock->acquired_at());
    args.insert(args.end(), {"deferred", a.fingerprint, std::to_string(std::max<std::int64_t>(0, held_for.count())),
                             std::to_string(cls_.ttl.count())});
  }
  redis::Reply reply;
  try {
    reply = co_await await_done<redis::Reply>([&](auto done) {
      fused_->finishes->async_eval(std::move(keys), std::move(args),
                                   [done = std::move(done)](std::error_code ec, redis::Reply r) {
                                     done(ec ? std::make_exception_ptr(Error(ec, "finish")) : nullptr, std::move(r));
                                   });
    });
  } catch (const std::exception&) {
    co_return false;
  }
  if (deferred && reply.is_array() && reply.elements.size() == 3 && reply.elements[0].is_integer() &&
      reply.elements[0].integer == 0) {
    // The key is another run's (or the lock is): our lock released if it
    // was still ours, nothing written; reported as the steps would.
    a.lock->released_by_script(reply.elements[2].is_integer() && reply.elements[2].integer == 1);
    guard::RedisIdempotencyStore::check_complete_reply(reply.elements[1],
                                                       step_idempotency_key(cls_.name, a.resource, run_id), owner);
    co_return false;  // not reached: the reply above is a refusal
  }
  if (!reply.is_array() || reply.elements.size() != 3 || !reply.elements[0].is_integer() ||
      reply.elements[0].integer != 1)
    co_return false;
  a.lock->released_by_script(reply.elements[2].is_integer() && reply.elements[2].integer == 1);
  co_return true;
}

// The high row's step, on the blocking executor: the effect inside a
// PostgreSQL transaction that holds an advisory lock on the resource and
// commits the completion record. False when the run must stop.
bool GuardedRunner::high_step(Attempt& a, JobContext& ctx, const std::string& run_id, int chunk, RunResult& r) {
  const Unit& unit = *a.unit;
  auto conn = take_pg();
  bool skipped = false;
  std::string result;
  try {
    conn->transact([&](guard::PgTransaction& tx) {
      // The durable guard: one transaction per resource at a time, whatever
      // Redis says (it may have lost the lock, or be down and fail-open).
      const std::string name = cls_.name + "/" + a.resource;
      const bool got = cls_.wait.count() > 0 ? tx.advisory_xact_lock(name, cls_.wait) : tx.try_advisory_xact_lock(name);
      if (!got)
        throw StepVerdict{Outcome::busy, fmt::format("advisory lock {} is held by another transaction", name), {}};
      auto res = tx.exec(kSelectDone, {cls_.name, a.resource, run_id});
      if (!res.empty()) {
        skipped = true;
        result = res.rows[0][0].value_or("");
        return;
      }
      ctx.tx_ = &tx;
      result = a.body->sync(ctx);
      ctx.tx_ = nullptr;
      // The record commits with the effect's writes, or neither does.
      tx.exec(kInsertDone, {cls_.name, a.resource, run_id, b_.worker, result});
    });
  } catch (const Error& e) {
    // A connection that failed mid-transaction is not reused.
    if (e.code() != make_error_code(errc::postgres_unavailable) && e.code() != make_error_code(errc::in_doubt))
      give_pg(std::move(conn));
    throw;
  } catch (...) {
    give_pg(std::move(conn));
    throw;
  }
  give_pg(std::move(conn));
  if (skipped) {
    if (chunk < 0) {
      r.outcome = Outcome::already_done;
      r.result = result;
      r.detail = fmt::format("{} {} run {} already completed", cls_.name, a.resource, run_id);
      return false;
    }
    ++r.chunks_skipped;
    emit(a, "skipped", "checkpoint", fmt::format("chunk {} of {} completed earlier", chunk, unit.chunks));
    return true;
  }
  r.result = std::move(result);
  if (chunk >= 0) ++r.chunks_run;
  return true;
}

// One effect call (a chunk, or the whole unit) and its completion record.
// False when the run must stop; r.outcome then says why.
awaitable<bool> GuardedRunner::run_step(Attempt& a, int chunk, RunResult& r, const std::string* claimed_owner) {
  const Unit& unit = *a.unit;
  const std::string run_id = step_run_id(unit.run_id, chunk);

  JobContext ctx;
  ctx.cls_ = &cls_;
  ctx.unit_ = &unit;
  ctx.resource_ = a.resource;
  ctx.lock_key_ = a.lock_key();
  ctx.guarded_ = !a.fail_open;
  ctx.chunk_ = chunk;
  ctx.idem_key_ = step_idempotency_key(cls_.name, a.resource, run_id);
  if (a.lease) {
    ctx.fence_ = a.lease->fence();
    ctx.stop_ = a.lease->stop_token();
    Lease* lease = &*a.lease;
    ctx.time_left_ = [lease] { return lease->safe_time_left(); };
  } else if (a.lock) {
    ctx.fence_ = a.lock->fence();
    // A plain lock's time is its TTL from the grant, less the same drift
    // allowance a lease takes (the server's clock may run faster than ours).
    const auto expires = a.lock->acquired_at() + a.lock->ttl() - a.lock->ttl() / 100 - milliseconds(2);
    ctx.time_left_ = [expires, clock = clock_] {
      return std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(expires - clock->now()));
    };
  }

  if (chunk >= 0 && cls_.consequence != Consequence::high) {
    // The checkpoint: a chunk recorded by an earlier, crashed attempt.
    std::optional<std::string> done;
    try {
      done = co_await find_done(a, run_id);
    } catch (const Error& e) {
      if (!a.fail_open) throw;
      emit(a, "record_unreadable", "error", e.what());
    }
    if (done) {
      ++r.chunks_skipped;
      emit(a, "skipped", "checkpoint", fmt::format("chunk {} of {} completed earlier", chunk, unit.chunks));
      co_return true;
    }
  }
  if (ctx.guarded_) ctx.ensure();  // a lost lease stops the unit before the next chunk starts

  if (cls_.consequence == Consequence::high)
    co_return co_await on_blocking(a.body->blocking, [&] { return high_step(a, ctx, run_id, chunk, r); });

  // Low and moderate.
  std::string owner;
  bool idem_ok = false;
  if (claimed_owner) {
    owner = *claimed_owner;
    idem_ok = true;
  } else if (b_.idempotency) {
    if (auto stop_here = co_await claim_idempotency(a, ctx, run_id, chunk, r, owner, idem_ok)) co_return *stop_here;
  }
  std::string result;
  std::exception_ptr effect_failed;
  try {
    if (a.body->async) result = co_await a.body->async(ctx);
    else result = co_await on_blocking(a.body->blocking, [&] { return a.body->sync(ctx); });
  } catch (...) {
    effect_failed = std::current_exception();
  }
  if (effect_failed) {
    // The effect reported that it did not complete: free the key at once so
    // a retry does not wait out the claim. The downstream still sees the
    // same key on the retry, which is what protects a half-done effect.
    if (idem_ok && !a.idem_deferred) {  // a deferred key was never written
      try {
        co_await store_call<bool>(
            *b_.idempotency, a.body->blocking, cls_.name,
            [&](auto done) { b_.idempotency->async_abandon(ctx.idem_key_, owner, std::move(done)); },
            [&] { return b_.idempotency->abandon(ctx.idem_key_, owner); });
      } catch (const Error&) {
      }
    }
    std::rethrow_exception(effect_failed);
  }
  if (ctx.guarded_ && ctx.safe_time_left().count() <= 0) {
    // The effect finished, but past the time the lock was certainly ours:
    // another worker may have run it too. The record is still written (it
    // states a fact, and stops a third run); the overrun is said loudly.
    emit(a, "overran_lock", "warning",
         fmt::format("the effect of {} ended after its lock's safe time: another worker may have run it too", run_id));
    if (r.detail.empty()) r.detail = fmt::format("{}: the effect outlived its lock", run_id);
  }
  // The key completed, the record written and the lock released in one
  // call where the class allows it. If that call fails, the steps below
  // make it again one by one: each is idempotent (a key completed twice, a
  // record that exists, a lock already released), so a finish that ran but
  // whose reply was lost is finished, not repeated.
  if (fused_ && chunk < 0 && a.lock && a.lock->held() && !a.fail_open && (idem_ok || !b_.idempotency) &&
      co_await one_call_finish(a, run_id, owner, idem_ok, result)) {
    r.result = std::move(result);
    co_return true;
  }
  if (idem_ok && a.idem_deferred) {
    // The deferred key (the one call failed or its reply was lost): claimed
    // now under our owner, unless the lost reply's finish completed it, or
    // another run has it; the complete below then tells which.
    const auto lease = cls_.ttl;
    co_await store_call<guard::BeginResult>(
        *b_.idempotency, a.body->blocking, cls_.name,
        [&](auto done) { b_.idempotency->async_begin(ctx.idem_key_, a.fingerprint, lease, owner, std::move(done)); },
        [&] { return b_.idempotency->begin(ctx.idem_key_, a.fingerprint, lease, owner); });
  }
  if (idem_ok)
    co_await store_call<bool>(
        *b_.idempotency, a.body->blocking, cls_.name, [&](auto done) { b_.idempotency->async_complete(ctx.idem_key_, owner, result, std::move(done)); },
        [&] {
          b_.idempotency->complete(ctx.idem_key_, owner, result);
          return true;
        });
  try {
    co_await record_done(a, run_id, result);
  } catch (const Error& e) {
    if (!a.fail_open) {
      throw Error(e.code(), fmt::format("the effect of {} ran but its completion was not recorded: {}", run_id,
                                        e.what()),
                  e.source());
    }
    emit(a, "record_failed", "error", e.what());
  }
  if (chunk >= 0) {
    ++r.chunks_run;
    emit(a, "checkpoint", "ok", fmt::format("chunk {} of {}", chunk, unit.chunks));
  }
  r.result = std::move(result);
  co_return true;
}

}  // namespace jobguard::job
