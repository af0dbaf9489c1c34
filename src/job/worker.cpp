#include "jobguard/job/worker.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <cctype>
#include <mutex>
#include <optional>
#include <set>

#include "job/awaiting.hpp"
#include "jobguard/error.hpp"
#include "jobguard/job/supervisor.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/event_log.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::job {

namespace job_scripts {
extern const std::string_view rate_take;
}  // namespace job_scripts

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string_view to_string(Action a) noexcept {
  switch (a) {
    case Action::ack: return "ack";
    case Action::fail: return "fail";
    case Action::leave_pending: return "leave_pending";
    case Action::retry_later: return "retry_later";
    case Action::dead_letter: return "dead_letter";
  }
  return "?";
}

Decision decide(const RunResult& r, bool left_pending) {
  if (left_pending) return {Action::leave_pending, r.detail};
  switch (r.outcome) {
    case Outcome::completed:
    case Outcome::already_done:
      return {Action::ack, r.outcome == Outcome::already_done ? r.detail : std::string()};
    case Outcome::failed:
      // The effect threw, or its records could not be written: an attempt
      // that counts toward max_attempts.
      return {Action::fail, r.detail};
    case Outcome::in_doubt:
      // Committed or not, the record decides: the next delivery reads it
      // (already_done, or a clean run). Not an attempt of the effect's.
    case Outcome::busy:
    case Outcome::lease_lost:
    case Outcome::timed_out:
    case Outcome::stale:
      // Nothing was recorded; a later delivery (here or elsewhere) finishes it.
      return {Action::leave_pending, r.detail};
    case Outcome::redis_unavailable:
    case Outcome::postgres_unavailable:
      // The job is fine, a backend is not: taking the next job at once would
      // only meet the same wall.
      return {Action::retry_later, r.detail};
  }
  return {Action::fail, r.detail};
}

std::string field_env_name(std::string_view field) {
  std::string s = "JOBGUARD_FIELD_";
  for (unsigned char c : field) s += std::isalnum(c) && c < 0x80 ? static_cast<char>(std::toupper(c)) : '_';
  return s;
}

// --- run_command ------------------------------------------------------------------

namespace {

awaitable<std::string> supervise(const CommandOptions& o, WorkItem& item) {
  JobContext& ctx = item.context();
  ctx.ensure();
  if (item.shutdown().stop_requested()) {
    item.leave_pending("worker stopping: CMD not started");
    throw std::runtime_error("worker stopping: CMD not started");
  }
  const StreamJob& job = item.job();
  SupervisorOptions so;
  so.argv = o.argv;
  so.grace = o.grace;
  so.env = {{"JOBGUARD_JOB_ID", job.id},
            {"JOBGUARD_KEY", ctx.lock_key()},
            {"JOBGUARD_IDEMPOTENCY_KEY", ctx.idempotency_key()}};
  if (ctx.fence()) so.env.emplace_back("JOBGUARD_FENCE", std::to_string(*ctx.fence()));
  for (const auto& [k, v] : job.fields) so.env.emplace_back(field_env_name(k), v);
  const bool renewed = ctx.lock_class().long_running;
  // A plain lock is not renewed: CMD past the lock's safe time would run
  // beside the next holder, so it is stopped there like on a lost lease.
  if (ctx.guarded() && !renewed) so.safe_time = std::max(milliseconds(1), ctx.safe_time_left());

  auto ex = co_await asio::this_coro::executor;
  // Shared with the stop callbacks, which may run on any thread and reach
  // the Supervisor only through a post to its executor.
  auto sup = std::make_shared<std::optional<Supervisor>>();
  bool interrupted = false;
  std::optional<std::stop_callback<std::function<void()>>> on_lost, on_shutdown, on_hard;
  const CmdOutcome out = co_await detail::await_done<CmdOutcome>([&](detail::Done<CmdOutcome> done) {
    sup->emplace(ex, std::move(so), [done](const CmdOutcome& c) { done(nullptr, c); });
    auto on_loop = [ex, weak = std::weak_ptr(sup)](auto act) {
      return std::function<void()>([ex, weak, act] {
        asio::post(ex, [weak, act] {
          if (auto s = weak.lock(); s && s->has_value() && !(*s)->done()) act(**s);
        });
      });
    };
    on_lost.emplace(ctx.stop_token(), std::function<void()>([stop = (*sup)->remote_stop()] {
                      stop(Ending::lease_lost, "lease lost or hard timeout");
                    }));
    on_shutdown.emplace(item.shutdown(), on_loop([&interrupted](Supervisor& s) {
                          interrupted = true;
                          s.forward(SIGTERM);
                        }));
    on_hard.emplace(item.hard_shutdown(), on_loop([](Supervisor& s) { s.kill(); }));
  });
  on_lost.reset();
  on_shutdown.reset();
  on_hard.reset();
  if (out.ending == Ending::failed_to_start) throw std::runtime_error(fmt::format("cannot run CMD: {}", out.detail));
  const bool stopped_by_runner = out.ending == Ending::lease_lost;
  if (out.status.shell_status() == 0 && !stopped_by_runner) co_return std::string();
  const std::string how = out.ending == Ending::stopped ? out.describe() : out.status.describe();
  if (interrupted) {
    // Our own shutdown stopped CMD: not the job's fault.
    item.leave_pending(fmt::format("interrupted by the worker's shutdown: {}", how));
    throw std::runtime_error(how);
  }
  if (stopped_by_runner)
    throw Error(errc::lease_lost, fmt::format("CMD stopped: {}; {}",
                                              renewed ? "lease lost or hard timeout" : "the lock's TTL ran out", how));
  throw std::runtime_error(how);
}

}  // namespace

