// `jobguard jobs work`: a worker process. The flags declare a lock class (or
// --catalog names one); each job runs CMD through the library's
// job::StreamWorker (job::GuardedRunner + job::run_command), up to
// --concurrency at once. This file only parses, wires and reports.
//
// Threads: the Redis client's event loop runs the worker and every CMD's
// supervision; a thread of this file runs StreamWorker::run(), and the main
// thread waits for SIGINT/SIGTERM and turns them into stop().
#include <fmt/format.h>
#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <exception>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cli.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "jobguard/guard/completion.hpp"
#include "jobguard/guard/idempotency.hpp"
#include "jobguard/job/catalog.hpp"
#include "jobguard/job/lock_class.hpp"
#include "jobguard/job/runner.hpp"
#include "jobguard/job/worker.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/event_log.hpp"
#include "jobguard/observe/fleet.hpp"
#include "jobguard/redis/client.hpp"
#include "postgres.hpp"

namespace asio = boost::asio;
using std::chrono::milliseconds;

namespace jobguard::cli {
namespace {

struct WorkArgs {
  std::string stream, group = "jobguard", consumer;
  std::string cls;
  std::string consequence = "moderate";
  std::string on_redis_down = "fail-closed";
  std::string ttl = "30s";
  std::string timeout;
  std::string claim_idle = "30s";
  int max_attempts = 5;
  int concurrency = 1;
  std::string id_field = "id", run_field = "run";
  std::string key_pattern;
  std::string grace = "10s";
  bool fence = false;
  std::int64_t max_jobs = 0;
  std::string exit_when_idle;
  std::string unique_reap_interval = "30s";
  std::vector<std::string> rates;  // --rate [FIELD=]N/PERIOD, repeatable
  std::vector<std::string> concurrency_per;  // --concurrency-per FIELD=N, repeatable
  std::string catalog;  // --catalog FILE: the class comes from it, not from the flags
  std::vector<std::string> cmd;
};

milliseconds flag_ms(const std::string& value, const char* name) {
  return value.empty() ? milliseconds(0) : parse_duration_ms(value, name);
}

// The lock class the flags declare, or the catalog's.
job::LockClass lock_class(const WorkArgs& a) {
  job::LockClass cls;
  if (!a.catalog.empty()) {
    // The catalog's declaration wins over the class flags: it is the one
    // place the team wrote the class down (docs/operations.md).
    cls = job::Catalog::load(a.catalog).get(a.cls);
  } else {
    cls.name = a.cls;
    cls.key_pattern = a.key_pattern.empty() ? a.cls + ":{id}" : a.key_pattern;
    const auto consequence = job::parse_consequence(a.consequence);
    if (!consequence)
      throw Error(errc::invalid_argument,
                  fmt::format("--consequence \"{}\": expected low or moderate", a.consequence));
    cls.consequence = *consequence;
    const auto policy = job::parse_redis_down_policy(a.on_redis_down);
    if (!policy)
      throw Error(errc::invalid_argument,
                  fmt::format("--on-redis-down \"{}\": expected fail-closed or fail-open", a.on_redis_down));
    cls.on_redis_down = *policy;
    cls.ttl = flag_ms(a.ttl, "--ttl");
    if (!a.timeout.empty()) {
      cls.long_running = true;
      cls.hard_timeout = flag_ms(a.timeout, "--timeout");
    }
    cls.fenced = a.fence;
    cls.owner = "jobguard jobs work";
    cls.protects = fmt::format("CMD `{}` for each job of stream {}", a.cmd.front(), a.stream);
  }
  if (cls.consequence == job::Consequence::high) {
    pg::require(fmt::format("class '{}' (consequence high)", cls.name));
    throw Error(errc::invalid_argument,
                fmt::format("class '{}' is high: it needs a PostgreSQL effect (use the library's GuardedRunner)",
                            cls.name));
  }
  cls.validate();
  return cls;
}

// The worker's options from the flags (log: where its lines go); throws
// invalid_argument (exit 64).
job::WorkerOptions worker_options(const WorkArgs& a, observe::EventLog& log) {
  job::WorkerOptions wo;
  wo.consumer = a.consumer;
  wo.concurrency = a.concurrency;
  wo.id_field = a.id_field;
  wo.run_field = a.run_field;
  wo.max_jobs = a.max_jobs;
  wo.exit_when_idle = flag_ms(a.exit_when_idle, "--exit-when-idle");
  wo.unique_reap_interval = flag_ms(a.unique_reap_interval, "--unique-reap-interval");
  for (const auto& r : a.rates) {
    try {
      wo.rates.push_back(job::parse_rate(r));
    } catch (const Error& e) {
      throw Error(errc::invalid_argument, fmt::format("--rate: {}", e.detail()));
    }
  }
  for (const auto& c : a.concurrency_per) {
    try {
      wo.concurrency_per.push_back(job::parse_concurrency(c));
    } catch (const Error& e) {
      throw Error(errc::invalid_argument, fmt::format("--concurrency-per: {}", e.detail()));
    }
  }
  wo.log = &log;
  return wo;
}

// The summary --json prints at exit.
std::string stats_json(const job::WorkerStats& st, bool by_signal) {
  return nlohmann::ordered_json{{"jobs", st.jobs},
                                {"completed", st.completed},
                                {"skipped", st.skipped},
                                {"failed", st.failed},
                                {"dead_lettered", st.dead_lettered},
                                {"left_pending", st.left_pending},
                                {"unique_released", st.unique_released},
                                {"unique_conflicts", st.unique_conflicts},
                                {"unique_reaped", st.unique_reaped},
                                {"rate_limited", st.rate_limited},
                                {"rate_wait_ms", st.rate_wait_ms},
                                {"concurrency_limited", st.concurrency_limited},
                                {"concurrency_wait_ms", st.concurrency_wait_ms},
                                {"concurrency_lost", st.concurrency_lost},
                                {"stopped_by_signal", by_signal}}
      .dump();
}

int run_work(const Globals& g, const WorkArgs& a) {
  // Everything a user can get wrong is checked before touching the network,
  // so a usage error is 64 even when Redis is down.
  if (a.cmd.empty()) throw Error(errc::invalid_argument, "no CMD given: put the command after `--`");
  const job::LockClass cls = lock_class(a);
  job::StreamOptions so;
  so.stream = a.stream;
  so.group = a.group;
  so.claim_idle = flag_ms(a.claim_idle, "--claim-idle");
  so.max_attempts = a.max_attempts;
  observe::EventLog log(observe::parse_log_format(g.log_format));
  job::WorkerOptions wo = worker_options(a, log);
  auto effect = job::run_command({.argv = a.cmd, .grace = flag_ms(a.grace, "--grace")});
  so.validate();
  wo.validate();

  // Signals are taken before the first blocking call: a SIGINT while
  // connecting stops the worker before its first job, it does not kill it.
  asio::io_context signal_loop;
  asio::signal_set signals(signal_loop, SIGINT, SIGTERM);

  auto client = connect_redis(g, "jobguard-worker");
  observe::FleetPublisher fleet(*client);  // the fleet's numbers; last batch sent on return
  auto leases = LeaseScheduler::create(LockService::create(*client));
  guard::RedisCompletionStore completions(*client);
  std::optional<guard::RedisIdempotencyStore> idempotency;
  job::RunnerBackends backends;
  backends.completions = &completions;
  if (cls.consequence == job::Consequence::moderate) backends.idempotency = &idempotency.emplace(*client);
  backends.log = &log;
  backends.worker = a.consumer;
  job::GuardedRunner runner(leases, cls, backends);
  job::StreamWorker worker(*client, so, runner, std::move(effect), wo);

  bool by_signal = false;
  std::function<void()> arm = [&] {
    signals.async_wait([&](boost::system::error_code ec, int sig) {
      if (ec) return;
      if (!by_signal)
        log.emit(observe::Event{.event = "stopping",
                                .outcome = "signal",
                                .extra = {{"signal", static_cast<std::int64_t>(sig)},
                                          {"message", std::string("stopping; running CMDs get SIGTERM and their jobs "
                                                                  "stay pending (again: SIGKILL)")}}});
      by_signal = true;
      worker.stop();
      arm();
    });
  };
  arm();
  std::exception_ptr failure;
  std::thread working([&] {
    try {
      worker.run();
    } catch (...) {
      failure = std::current_exception();
    }
    asio::post(signal_loop, [&] { signals.cancel(); });
  });
  signal_loop.run();
  working.join();
  if (failure) std::rethrow_exception(failure);

  if (g.json) std::cout << stats_json(worker.stats(), by_signal) << "\n";
  return exit_code::ok;
}

}  // namespace

void add_jobs_work(CLI::App& jobs, Globals& g, Commands& out) {
  auto w = std::make_shared<WorkArgs>();
  auto* work = jobs.add_subcommand("work", "Run CMD for each job, guarded as lock class NAME");
  work->fallthrough();
  work->footer(exit_status_help(
      "See `jobguard jobs --help` for the environment and outcomes.\n"
      "Exit status: 0 stopped by a signal, --max-jobs or --exit-when-idle; a job's failure is not the worker's."));
  work->add_option("--stream", w->stream, "Stream key (required)")->required();
  work->add_option("--class", w->cls, "Lock class name: metrics label and log field (required)")->required();
  work->add_option("--group", w->group, "Consumer group (created if missing)")->capture_default_str();
  work->add_option("--consumer", w->consumer, "Consumer name (default HOST-PID)");
  work->add_option("--consequence", w->consequence, "low (lock) or moderate (lock + idempotency key)")
      ->capture_default_str();
  work->add_option("--on-redis-down", w->on_redis_down, "fail-closed (job waits) or fail-open (runs unguarded)")
      ->capture_default_str();
  work->add_option("--ttl", w->ttl, "Lock TTL; CMD must end within it unless --timeout is given")
      ->check(duration_validator())
      ->capture_default_str();
  work->add_option("--timeout", w->timeout, "Renew the lock while CMD runs; stop CMD after DUR")
      ->check(duration_validator());
  work->add_option("--claim-idle", w->claim_idle, "Take over a job pending this long")
      ->check(duration_validator())
      ->capture_default_str();
  work->add_option("--max-attempts", w->max_attempts, "Deliveries before a failing job is dead-lettered")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  work->add_option("--concurrency", w->concurrency, "Jobs (CMDs) in flight at once, 1-4096")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  work->add_option("--id-field", w->id_field, "Job field with the unit id")->capture_default_str();
  work->add_option("--run-field", w->run_field, "Job field with the run id (default: the stream entry id)")
      ->capture_default_str();
  work->add_option("--key-pattern", w->key_pattern, "Lock resource; {id} is the unit id (default CLASS:{id})");
  work->add_option("--grace", w->grace, "Time between SIGTERM and SIGKILL when stopping CMD")
      ->check(duration_validator())
      ->capture_default_str();
  work->add_option("--catalog", w->catalog, "Lock catalog YAML: class NAME is declared there (overrides the class flags)");
  work->add_flag("--fence", w->fence, "Every grant carries a fencing token, exported as JOBGUARD_FENCE");
  work->add_option("--max-jobs", w->max_jobs, "Exit after N jobs finished: acknowledged or dead-lettered (0: no limit)")
      ->capture_default_str();
  work->add_option("--exit-when-idle", w->exit_when_idle, "Exit after DUR without a job")->check(duration_validator());
  work->add_option("--rate", w->rates,
                   "[FIELD=]N/PERIOD: at most N job starts per PERIOD (s, min, h or a duration) per value of FIELD, "
                   "or for the class; shared by every worker (repeatable)")
      ->allow_extra_args(false);
  work->add_option("--concurrency-per", w->concurrency_per,
                   "FIELD=N: at most N jobs with the same value of FIELD running at once, across every worker "
                   "(repeatable, one per field)")
      ->allow_extra_args(false);
  work->add_option("--unique-reap-interval", w->unique_reap_interval,
                   "Free unique locks whose job is gone this often (0: never)")
      ->check(duration_validator())
      ->capture_default_str();
  work->add_option("CMD", w->cmd, "The command and its arguments, after --")->required();
  out.emplace_back(work, reported("jobs work", [&g, w] {
                     // CLI11 rewrites a positional like "[a,b]" as a list: CMD's words are
                     // taken as typed, and only after `--`.
                     auto verbatim = cmd_after_dashes({"jobs", "work"});
                     if (!verbatim || verbatim->empty())
                       throw Error(errc::invalid_argument,
                                   "CMD must follow `--`: jobguard jobs work --stream S --class NAME [FLAGS] -- CMD");
                     w->cmd = std::move(*verbatim);
                     return run_work(g, *w);
                   }));
}

}  // namespace jobguard::cli
