// The stream worker's apply step: a verdict carried out on the job's
// message, and what a delivery holds in Redis around its run (rate limits,
// concurrency permits, unique locks).
#include <fmt/format.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "job/awaiting.hpp"
#include "job/worker_impl.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/script.hpp"

namespace jobguard::job {

namespace job_scripts {
extern const std::string_view rate_take;
}  // namespace job_scripts

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using std::chrono::milliseconds;
using Clock = StreamWorker::Impl::Clock;

awaitable<delivery::Applied> StreamWorker::Impl::apply(const StreamJob& job, const delivery::Verdict& v) {
  using delivery::Landed;
  delivery::Applied a;
  try {
    switch (v.decision.action) {
      case Action::ack:
        // With the other jobs acknowledged in this turn: one XACK.
        co_await source.async_ack_gathered(job.id);
        a.landed = Landed::acked;
        break;
      case Action::fail:
        a.landed = co_await source.async_fail(job, v.decision.reason) ? Landed::dead_lettered : Landed::left_pending;
        break;
      case Action::dead_letter:
        co_await source.async_dead_letter(job, v.decision.reason);
        a.landed = Landed::dead_lettered;
        break;
      case Action::leave_pending:
        if (v.defer) {
          try {
            co_await source.async_defer(o.consumer, job);
          } catch (const std::exception&) {
            // Still pending, with this delivery charged: at worst it is
            // dead-lettered as stalled a delivery early.
          }
        }
        a.landed = Landed::left_pending;
        break;
      case Action::retry_later:
        a.landed = Landed::left_pending;
        break;
    }
  } catch (const std::exception& e) {
    // Redis went away between the run and its action: the job stays
    // pending and comes back (its completion record makes that a skip).
    a = {Landed::left_pending, e.what()};
  }
  co_return a;
}

awaitable<std::optional<std::string>> StreamWorker::Impl::pass_limits(const StreamJob& job, std::vector<Lease>& permits,
                                                                      bool& taken_over) {
  std::optional<std::string> limited;
  Clock::time_point last_touch{};  // the first wait touches the job at once
  if (!o.concurrency_per.empty()) limited = co_await take_permits(job, permits, last_touch, taken_over);
  if (!limited && !o.rates.empty()) limited = co_await pass_rates(job, last_touch, taken_over);
  co_return limited;
}

// A job that waits for a limit is pending with us but not started: without
// a touch now and then, another worker's reclaim scan would take it over
// as stalled after claim_idle and run it a second time (which, waiting for
// the same limits, spends a turn of theirs on a run that then finds the job
// done). False when it is no longer ours: stop waiting, the new holder has
// it. A touch that fails (Redis away) is not that: the wait goes on, and
// the limit's own call meets the outage.
awaitable<bool> StreamWorker::Impl::keep_held(const StreamJob& job, Clock::time_point& last_touch) {
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
awaitable<std::optional<std::string>> StreamWorker::Impl::pass_rates(const StreamJob& job,
                                                                     Clock::time_point& last_touch, bool& taken_over) {
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
    if (waited) report_rate_wait(began);
  }
  co_return std::nullopt;
}

// g++ 12 inlines the coroutine's frame allocation into this one's ramp and
// then warns that Asio's frame operator delete does not match it, which is
// false (see start_next in worker.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
// Takes a permit of every concurrency limit `job` names, waiting for each
// in turn, into `permits`. Empty when all are held; else why the job may
// not run now (stopping, or Redis unreachable or in quarantine: the job is
// then left for later, as any run that meets a backend down) — the
// permits taken so far are in `permits` and go back with the others.
awaitable<std::optional<std::string>> StreamWorker::Impl::take_permits(const StreamJob& job,
                                                                       std::vector<Lease>& permits,
                                                                       Clock::time_point& last_touch,
                                                                       bool& taken_over) {
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
    if (waited) report_concurrency_wait(began);
    permits.push_back(leases->adopt(std::move(*lock)));
    watch_permit(permits.back(), resource, job.id);
    // A permit that came after the worker was told to stop: the job is
    // not started (it would be told to shut down at once).
    if (waited && soft.stop_requested())
      co_return std::string("stopping while waiting for concurrency limit ") + resource;
  }
  co_return std::nullopt;
}
#pragma GCC diagnostic pop

// Gives the permits back, last taken first. A failed release is not the
// job's failure: the permit's lease then runs out on the server.
awaitable<void> StreamWorker::Impl::release_permits(std::vector<Lease>& permits) {
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
awaitable<void> StreamWorker::Impl::release_unique(std::string lock, std::string job_id) {
  try {
    if (co_await source.async_release_unique(lock, job_id)) {
      std::lock_guard lk(mu);
      ++st.unique_released;
    }
  } catch (const std::exception& e) {
    report_error("unique_release_failed", e, lock, job_id);
  }
}

// The same without waiting for it, from wherever the job is (a blocking
// effect's thread included). The state outlives the call (shared_from_this).
void StreamWorker::Impl::release_unique_soon(std::string lock, std::string job_id) {
  asio::co_spawn(loop, [self = shared_from_this(), lock = std::move(lock), job_id = std::move(job_id)]() mutable {
    return self->release_unique(std::move(lock), std::move(job_id));
  }, asio::detached);
}

awaitable<void> StreamWorker::Impl::reap_unique() {
  std::vector<std::pair<std::string, std::string>> freed;
  try {
    freed = co_await source.async_reap_unique(256);
  } catch (const std::exception& e) {
    // Redis away: the next interval tries again; orphans only wait longer.
    report_error("unique_reap_failed", e);
    co_return;
  }
  report_reaped(freed);
}

}  // namespace jobguard::job