AsyncJobEffect run_command(CommandOptions options) {
  if (options.argv.empty()) throw Error(errc::invalid_argument, "run_command: empty argv");
  auto o = std::make_shared<const CommandOptions>(std::move(options));
  return [o](WorkItem& item) { return supervise(*o, item); };
}

// --- StreamWorker -----------------------------------------------------------------

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

struct StreamWorker::Impl : std::enable_shared_from_this<Impl> {
  Impl(redis::Client& c, StreamOptions so, GuardedRunner& r, AsyncJobEffect ae, JobEffect se, WorkerOptions wo)
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

  redis::Client& client;
  std::unique_ptr<redis::Client> reader;
  StreamSource source;
  // Entry ids read ahead or in flight (the loop thread only).
  std::set<std::string> held;
  GuardedRunner& runner;
  AsyncJobEffect async_effect;
  JobEffect sync_effect;
  WorkerOptions o;
  std::unique_ptr<asio::thread_pool> pool;

  std::stop_source soft, hard;
  std::atomic<int> stops{0};

  // Event-loop state.
  asio::steady_timer wake;   // the reader waits on it for a free slot; a job's end cancels it
  asio::steady_timer pause;  // retry_later's backoff; stop() cancels it
  int in_flight = 0;  // jobs running (claimed, effect, finish): at most o.concurrency
  int acting = 0;     // jobs past their run whose stream action (XACK...) is on its way
  // Read ahead, not yet started: up to o.concurrency, so the next read is on
  // its way while the slots are busy, and a job ending starts the next at
  // once instead of after a read's round trip.
  std::deque<StreamJob> ready;
  asio::any_io_executor loop;
  milliseconds backoff{0};
  Clock::time_point last_activity{};

  mutable std::mutex mu;  // stats, read from any thread
  WorkerStats st;

  void request_stop() {
    const int n = stops.fetch_add(1) + 1;
    soft.request_stop();
    if (n >= 2) hard.request_stop();
    asio::post(client.get_executor(), [self = shared_from_this()] {
      self->wake.cancel();
      self->pause.cancel();
    });
  }

  std::int64_t finished() const {
    std::lock_guard lk(mu);
    return st.finished();
  }

  bool limit_reached() const { return o.max_jobs > 0 && finished() >= o.max_jobs; }

  awaitable<void> wait_on(asio::steady_timer& t, Clock::time_point until) {
    t.expires_at(until);
    co_await t.async_wait(asio::as_tuple(use_awaitable));
  }

  // Jobs that max_jobs could still need, beyond those already taken.
  std::int64_t wanted() const {
    if (o.max_jobs <= 0) return std::numeric_limits<std::int64_t>::max();
    return o.max_jobs - finished() - in_flight - acting - static_cast<std::int64_t>(ready.size());
  }

