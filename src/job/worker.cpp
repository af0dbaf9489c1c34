#include "jobguard/job/worker.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <cstdio>
#include <limits>
#include <optional>
#include <vector>

#include "job/worker_impl.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"

namespace jobguard::job {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using Clock = StreamWorker::Impl::Clock;
using std::chrono::milliseconds;

namespace {

std::string default_consumer() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof host, "%s", "host");
  return fmt::format("{}-{}", host, ::getpid());
}

}  // namespace

void WorkerOptions::validate() const {
  if (concurrency < 1 || concurrency > 4096)
    throw Error(errc::invalid_argument, fmt::format("stream worker: concurrency {} outside [1, 4096]", concurrency));
  if (id_field.empty()) throw Error(errc::invalid_argument, "stream worker: empty id_field");
  if (max_jobs < 0) throw Error(errc::invalid_argument, "stream worker: max_jobs must be >= 0");
  for (const auto& rate : rates)
    if (rate.count <= 0 || rate.per.count() <= 0 || rate.interval().count() < 1)
      throw Error(errc::invalid_argument, "stream worker: a rate limit needs a count and a period above 0");
  for (std::size_t i = 0; i < concurrency_per.size(); ++i) {
    const auto& c = concurrency_per[i];
    if (c.field.empty()) throw Error(errc::invalid_argument, "stream worker: a concurrency limit needs a field");
    if (c.count < 1 || c.count > LockOptions::kMaxPermits)
      throw Error(errc::invalid_argument, fmt::format("stream worker: concurrency limit {}={} outside [1, {}]",
                                                      c.field, c.count, LockOptions::kMaxPermits));
    for (std::size_t j = 0; j < i; ++j)
      if (concurrency_per[j].field == c.field)
        throw Error(errc::invalid_argument,
                    fmt::format("stream worker: two concurrency limits on field \"{}\"", c.field));
  }
  if (unique_reap_interval.count() < 0)
    throw Error(errc::invalid_argument, "stream worker: unique_reap_interval must be >= 0");
  if (retry_backoff.count() <= 0 || retry_backoff_max < retry_backoff)
    throw Error(errc::invalid_argument, "stream worker: retry_backoff must be > 0 and <= retry_backoff_max");
  if (blocking_threads < 0) throw Error(errc::invalid_argument, "stream worker: blocking_threads must be >= 0");
}

StreamWorker::Impl::Impl(redis::Client& c, StreamOptions so, GuardedRunner& r, AsyncJobEffect ae, JobEffect se,
                         WorkerOptions wo)
    : client(c),
      source(c, std::move(so)),
      runner(r),
      async_effect(std::move(ae)),
      sync_effect(std::move(se)),
      o(std::move(wo)),
      wake(c.get_executor()),
      pause(c.get_executor()) {
  if (!async_effect && !sync_effect) throw Error(errc::invalid_argument, "stream worker: empty effect");
  o.validate();
  if (o.consumer.empty()) o.consumer = default_consumer();
  // Every worker takes a job's permits in the same order: by field.
  std::sort(o.concurrency_per.begin(), o.concurrency_per.end(),
            [](const ConcurrencyLimit& a, const ConcurrencyLimit& b) { return a.field < b.field; });
  const int threads = o.blocking_threads > 0 ? o.blocking_threads : sync_effect ? o.concurrency : 1;
  pool = std::make_unique<asio::thread_pool>(static_cast<std::size_t>(threads));
  // Blocked reads hold a connection: they get one of their own.
  auto ro = client.options();
  ro.client_name = (ro.client_name.empty() ? std::string("jobguard") : ro.client_name) + "-reader";
  reader = std::make_unique<redis::Client>(ro);
}

void StreamWorker::Impl::request_stop() {
  const int n = stops.fetch_add(1) + 1;
  soft.request_stop();
  if (n >= 2) hard.request_stop();
  asio::post(client.get_executor(), [self = shared_from_this()] {
    self->wake.cancel();
    self->pause.cancel();
  });
}

std::int64_t StreamWorker::Impl::finished() const {
  std::lock_guard lk(mu);
  return st.finished();
}

bool StreamWorker::Impl::limit_reached() const { return o.max_jobs > 0 && finished() >= o.max_jobs; }

awaitable<void> StreamWorker::Impl::wait_on(asio::steady_timer& t, Clock::time_point until) {
  t.expires_at(until);
  co_await t.async_wait(asio::as_tuple(use_awaitable));
}

// Jobs that max_jobs could still need, beyond those already taken.
std::int64_t StreamWorker::Impl::wanted() const {
  if (o.max_jobs <= 0) return std::numeric_limits<std::int64_t>::max();
  return o.max_jobs - finished() - in_flight - acting - static_cast<std::int64_t>(ready.size());
}

