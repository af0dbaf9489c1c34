// g++ 12 at -O2 inlines Asio's coroutine frame allocator (operator new of
// awaitable_frame_base, which recycles blocks through std::free) far enough
// to see a malloc'd-or-new'd mismatch that is not there: a known false
// positive of -Wmismatched-new-delete. Off for this file only, before any
// Asio header is read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include "jobguard/job/runner.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "job/awaiting.hpp"
#include "job/claim_path.hpp"
#include "job/runner_attempt.hpp"
#include "jobguard/admin.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/event_log.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::job {
namespace {

namespace asio = boost::asio;
using asio::awaitable;
using std::chrono::milliseconds;
using detail::await_done;

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

// A blocking call needs somewhere to run that is not the event loop.
void need_blocking(const asio::any_io_executor& ex, std::string_view cls, std::string_view what) {
  if (!ex)
    throw Error(errc::invalid_argument,
                fmt::format("lock class '{}': {} blocks; async_run needs a blocking executor for it", cls, what));
}

awaitable<void> release(Lease& lease) {
  co_await await_done<bool>([&lease](auto done) {
    lease.async_release([done = std::move(done)](const Error&, bool ours) { done(nullptr, ours); });
  });
}

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

GuardedRunner::GuardedRunner(std::shared_ptr<LeaseScheduler> leases, LockClass cls, RunnerBackends backends)
    : leases_(std::move(leases)), cls_(std::move(cls)), b_(std::move(backends)) {
  setup();
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
  try {
    own_path_ = make_claim_path(*leases_, cls_, b_);
  } catch (const Error& e) {
    throw bad(std::string(e.detail()));  // a high class where jobguard was built without PostgreSQL
  }
  path_ = own_path_.get();
}

GuardedRunner::GuardedRunner(std::shared_ptr<LeaseScheduler> leases, LockClass cls, RunnerBackends backends,
                             ClaimPath& path)
    : leases_(std::move(leases)), cls_(std::move(cls)), b_(std::move(backends)), path_(&path) {
  setup();
  if (b_.completions || b_.idempotency || b_.postgres)
    throw bad("a runner given a claim path reaches its stores through it; pass none in RunnerBackends");
  if (cls_.consequence == Consequence::high && !path.durable())
    throw bad("consequence high needs a claim path with durable steps");
  if (path.has_keys() && cls_.consequence != Consequence::moderate)
    throw bad(fmt::format("an idempotency store is the moderate row's guard, not the {} row's",
                          to_string(cls_.consequence)));
}

Error GuardedRunner::bad(const std::string& what) const {
  return Error(errc::invalid_argument, fmt::format("lock class '{}': {}", cls_.name, what));
}

void GuardedRunner::setup() {
  cls_.validate();
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
  if (b_.worker.empty()) b_.worker = default_worker();
  m_ = &(b_.registry ? *b_.registry : leases_->service().metrics_registry()).lock_class(cls_.name);
  clock_ = b_.clock ? b_.clock : &leases_->service().clock();
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

LockOptions GuardedRunner::lock_options(const std::string& job_id) const {
  LockOptions lo;
  lo.ttl = cls_.ttl;
  lo.wait = cls_.wait;
  lo.fence = cls_.fenced || cls_.consequence == Consequence::high;
  lo.job_id = job_id;
  lo.lock_class = cls_.name;
  lo.replicas = cls_.replicas;
  lo.on_unconfirmed = cls_.on_unconfirmed;
  lo.permits = cls_.permits;
  lo.mode = cls_.mode;
  return lo;
}

void GuardedRunner::emit(const Attempt& a, std::string_view event, std::string_view outcome,
                         std::string_view detail) {
  if (!b_.log) return;
  observe::Event e{.event = event,
                   .lock_key = a.lock_key(),
                   .job_id = a.call.job_id,
                   .lock_class = cls_.name,
                   .outcome = outcome,
                   .elapsed_ms = std::chrono::duration<double, std::milli>(clock_->now() - a.t0).count()};
  if (!detail.empty()) e.extra.emplace_back("detail", std::string(detail));
  b_.log->emit(e);
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
  a.call.cls = &cls_;
  a.call.resource = cls_.resource_for(unit.id);
  a.call.run_id = unit.run_id;
  a.call.job_id = unit.job_id.empty() ? cls_.name + ":" + unit.id : unit.job_id;
  a.call.fingerprint = unit.fingerprint.empty() ? unit.run_id : unit.fingerprint;
  a.call.lock = lock_options(a.call.job_id);
  a.call.whole_unit = unit.chunks == 0;
  a.call.may_skip_unreadable_record = cls_.on_redis_down != RedisDownPolicy::fail_closed;
  a.call.blocking = body.blocking;
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
  if (a.lease) co_await release(*a.lease);
  if (a.lock && a.lock->held()) co_await path_->release(*a.lock);  // not when the finish released it
  record_incidents(a, r);
  r.elapsed = std::chrono::duration_cast<milliseconds>(clock_->now() - a.t0);
  emit(a, r.outcome == Outcome::already_done ? "skipped" : r.ok() ? "completed" : "failed", to_string(r.outcome),
       r.detail);
  co_return r;
}

// The dashboard timeline's records (admin::record_incident; lost leases are
// recorded by the lease itself). After the release, so a fail-open run is
// recorded if Redis answers again by now; dropped if it does not.
void GuardedRunner::record_incidents(const Attempt& a, const RunResult& r) {
  auto& svc = leases_->service();
  admin::Incident incident;
  incident.resource = a.call.resource;
  incident.job = a.call.job_id;
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
}

// Phases 1 and 2 through the claim path, with the class's Redis policy
// applied to a Redis that cannot answer. nullopt: running fail-open.
awaitable<std::optional<Claim>> GuardedRunner::claim(Attempt& a) {
  try {
    co_return co_await path_->claim(a.call);
  } catch (const Error& e) {
    if (!redis_down(e)) throw;
    a.m->redis_errors_total.inc();
    if (cls_.on_redis_down == RedisDownPolicy::fail_closed)
      throw StepVerdict{Outcome::redis_unavailable,
                        fmt::format("Redis unavailable and lock class '{}' is fail-closed, so {} did not run: {}",
                                    cls_.name, a.call.job_id, e.what()),
                        {}};
    a.fail_open = true;
    a.m->fail_open_total.inc();
    emit(a, "fail_open", "unguarded",
         fmt::format("Redis unavailable; lock class '{}' is fail-open: running {} WITHOUT the lock: {}", cls_.name,
                     a.call.job_id, e.what()));
  }
  co_return std::nullopt;
}

void GuardedRunner::hold(Attempt& a, Lock lock) {
  if (cls_.long_running) {
    LeaseOptions leo;
    leo.hard_timeout = cls_.hard_timeout;
    a.lease = leases_->adopt(std::move(lock), leo);
  } else {
    a.lock = std::move(lock);
  }
}

void GuardedRunner::already_done(const Attempt& a, RunResult& r, std::string result) const {
  r.outcome = Outcome::already_done;
  r.result = std::move(result);
  r.detail = fmt::format("{} {} run {} already completed", cls_.name, a.call.resource, a.unit->run_id);
}

awaitable<void> GuardedRunner::run_guarded(Attempt& a, RunResult& r) {
  const Unit& unit = *a.unit;
  auto c = co_await claim(a);
  if (c && c->kind == Claim::Kind::done) co_return already_done(a, r, std::move(c->result));
  if (c && c->kind == Claim::Kind::busy)
    throw StepVerdict{Outcome::busy, fmt::format("lock {} is held by another worker", a.call.resource), {}};
  if (c) {
    hold(a, std::move(*c->lock));
    a.key = std::move(c->key);
    emit(a, "acquired", "ok");
  }
  // Phase 1 again, under the lock: another worker may have finished between
  // our first look and our grant (unless the claim looked in the same call
  // as its grant).
  if (c && !c->record_checked) {
    auto done = co_await path_->find_done(a.call, unit.run_id);
    if (done) co_return already_done(a, r, std::move(*done));
  }

  // Phases 3 and 4.
  if (unit.chunks == 0) {
    if (!co_await run_step(a, -1, r)) co_return;
  } else {
    for (int chunk = 0; chunk < unit.chunks; ++chunk)
      if (!co_await run_step(a, chunk, r)) co_return;
    // The unit's own record: the next delivery skips it with one read.
    try {
      co_await path_->record(a.call, unit.run_id, r.result);
    } catch (const Error& e) {
      if (!a.fail_open) throw;
      emit(a, "record_failed", "error", e.what());
    }
  }
  r.outcome = Outcome::completed;
}

}  // namespace jobguard::job