  // A slot is free: the next read-ahead job starts in it (unless the worker
  // is stopping).
  // g++ 12 inlines the coroutine's frame allocation into the lambda below and
  // then warns that Asio's frame operator delete does not match it, which is
  // false (the same -Wmismatched-new-delete bench_ops.cpp silences).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
  void start_next() {
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

  awaitable<void> run() {
    loop = co_await asio::this_coro::executor;
    last_activity = Clock::now();
    milliseconds read_backoff{0};
    Clock::time_point last_reap{};
    while (!soft.stop_requested() && !limit_reached()) {
      if (o.unique_reap_interval.count() > 0 && Clock::now() - last_reap >= o.unique_reap_interval) {
        last_reap = Clock::now();
        co_await reap_unique();
      }
      // Room: a free slot for each job not running, and as many read ahead.
      // Not with limits: a job read ahead waits behind the slots that wait
      // for their turn, untouched (keep_held touches only those), and would
      // look stalled to the other workers' reclaim scans; the limits, not
      // a read's round trip, set the pace then.
      const std::int64_t ahead = o.rates.empty() && o.concurrency_per.empty() ? o.concurrency : 0;
      std::int64_t room = o.concurrency + ahead - in_flight - static_cast<std::int64_t>(ready.size());
      room = std::min(room, wanted());
      if (room <= 0) {
        co_await wait_on(wake, Clock::time_point::max());
        continue;
      }
      if (backoff.count() > 0) {
        co_await wait_on(pause, Clock::now() + backoff);
        if (soft.stop_requested()) break;
      }
      std::vector<StreamJob> jobs;
      bool read_failed = false;
      try {
        jobs = co_await source.async_next(o.consumer, static_cast<std::size_t>(room), reader.get());
        read_backoff = milliseconds(0);
      } catch (const Error& e) {
        // What retrying cannot mend (WRONGTYPE, NOPERM...) ends the worker;
        // a Redis that is down or restarting is waited out.
        if (e.next() != next_step::retry_call) throw;
        read_failed = true;
        {
          std::lock_guard lk(mu);
          ++st.read_errors;
        }
        if (o.log)
          o.log->emit(observe::Event{.event = "error",
                                     .lock_class = runner.lock_class().name,
                                     .outcome = "redis_unavailable",
                                     .extra = {{"message", std::string(e.what())}}});
      }
      if (read_failed) {
        read_backoff = std::clamp(read_backoff * 2, o.retry_backoff, o.retry_backoff_max);
        co_await wait_on(pause, Clock::now() + read_backoff);
        continue;
      }
      count_stalled();
      if (jobs.empty()) {
        if (o.exit_when_idle.count() > 0 && in_flight == 0 && ready.empty() &&
            Clock::now() - last_activity >= o.exit_when_idle)
          break;
        continue;
      }
      last_activity = Clock::now();
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
    if (soft.stop_requested() && !ready.empty()) {
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
    while (in_flight > 0 || acting > 0) co_await wait_on(wake, Clock::time_point::max());
  }

  awaitable<void> reap_unique() {
    std::vector<std::pair<std::string, std::string>> freed;
    try {
      freed = co_await source.async_reap_unique(256);
    } catch (const std::exception& e) {
      // Redis away: the next interval tries again; orphans only wait longer.
      if (o.log)
        o.log->emit(observe::Event{.event = "error",
                                   .lock_class = runner.lock_class().name,
                                   .outcome = "unique_reap_failed",
                                   .extra = {{"message", std::string(e.what())}}});
      co_return;
    }
    {
      std::lock_guard lk(mu);
      st.unique_reaped += static_cast<std::int64_t>(freed.size());
    }
    if (o.log)
      for (const auto& [lock, holder] : freed)
        o.log->emit(observe::Event{.event = "unique_reaped",
                                   .lock_key = lock,
                                   .job_id = holder,
                                   .lock_class = runner.lock_class().name,
                                   .outcome = "reaped",
                                   .extra = {{"message", std::string("its job left the queue without releasing it")}}});
  }

  // A job that waits for a limit is pending with us but not started: without
  // a touch now and then, another worker's reclaim scan would take it over
  // as stalled after claim_idle and run it a second time (which, waiting for
  // the same limits, spends a turn of theirs on a run that then finds the job
  // done). False when it is no longer ours: stop waiting, the new holder has
  // it. A touch that fails (Redis away) is not that: the wait goes on, and
  // the limit's own call meets the outage.
  awaitable<bool> keep_held(const StreamJob& job, Clock::time_point& last_touch) {
    if (Clock::now() - last_touch < source.options().claim_idle / 3) co_return true;
    last_touch = Clock::now();
    try {
      co_return co_await source.async_touch(o.consumer, job.id);
    } catch (const std::exception&) {
      co_return true;
    }
  }

  // Waits until every rate limit lets `job` start. Empty when it may; else
  // why it may not start now (stopping, or Redis unreachable: the job is
  // then left for later, as any run that meets a backend down).
  awaitable<std::optional<std::string>> pass_rates(const StreamJob& job, Clock::time_point& last_touch,
                                                    bool& taken_over) {
    static const redis::Script take{std::string(job_scripts::rate_take)};
    for (const auto& rate : o.rates) {
      const std::string value = rate.field.empty() ? std::string() : job.field(rate.field);
      if (!rate.field.empty() && value.empty()) continue;
      const std::string key = rate_key(rate, runner.lock_class().name, value);
      const auto began = Clock::now();
      bool waited = false;
      for (;;) {
        redis::Reply r;
        try {
          std::vector<std::string> keys{key};
          std::vector<std::string> args{std::to_string(rate.interval().count())};
          r = co_await detail::eval_on_loop(client, take, std::move(keys), std::move(args), milliseconds(2000));
        } catch (const std::exception& e) {
          co_return fmt::format("rate limit {}: {}", key, e.what());
        }
        if (r.integer <= 0) break;
        waited = true;
        if (soft.stop_requested()) co_return std::string("stopping while waiting for rate limit ") + key;
        if (!co_await keep_held(job, last_touch)) {
          taken_over = true;
          co_return std::string("taken over by another consumer while waiting for rate limit ") + key;
        }
        // Short naps, so a stop is seen within 100 ms of being asked for.
        asio::steady_timer t(loop, std::min<std::chrono::microseconds>(std::chrono::microseconds(r.integer),
                                                                        std::chrono::milliseconds(100)));
        co_await t.async_wait(asio::as_tuple(use_awaitable));
      }
      if (waited) {
        std::lock_guard lk(mu);
        const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - began).count();
        ++st.rate_limited;
        st.rate_wait_ms += ms;
        runner.metrics().rate_limited_total.inc();
        runner.metrics().rate_limit_wait_ms_total.inc(static_cast<std::uint64_t>(ms));
      }
    }
    co_return std::nullopt;
  }

  // Takes a permit of every concurrency limit `job` names, waiting for each
  // in turn, into `permits`. Empty when all are held; else why the job may
  // not run now (stopping, or Redis unreachable or in quarantine: the job is
  // then left for later, as any run that meets a backend down) — the
  // permits taken so far are in `permits` and go back with the others.
  awaitable<std::optional<std::string>> take_permits(const StreamJob& job, std::vector<Lease>& permits,
                                                      Clock::time_point& last_touch, bool& taken_over) {
    const auto& leases = runner.leases();
    for (const auto& limit : o.concurrency_per) {
      const std::string value = job.field(limit.field);
      if (value.empty()) continue;
      const std::string resource = concurrency_resource(limit, value);
      LockOptions lo;
      lo.ttl = runner.lock_class().ttl;
      lo.lock_class = "concurrency";
      lo.permits = limit.count;
      const auto began = Clock::now();
      bool waited = false;
      std::optional<Lock> lock;
      for (;;) {
        try {
          lock = co_await detail::await_done<std::optional<Lock>>([&](auto granted) {
            leases->service().async_acquire(resource, lo,
                                            [granted = std::move(granted)](const Error& e, std::optional<Lock> l) {
                                              granted(e ? std::make_exception_ptr(e) : nullptr, std::move(l));
                                            });
          });
        } catch (const std::exception& e) {
          co_return fmt::format("concurrency limit {}: {}", resource, e.what());
        }
        if (lock) break;
        if (soft.stop_requested()) co_return std::string("stopping while waiting for concurrency limit ") + resource;
        if (!co_await keep_held(job, last_touch)) {
          taken_over = true;
          co_return std::string("taken over by another consumer while waiting for concurrency limit ") + resource;
        }
        // Tried once first, so only a job that found the permits taken counts
        // as limited; then waited for in rounds, so a stop is seen within
        // one and the job is touched (keep_held) well within claim_idle.
        // Each round joins the line at its end: first come, first served
        // within a round, not across rounds.
        waited = true;
        lo.wait = std::clamp(std::chrono::duration_cast<milliseconds>(source.options().claim_idle / 3),
                             milliseconds(20), milliseconds(2000));
      }
      if (waited) {
        std::lock_guard lk(mu);
        const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - began).count();
        ++st.concurrency_limited;
        st.concurrency_wait_ms += ms;
        runner.metrics().concurrency_limited_total.inc();
        runner.metrics().concurrency_limit_wait_ms_total.inc(static_cast<std::uint64_t>(ms));
      }
      permits.push_back(leases->adopt(std::move(*lock)));
      permits.back().on_lost([self = shared_from_this(), resource, id = job.id](LeaseState, const std::string& why) {
        {
          std::lock_guard lk(self->mu);
          ++self->st.concurrency_lost;
        }
        if (self->o.log)
          self->o.log->emit(observe::Event{.event = "error",
                                           .job_id = id,
                                           .lock_class = self->runner.lock_class().name,
                                           .outcome = "concurrency_permit_lost",
                                           .extra = {{"resource", resource}, {"message", why}}});
      });
      // A permit that came after the worker was told to stop: the job is
      // not started (it would be told to shut down at once).
      if (waited && soft.stop_requested())
        co_return std::string("stopping while waiting for concurrency limit ") + resource;
    }
    co_return std::nullopt;
  }

  // Gives the permits back, last taken first. A failed release is not the
  // job's failure: the permit's lease then runs out on the server.
  awaitable<void> release_permits(std::vector<Lease>& permits) {
    while (!permits.empty()) {
      try {
        co_await detail::await_done<bool>([&](auto done) {
          permits.back().async_release([done = std::move(done)](const Error& e, bool ours) {
            done(e ? std::make_exception_ptr(e) : nullptr, ours);
          });
        });
      } catch (const std::exception&) {
      }
      permits.pop_back();
    }
  }

  // Releases the unique lock `job` carries (if still its own). A failure is
  // logged, not thrown: the job's outcome stands, and the reaper frees the
  // lock once the job is gone.
  awaitable<void> release_unique(std::string lock, std::string job_id) {
    try {
      if (co_await source.async_release_unique(lock, job_id)) {
        std::lock_guard lk(mu);
        ++st.unique_released;
      }
    } catch (const std::exception& e) {
      if (o.log)
        o.log->emit(observe::Event{.event = "error",
                                   .lock_key = lock,
                                   .job_id = job_id,
                                   .lock_class = runner.lock_class().name,
                                   .outcome = "unique_release_failed",
                                   .extra = {{"message", std::string(e.what())}}});
    }
  }

  // The same without waiting for it, from wherever the job is (a blocking
  // effect's thread included). The state outlives the call (shared_from_this).
  void release_unique_soon(std::string lock, std::string job_id) {
    asio::co_spawn(loop, [self = shared_from_this(), lock = std::move(lock), job_id = std::move(job_id)]() mutable {
      return self->release_unique(std::move(lock), std::move(job_id));
    }, asio::detached);
  }

  // Jobs the source's reclaim scans dead-lettered as stalled (their
  // consumer died or hung max_attempts times) leave the queue through this
  // worker as surely as the ones it dead-letters itself: they count toward
  // max_jobs and the stats, and each gets its "job" line.
  void count_stalled() {
    for (auto& job : source.take_stalled()) {
      if (const auto lock = job.field(std::string(kUniqueKeyField)); !lock.empty() &&
          job.field(std::string(kUniqueStrategyField)) != to_string(UniqueStrategy::until_expired))
        release_unique_soon(lock, job.id);
      {
        std::lock_guard lk(mu);
        ++st.failed;
        ++st.dead_lettered;
      }
      if (o.log)
        o.log->emit(observe::Event{
            .event = "job",
            .job_id = job.id,
            .lock_class = runner.lock_class().name,
            .outcome = "dead_lettered",
            .extra = {{"unit", job.field(o.id_field)},
                      {"deliveries", job.deliveries},
                      {"reclaimed", true},
                      {"action", std::string("dead_lettered")},
                      {"message", fmt::format("stalled: not acknowledged after {} deliveries", job.deliveries)}}});
    }
  }

  awaitable<void> handle(StreamJob job) {
    const auto t0 = Clock::now();
    Unit unit;
    RunResult r;
    Decision d;
    std::string lock_key;
    bool has_unit = false;
    WorkItem item(job, soft.get_token(), hard.get_token());
    // The slot is free once the effect is over: the next job's claim goes
    // out with this job's finish (one round trip per job at concurrency 1,
    // not two) and its acknowledgement. A run that ends before any effect
    // (busy, done already, refused) frees it at its end.
    bool slot_freed = false;
    auto free_slot = [&] {
      if (slot_freed) return;
      slot_freed = true;
      --in_flight;
      ++acting;
      start_next();
      wake.cancel();
    };
    {
      std::lock_guard lk(mu);
      ++st.jobs;
    }
    const bool has_id =
        std::any_of(job.fields.begin(), job.fields.end(), [&](const auto& f) { return f.first == o.id_field; });
    // A unique job (unique.hpp): until-and-while-executing gives its lock up
    // once its run is granted; the others that hold one, when the job leaves
    // the queue; while-executing turns a busy run into a conflict.
    const std::string unique = job.field(std::string(kUniqueStrategyField));
    const std::string unique_lock = job.field(std::string(kUniqueKeyField));
    const bool release_at_start =
        !unique_lock.empty() && unique == to_string(UniqueStrategy::until_and_while_executing);
    const bool release_at_end = !unique_lock.empty() && unique != to_string(UniqueStrategy::until_expired);
    bool unique_conflict = false;
    unit.id = job.field(o.id_field);
    unit.run_id = job.field(o.run_field);
    if (unit.run_id.empty()) unit.run_id = job.id;
    unit.job_id = job.id;
    std::optional<std::string> limited;
    std::vector<Lease> permits;
    Clock::time_point last_touch{};  // the first wait touches the job at once
    bool taken_over = false;
    if (has_id && !unit.id.empty() && !o.concurrency_per.empty())
      limited = co_await take_permits(job, permits, last_touch, taken_over);
    if (!limited && has_id && !unit.id.empty() && !o.rates.empty())
      limited = co_await pass_rates(job, last_touch, taken_over);
    if (!has_id || unit.id.empty()) {
      d = {Action::dead_letter, has_id ? fmt::format("job field \"{}\" is empty", o.id_field)
                                       : fmt::format("job has no field \"{}\"", o.id_field)};
    } else if (limited) {
      // Not run: a job over its rate limit is never dropped or failed.
      d = {soft.stop_requested() || taken_over ? Action::leave_pending : Action::retry_later, std::move(*limited)};
    } else {
      try {
        // The effects are named, not temporaries in the co_await: g++ 12
        // destroys such temporaries twice.
        if (async_effect) {
          AsyncEffect effect = [&](JobContext& ctx) -> asio::awaitable<std::string> {
            item.ctx_ = &ctx;
            lock_key = ctx.lock_key();
            if (release_at_start) release_unique_soon(unique_lock, job.id);
            std::string result = co_await async_effect(item);
            free_slot();
            co_return result;
          };
          r = co_await runner.async_run(unit, std::move(effect), pool->get_executor());
        } else {
          Effect effect = [&](JobContext& ctx) {
            item.ctx_ = &ctx;
            lock_key = ctx.lock_key();
            if (release_at_start) release_unique_soon(unique_lock, job.id);
            return sync_effect(item);
          };
          r = co_await runner.async_run(unit, std::move(effect), pool->get_executor());
        }
        has_unit = true;
        item.ctx_ = nullptr;
        d = decide(r, item.left_pending());
        if (item.left_pending()) d.reason = item.left_pending_reason();
        if (unique == to_string(UniqueStrategy::while_executing) && r.outcome == Outcome::busy &&
            !item.left_pending()) {
          unique_conflict = true;
          const bool drop = job.field(std::string(kUniqueConflictField)) == to_string(UniqueConflict::log);
          d = {drop ? Action::ack : Action::dead_letter,
               fmt::format("unique (while-executing): unit \"{}\" was running in another job", unit.id)};
        }
      } catch (const Error& e) {
        // A unit the runner refuses (an id the key pattern cannot take):
        // no delivery can succeed as it is.
        d = {Action::dead_letter, e.what()};
      }
    }
    // Held for the run only: the next job of the key may start while this
    // one's acknowledgement is on its way.
    co_await release_permits(permits);
    if (has_unit && lock_key.empty() && !r.fail_open) lock_key = runner.lock_key_for(unit.id);

    if (d.action == Action::retry_later) backoff = std::clamp(backoff * 2, o.retry_backoff, o.retry_backoff_max);
    free_slot();

    std::string applied, action_error;
    bool dead = false;
    try {
      switch (d.action) {
        case Action::ack:
          // With the other jobs acknowledged in this turn: one XACK.
          co_await source.async_ack_gathered(job.id);
          applied = "acked";
          break;
        case Action::fail:
          dead = co_await source.async_fail(job, d.reason);
          applied = dead ? "dead_lettered" : "left_pending";
          break;
        case Action::dead_letter:
          co_await source.async_dead_letter(job, d.reason);
          dead = true;
          applied = "dead_lettered";
          break;
        case Action::leave_pending:
          if (has_unit && !item.left_pending() && (r.outcome == Outcome::busy || r.outcome == Outcome::timed_out)) {
            try {
              co_await source.async_defer(o.consumer, job);
            } catch (const std::exception&) {
              // Still pending, with this delivery charged: at worst it is
              // dead-lettered as stalled a delivery early.
            }
          }
          applied = "left_pending";
          break;
        case Action::retry_later:
          applied = "left_pending";
          break;
      }
    } catch (const std::exception& e) {
      // Redis went away between the run and its action: the job stays
      // pending and comes back (its completion record makes that a skip).
      action_error = e.what();
      applied = "left_pending";
      dead = false;
    }
    if (d.action != Action::retry_later && action_error.empty()) backoff = milliseconds(0);
    if (release_at_end && action_error.empty() && (applied == "acked" || dead))
      co_await release_unique(unique_lock, job.id);

    const bool ran = has_unit;
    {
      std::lock_guard lk(mu);
      if (!action_error.empty() || d.action == Action::leave_pending || d.action == Action::retry_later) {
        ++st.left_pending;
      } else if (d.action == Action::ack) {
        ++(r.outcome == Outcome::already_done || unique_conflict ? st.skipped : st.completed);
      } else {
        ++st.failed;
        if (dead) ++st.dead_lettered;
      }
      if (unique_conflict) ++st.unique_conflicts;
    }
    const auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
    if (o.log) {
      std::string_view outcome;
      if (!action_error.empty()) outcome = "action_failed";
      else if (d.action == Action::ack) outcome = r.outcome == Outcome::already_done ? "skipped" : "completed";
      else if (d.action == Action::fail || d.action == Action::dead_letter) outcome = dead ? "dead_lettered" : "failed";
      else if (item.left_pending()) outcome = "interrupted";
      else outcome = to_string(r.outcome);
      std::vector<std::pair<std::string, observe::FieldValue>> extra{
          {"unit", unit.id}, {"run_id", unit.run_id}, {"deliveries", job.deliveries}};
      if (job.reclaimed) extra.emplace_back("reclaimed", true);
      if (ran && r.fail_open) extra.emplace_back("fail_open", true);
      if (ran && r.fence) extra.emplace_back("fence", *r.fence);
      extra.emplace_back("action", applied);
      const std::string& msg = action_error.empty() ? d.reason : action_error;
      if (!msg.empty()) extra.emplace_back("message", msg);
      o.log->emit(observe::Event{.event = "job",
                                 .lock_key = lock_key,
                                 .job_id = job.id,
                                 .lock_class = runner.lock_class().name,
                                 .outcome = outcome,
                                 .elapsed_ms = std::chrono::duration<double, std::milli>(elapsed).count(),
                                 .extra = std::move(extra)});
    }
    if (o.on_job) {
      try {
        o.on_job(JobReport{&job, ran ? &unit : nullptr, ran ? &r : nullptr, d, dead, action_error, elapsed});
      } catch (...) {
        // A caller's bookkeeping must not take the worker down.
      }
    }
    held.erase(job.id);
    --acting;
    last_activity = Clock::now();
    wake.cancel();
  }
};

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
