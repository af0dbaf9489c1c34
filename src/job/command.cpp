// run_command: the AsyncJobEffect that runs CMD under a job::Supervisor per
// job, stopped when the lease is lost or the worker shuts down.
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <cctype>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <stop_token>

#include "job/awaiting.hpp"
#include "jobguard/error.hpp"
#include "jobguard/job/supervisor.hpp"
#include "jobguard/job/worker.hpp"

namespace jobguard::job {

namespace asio = boost::asio;
using asio::awaitable;
using std::chrono::milliseconds;

std::string field_env_name(std::string_view field) {
  std::string s = "JOBGUARD_FIELD_";
  for (unsigned char c : field) s += std::isalnum(c) && c < 0x80 ? static_cast<char>(std::toupper(c)) : '_';
  return s;
}

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
  if (ctx.permit_slot()) {
    so.env.emplace_back("JOBGUARD_PERMITS", std::to_string(ctx.permits()));
    so.env.emplace_back("JOBGUARD_PERMIT_SLOT", std::to_string(*ctx.permit_slot()));
  }
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

}  // namespace jobguard::job
