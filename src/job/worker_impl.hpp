// Private to src/job: the stream worker's state, shared by its loop and the
// gathering of each delivery's facts (worker.cpp), the application of its
// verdict against Redis, limits and unique locks included (worker_apply.cpp),
// and its report to the stats, metrics, log and on_job (worker_report.cpp).
// The verdict itself is worker_decide.hpp's. Everything here runs on the
// client's event loop, but for the stats (under `mu`) and the stop sources.
#pragma once

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "job/worker_decide.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/job/worker.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::job {

struct StreamWorker::Impl : std::enable_shared_from_this<Impl> {
  using Clock = std::chrono::steady_clock;
  template <class T>
  using awaitable = boost::asio::awaitable<T>;

  Impl(redis::Client& c, StreamOptions so, GuardedRunner& r, AsyncJobEffect ae, JobEffect se, WorkerOptions wo);

  redis::Client& client;
  std::unique_ptr<redis::Client> reader;
  StreamSource source;
  // Entry ids read ahead or in flight (the loop thread only).
  std::set<std::string> held;
  GuardedRunner& runner;
  AsyncJobEffect async_effect;
  JobEffect sync_effect;
  WorkerOptions o;
  std::unique_ptr<boost::asio::thread_pool> pool;

  std::stop_source soft, hard;
  std::atomic<int> stops{0};

  // Event-loop state.
  boost::asio::steady_timer wake;   // the reader waits on it for a free slot; a job's end cancels it
  boost::asio::steady_timer pause;  // retry_later's backoff; stop() cancels it
  int in_flight = 0;  // jobs running (claimed, effect, finish): at most o.concurrency
  int acting = 0;     // jobs past their run whose stream action (XACK...) is on its way
  // Read ahead, not yet started: up to o.concurrency, so the next read is on
  // its way while the slots are busy, and a job ending starts the next at
  // once instead of after a read's round trip.
  std::deque<StreamJob> ready;
  boost::asio::any_io_executor loop;
  std::chrono::milliseconds backoff{0};
  Clock::time_point last_activity{};

  mutable std::mutex mu;  // stats, read from any thread
  WorkerStats st;

  // --- the loop and each delivery's facts (worker.cpp) ---
  void request_stop();
  std::int64_t finished() const;
  bool limit_reached() const;
  awaitable<void> wait_on(boost::asio::steady_timer& t, Clock::time_point until);
  std::int64_t wanted() const;
  std::int64_t room() const;
  void start_next();
  void free_slot(bool& freed);
  awaitable<void> run();
  awaitable<std::optional<std::vector<StreamJob>>> read(std::int64_t room, std::chrono::milliseconds& read_backoff);
  void take_in(std::vector<StreamJob> jobs);
  awaitable<void> hand_back_ready();
  awaitable<void> handle(StreamJob job);
  awaitable<void> run_unit(const StreamJob& job, const delivery::Plan& plan, WorkItem& item, bool& slot_freed,
                           delivery::Facts& facts, std::string& lock_key);

  // --- applying a verdict, limits and unique locks (worker_apply.cpp) ---
  awaitable<delivery::Applied> apply(const StreamJob& job, const delivery::Verdict& verdict);
  awaitable<std::optional<std::string>> pass_limits(const StreamJob& job, std::vector<Lease>& permits,
                                                    bool& taken_over);
  awaitable<bool> keep_held(const StreamJob& job, Clock::time_point& last_touch);
  awaitable<std::optional<std::string>> pass_rates(const StreamJob& job, Clock::time_point& last_touch,
                                                   bool& taken_over);
  awaitable<std::optional<std::string>> take_permits(const StreamJob& job, std::vector<Lease>& permits,
                                                     Clock::time_point& last_touch, bool& taken_over);
  awaitable<void> release_permits(std::vector<Lease>& permits);
  awaitable<void> release_unique(std::string lock, std::string job_id);
  void release_unique_soon(std::string lock, std::string job_id);
  awaitable<void> reap_unique();

  // --- reporting (worker_report.cpp) ---
  void count_started();
  void report(const StreamJob& job, const delivery::Plan& plan, const delivery::Facts& facts,
              const delivery::Verdict& verdict, const delivery::Applied& applied, const std::string& lock_key,
              Clock::time_point began);
  void count_stalled();
  void report_error(std::string_view outcome, const std::exception& e, std::string_view lock_key = {},
                    std::string_view job_id = {});
  void report_reaped(const std::vector<std::pair<std::string, std::string>>& freed);
  void report_rate_wait(Clock::time_point began);
  void report_concurrency_wait(Clock::time_point began);
  void watch_permit(Lease& permit, const std::string& resource, const std::string& job_id);
};

}  // namespace jobguard::job