// Room: a free slot for each job not running, and as many read ahead. Not
// with limits: a job read ahead waits behind the slots that wait for their
// turn, untouched (keep_held touches only those), and would look stalled to
// the other workers' reclaim scans; the limits, not a read's round trip, set
// the pace then.
std::int64_t StreamWorker::Impl::room() const {
  const std::int64_t ahead = o.rates.empty() && o.concurrency_per.empty() ? o.concurrency : 0;
  const std::int64_t free = o.concurrency + ahead - in_flight - static_cast<std::int64_t>(ready.size());
  return std::min(free, wanted());
}

// A slot is free: the next read-ahead job starts in it (unless the worker
// is stopping).
// g++ 12 inlines the coroutine's frame allocation into the lambda below and
// then warns that Asio's frame operator delete does not match it, which is
// false (the same -Wmismatched-new-delete bench_ops.cpp silences).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void StreamWorker::Impl::start_next() {
  while (in_flight < o.concurrency && !ready.empty() && !soft.stop_requested()) {
    ++in_flight;
    // Taken off the queue before it starts, and started from the loop's
    // queue, not inline: a job that ends without waiting (a malformed one)
    // would otherwise start the next from inside this call, and so on down
    // the stack.
    asio::post(loop, [self = shared_from_this(), j = std::move(ready.front())]() mutable {
      asio::co_spawn(self->loop, self->handle(std::move(j)), asio::detached);
    });
    ready.pop_front();
  }
}
#pragma GCC diagnostic pop

// The slot is free once the effect is over: the next job's claim goes out
// with this job's finish (one round trip per job at concurrency 1, not two)
// and its acknowledgement. A run that ends before any effect (busy, done
// already, refused) frees it at its end.
void StreamWorker::Impl::free_slot(bool& freed) {
  if (freed) return;
  freed = true;
  --in_flight;
  ++acting;
  start_next();
  wake.cancel();
}

awaitable<void> StreamWorker::Impl::run() {
  loop = co_await asio::this_coro::executor;
  last_activity = Clock::now();
  milliseconds read_backoff{0};
  Clock::time_point last_reap{};
  while (!soft.stop_requested() && !limit_reached()) {
    if (o.unique_reap_interval.count() > 0 && Clock::now() - last_reap >= o.unique_reap_interval) {
      last_reap = Clock::now();
      co_await reap_unique();
    }
    const std::int64_t n = room();
    if (n <= 0) {
      co_await wait_on(wake, Clock::time_point::max());
      continue;
    }
    if (backoff.count() > 0) {
      co_await wait_on(pause, Clock::now() + backoff);
      if (soft.stop_requested()) break;
    }
    auto jobs = co_await read(n, read_backoff);
    if (!jobs) continue;
    count_stalled();
    if (jobs->empty()) {
      if (o.exit_when_idle.count() > 0 && in_flight == 0 && ready.empty() &&
          Clock::now() - last_activity >= o.exit_when_idle)
        break;
      continue;
    }
    last_activity = Clock::now();
    take_in(std::move(*jobs));
  }
  co_await hand_back_ready();
  while (in_flight > 0 || acting > 0) co_await wait_on(wake, Clock::time_point::max());
}

// Up to `room` jobs; empty when the read failed and its backoff was waited.
awaitable<std::optional<std::vector<StreamJob>>> StreamWorker::Impl::read(std::int64_t room,
                                                                          milliseconds& read_backoff) {
  try {
    auto jobs = co_await source.async_next(o.consumer, static_cast<std::size_t>(room), reader.get());
    read_backoff = milliseconds(0);
    co_return jobs;
  } catch (const Error& e) {
    // What retrying cannot mend (WRONGTYPE, NOPERM...) ends the worker;
    // a Redis that is down or restarting is waited out.
    if (e.next() != next_step::retry_call) throw;
    {
      std::lock_guard lk(mu);
      ++st.read_errors;
    }
    report_error("redis_unavailable", e);
  }
  read_backoff = std::clamp(read_backoff * 2, o.retry_backoff, o.retry_backoff_max);
  co_await wait_on(pause, Clock::now() + read_backoff);
  co_return std::nullopt;
}

void StreamWorker::Impl::take_in(std::vector<StreamJob> jobs) {
  for (auto& j : jobs) {
    // A job of ours that ran past claim_idle comes back from our own
    // reclaim scan while it is still in hand: a second run beside the
    // first would find its own lock busy, or its record and count the
    // same entry twice. It stays ours in the group either way.
    if (!held.insert(j.id).second) continue;
    ready.push_back(std::move(j));
  }
  start_next();
}

// Jobs in flight finish before the worker returns. Read-ahead jobs do not
// start once stopping (they would be told to shut down at once): they go
// back to the group for the next reclaim scan. At max_jobs there are none.
awaitable<void> StreamWorker::Impl::hand_back_ready() {
  if (!soft.stop_requested() || ready.empty()) co_return;
  std::vector<std::string> ids;
  for (auto& j : ready) {
    held.erase(j.id);
    ids.push_back(j.id);
  }
  ready.clear();
  try {
    co_await source.async_hand_back(o.consumer, std::move(ids));
  } catch (const std::exception&) {
    // Unreachable Redis: they stay pending and are reclaimed after claim_idle.
  }
}

