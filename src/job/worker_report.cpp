// The stream worker's report step: each delivery's share of the stats and
// metrics, its "job" event and the caller's on_job; and the events of the
// worker's own errors, waits and reaps.
#include <fmt/format.h>

#include "job/worker_impl.hpp"
#include "jobguard/observe/event_log.hpp"
#include "jobguard/observe/metrics.hpp"

namespace jobguard::job {

using std::chrono::milliseconds;
using Clock = StreamWorker::Impl::Clock;

void StreamWorker::Impl::count_started() {
  std::lock_guard lk(mu);
  ++st.jobs;
}

void StreamWorker::Impl::report(const StreamJob& job, const delivery::Plan& plan, const delivery::Facts& f,
                                const delivery::Verdict& v, const delivery::Applied& a, const std::string& lock_key,
                                Clock::time_point began) {
  {
    std::lock_guard lk(mu);
    delivery::tally(st, f, v, a);
  }
  const auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - began);
  if (o.log) {
    std::vector<std::pair<std::string, observe::FieldValue>> extra{
        {"unit", plan.unit.id}, {"run_id", plan.unit.run_id}, {"deliveries", job.deliveries}};
    if (job.reclaimed) extra.emplace_back("reclaimed", true);
    if (f.ran && f.run.fail_open) extra.emplace_back("fail_open", true);
    if (f.ran && f.run.fence) extra.emplace_back("fence", *f.run.fence);
    extra.emplace_back("action", std::string(delivery::to_string(a.landed)));
    const std::string& msg = a.error.empty() ? v.decision.reason : a.error;
    if (!msg.empty()) extra.emplace_back("message", msg);
    o.log->emit(observe::Event{.event = "job",
                               .lock_key = lock_key,
                               .job_id = job.id,
                               .lock_class = runner.lock_class().name,
                               .outcome = delivery::outcome_name(f, v, a),
                               .elapsed_ms = std::chrono::duration<double, std::milli>(elapsed).count(),
                               .extra = std::move(extra)});
  }
  if (o.on_job) {
    try {
      o.on_job(JobReport{&job, f.ran ? &plan.unit : nullptr, f.ran ? &f.run : nullptr, v.decision, a.dead(), a.error,
                         elapsed});
    } catch (...) {
      // A caller's bookkeeping must not take the worker down.
    }
  }
}

// Jobs the source's reclaim scans dead-lettered as stalled (their
// consumer died or hung max_attempts times) leave the queue through this
// worker as surely as the ones it dead-letters itself: they count toward
// max_jobs and the stats, and each gets its "job" line.
void StreamWorker::Impl::count_stalled() {
  for (auto& job : source.take_stalled()) {
    if (const auto p = delivery::plan(job, o.id_field, o.run_field); p.release_at_end)
      release_unique_soon(p.unique_lock, job.id);
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

void StreamWorker::Impl::report_error(std::string_view outcome, const std::exception& e, std::string_view lock_key,
                                      std::string_view job_id) {
  if (o.log)
    o.log->emit(observe::Event{.event = "error",
                               .lock_key = lock_key,
                               .job_id = job_id,
                               .lock_class = runner.lock_class().name,
                               .outcome = outcome,
                               .extra = {{"message", std::string(e.what())}}});
}

void StreamWorker::Impl::report_reaped(const std::vector<std::pair<std::string, std::string>>& freed) {
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

void StreamWorker::Impl::report_rate_wait(Clock::time_point began) {
  std::lock_guard lk(mu);
  const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - began).count();
  ++st.rate_limited;
  st.rate_wait_ms += ms;
  runner.metrics().rate_limited_total.inc();
  runner.metrics().rate_limit_wait_ms_total.inc(static_cast<std::uint64_t>(ms));
}

void StreamWorker::Impl::report_concurrency_wait(Clock::time_point began) {
  std::lock_guard lk(mu);
  const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - began).count();
  ++st.concurrency_limited;
  st.concurrency_wait_ms += ms;
  runner.metrics().concurrency_limited_total.inc();
  runner.metrics().concurrency_limit_wait_ms_total.inc(static_cast<std::uint64_t>(ms));
}

// A permit lost while its job runs (Redis unreachable past the lease) is
// counted and logged; the job is not stopped for it.
void StreamWorker::Impl::watch_permit(Lease& permit, const std::string& resource, const std::string& job_id) {
  permit.on_lost([self = shared_from_this(), resource, id = job_id](LeaseState, const std::string& why) {
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
}

}  // namespace jobguard::job