// One delivery: its facts gathered (limits, then the run), judged
// (worker_decide.hpp), applied and reported.
awaitable<void> StreamWorker::Impl::handle(StreamJob job) {
  const auto began = Clock::now();
  count_started();
  const delivery::Plan plan = delivery::plan(job, o.id_field, o.run_field);
  WorkItem item(job, soft.get_token(), hard.get_token());
  bool slot_freed = false;
  delivery::Facts facts;
  std::string lock_key;
  std::vector<Lease> permits;
  if (plan.runnable() && (!o.concurrency_per.empty() || !o.rates.empty())) {
    facts.limited = co_await pass_limits(job, permits, facts.taken_over);
    facts.stopping = soft.stop_requested();
  }
  if (plan.runnable() && !facts.limited) co_await run_unit(job, plan, item, slot_freed, facts, lock_key);
  const delivery::Verdict verdict = delivery::judge(plan, facts);
  // Held for the run only: the next job of the key may start while this
  // one's acknowledgement is on its way.
  co_await release_permits(permits);
  if (facts.ran && lock_key.empty() && !facts.run.fail_open) lock_key = runner.lock_key_for(plan.unit.id);

  backoff = delivery::pause_after_verdict(backoff, verdict.decision.action, o.retry_backoff, o.retry_backoff_max);
  free_slot(slot_freed);
  const delivery::Applied applied = co_await apply(job, verdict);
  backoff = delivery::pause_after_applied(backoff, verdict.decision.action, applied);
  if (delivery::release_unique_after(plan, applied)) co_await release_unique(plan.unique_lock, job.id);

  report(job, plan, facts, verdict, applied, lock_key, began);
  held.erase(job.id);
  --acting;
  last_activity = Clock::now();
  wake.cancel();
}

// The unit's run through the runner and the effect, into `facts`.
awaitable<void> StreamWorker::Impl::run_unit(const StreamJob& job, const delivery::Plan& plan, WorkItem& item,
                                             bool& slot_freed, delivery::Facts& facts, std::string& lock_key) {
  auto enter = [&](JobContext& ctx) {
    item.ctx_ = &ctx;
    lock_key = ctx.lock_key();
    if (plan.release_at_start) release_unique_soon(plan.unique_lock, job.id);
  };
  try {
    // The effects are named, not temporaries in the co_await: g++ 12
    // destroys such temporaries twice.
    if (async_effect) {
      AsyncEffect effect = [&](JobContext& ctx) -> asio::awaitable<std::string> {
        enter(ctx);
        std::string result = co_await async_effect(item);
        free_slot(slot_freed);
        co_return result;
      };
      facts.run = co_await runner.async_run(plan.unit, std::move(effect), pool->get_executor());
    } else {
      Effect effect = [&](JobContext& ctx) {
        enter(ctx);
        return sync_effect(item);
      };
      facts.run = co_await runner.async_run(plan.unit, std::move(effect), pool->get_executor());
    }
    facts.ran = true;
    item.ctx_ = nullptr;
  } catch (const Error& e) {
    // A unit the runner refuses (an id the key pattern cannot take): no
    // delivery can succeed as it is.
    facts.refused = e.what();
  }
  facts.left_pending = item.left_pending();
  facts.left_pending_reason = item.left_pending_reason();
}

StreamWorker::StreamWorker(redis::Client& client, StreamOptions stream, GuardedRunner& runner, AsyncJobEffect effect,
                           WorkerOptions options)
    : impl_(std::make_shared<Impl>(client, std::move(stream), runner, std::move(effect), JobEffect{},
                                   std::move(options))) {}
StreamWorker::StreamWorker(redis::Client& client, StreamOptions stream, GuardedRunner& runner, JobEffect effect,
                           WorkerOptions options)
    : impl_(std::make_shared<Impl>(client, std::move(stream), runner, AsyncJobEffect{}, std::move(effect),
                                   std::move(options))) {}

StreamWorker::~StreamWorker() {
  // Blocking effects finish before the pool's threads are joined.
  impl_->pool->join();
}

void StreamWorker::run() {
  if (impl_->client.running_in_loop_thread())
    throw Error(errc::invalid_argument, "stream worker: run() blocks; on the event loop use async_run");
  asio::co_spawn(impl_->client.get_executor(), async_run(), asio::use_future).get();
}

awaitable<void> StreamWorker::async_run() {
  auto self = impl_;  // the coroutine keeps the state alive
  co_await self->source.async_ensure_group();
  co_await self->run();
}

void StreamWorker::stop() { impl_->request_stop(); }
bool StreamWorker::stopping() const noexcept { return impl_->soft.stop_requested(); }

WorkerStats StreamWorker::stats() const {
  std::lock_guard lk(impl_->mu);
  return impl_->st;
}

const std::string& StreamWorker::consumer() const noexcept { return impl_->o.consumer; }
StreamSource& StreamWorker::source() noexcept { return impl_->source; }

}  // namespace jobguard::job
