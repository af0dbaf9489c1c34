// `jobguard jobs`: enqueue, inspect and work a Redis Streams job queue
// (job::StreamSource). `work` is a worker process: each job runs CMD through
// job::GuardedRunner, guarded as the lock class declared by its flags.
//
// Threads: the main thread does everything a worker decides. It blocks in
// StreamSource::next and GuardedRunner::run, and runs one io_context (the
// child process, SIGINT/SIGTERM) while CMD runs and briefly between jobs. The
// Redis client runs its own loop thread; the runner's stop requests (lease
// lost, hard timeout) may come from there and reach CMD only by a post to the
// main io_context.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cctype>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <system_error>

#include "cli.hpp"
#include "jobguard/observe/fleet.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "jobguard/guard/completion.hpp"
#include "jobguard/guard/idempotency.hpp"
#include "jobguard/job/catalog.hpp"
#include "jobguard/job/lock_class.hpp"
#include "jobguard/job/supervisor.hpp"
#include "jobguard/job/runner.hpp"
#include "jobguard/job/stream_source.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/event_log.hpp"
#include "jobguard/redis/client.hpp"

namespace asio = boost::asio;
using namespace std::chrono;

namespace jobguard::cli {
namespace {

constexpr const char* kJobsHelp = R"(A job queue on a Redis Stream with a consumer group (at-least-once).

  jobguard jobs add  --stream S [--group G] FIELD=VALUE...
  jobguard jobs ls   --stream S [--group G] [--count 100]
  jobguard jobs dead --stream S [--count 100]
  jobguard jobs work --stream S --class NAME [--group G] [--consumer NAME]
                     [--consequence low|moderate] [--on-redis-down fail-closed|fail-open]
                     [--ttl 30s] [--timeout DUR] [--claim-idle 30s] [--max-attempts 5]
                     [--id-field id] [--run-field run] [--key-pattern CLASS:{id}]
                     [--grace 10s] [--fence] [--max-jobs N] [--exit-when-idle DUR]
                     [--catalog FILE]
                     -- CMD [ARGS...]

add   appends one job (XADD) and prints its id ({"id":...} with --json).
ls    the stream's length, the group's pending jobs (id, consumer, idle time,
      deliveries) and the dead-letter stream's length.
dead  the dead-letter entries (newest first): the job's fields, its last error
      and how many times it was delivered.
work  takes jobs one at a time and runs CMD for each, guarded as the lock
      class NAME that its flags declare (docs/jobs.md), or that the lock
      catalog FILE declares with --catalog (then the class flags are ignored):
        the unit id is the job's --id-field (a job without it fails with that
        error), the run id its --run-field or else the stream entry id; a unit
        completes once per run id (a completion record in Redis).
        low: Redis lock with --ttl; moderate (the default): lock + an
        idempotency key claimed in Redis before CMD runs.
        --timeout DUR makes the lock a renewing lease and stops CMD after DUR
        (for a CMD that may outlive --ttl); without it CMD must end within --ttl.
      CMD runs in its own process group with, added to its environment:
        JOBGUARD_JOB_ID           the stream entry id
        JOBGUARD_KEY              the Redis key of the lock (empty when fail-open)
        JOBGUARD_IDEMPOTENCY_KEY  class/resource/run_id: pass it downstream
        JOBGUARD_FENCE            the fencing token (with --fence)
        JOBGUARD_FIELD_<NAME>     each job field (NAME upper-cased, other than
                                  A-Z and 0-9 -> '_')
      CMD exits 0: the job is acknowledged. Non-zero: the attempt failed; after
      --max-attempts deliveries the job moves to the dead-letter stream with
      the error ("exit status 3"). Lock busy, lease lost, timeout, Redis
      unavailable: the job stays pending and is taken over after --claim-idle.
      Already done: acknowledged without running CMD ("skipped").
      When the lease is lost or --timeout passes, CMD's group gets SIGTERM and
      SIGKILL after --grace. SIGINT/SIGTERM stop the worker: the running CMD
      gets SIGTERM (a second signal: SIGKILL), its job stays pending, exit 0.
      One log line per job on stderr (--log-format human|json); with --json a
      summary object on stdout at exit.

--max-jobs N counts jobs that left the queue (acknowledged or dead-lettered);
--exit-when-idle DUR stops after DUR in which no job was delivered.

Exit status: 0 ok (work: stopped by a signal, --max-jobs or --exit-when-idle);
64 usage (bad FIELD=VALUE, unknown --consequence or --on-redis-down, missing
--stream, --class or CMD); 69 Redis unreachable.)";

using Fields = std::vector<std::pair<std::string, std::string>>;

milliseconds to_ms(microseconds d) { return duration_cast<milliseconds>(d); }

milliseconds duration_flag(const std::string& value, const char* name) { return to_ms(parse_duration(value, name)); }

// The client, checked with a PING within the connect deadline: an unreachable
// Redis is exit 69 before anything else happens.
std::unique_ptr<redis::Client> connect(const Globals& g, const char* client_name) {
  auto conn = redis::parse_url(g.redis_url);
  if (conn.client_name.empty()) conn.client_name = client_name;
  auto client = std::make_unique<redis::Client>(conn);
  try {
    client->exec(redis::Command{"PING"}, redis::CallOptions{conn.connect_timeout});
  } catch (const Error& e) {
    throw Error(errc::redis_unavailable, fmt::format("cannot reach Redis at {}: {}", redis::to_display_url(conn), e.what()));
  }
  return client;
}

bool is_nogroup(const Error& e) { return std::string_view(e.what()).find("NOGROUP") != std::string_view::npos; }

nlohmann::ordered_json fields_json(const Fields& fields) {
  auto j = nlohmann::ordered_json::object();
  for (const auto& [k, v] : fields) j[k] = v;
  return j;
}

std::string fields_text(const Fields& fields) {
  std::string s;
  for (const auto& [k, v] : fields) s += fmt::format("{}{}={}", s.empty() ? "" : " ", k, v);
  return s;
}

// --- add -----------------------------------------------------------------------

struct AddArgs {
  std::string stream, group = "jobguard";
  std::vector<std::string> fields;
};

int run_add(const Globals& g, const AddArgs& a) {
  Fields fields;
  for (const auto& arg : a.fields) {
    const auto eq = arg.find('=');
    if (eq == std::string::npos)
      throw Error(errc::invalid_argument, fmt::format("job field \"{}\": expected FIELD=VALUE", arg));
    if (eq == 0) throw Error(errc::invalid_argument, fmt::format("job field \"{}\": empty field name", arg));
    fields.emplace_back(arg.substr(0, eq), arg.substr(eq + 1));
  }
  if (fields.empty()) throw Error(errc::invalid_argument, "no FIELD=VALUE given: a job needs at least one field");
  job::StreamOptions so;
  so.stream = a.stream;
  so.group = a.group;
  auto client = connect(g, "jobguard-jobs");
  job::StreamSource source(*client, so);
  source.ensure_group();
  const std::string id = source.add(fields);
  if (g.json) std::cout << nlohmann::json{{"id", id}}.dump() << "\n";
  else std::cout << id << "\n";
  return exit_code::ok;
}

// --- ls ------------------------------------------------------------------------

struct LsArgs {
  std::string stream, group = "jobguard";
  std::size_t count = 100;
};

int run_ls(const Globals& g, const LsArgs& a) {
  job::StreamOptions so;
  so.stream = a.stream;
  so.group = a.group;
  auto client = connect(g, "jobguard-jobs");
  job::StreamSource source(*client, so);
  const auto length = source.length(so.stream);
  const auto dead = source.length(source.dead_letter_stream());
  // Inspecting must not create the group (it would start delivering from 0).
  bool group_exists = true;
  std::int64_t pending = 0;
  std::vector<job::PendingEntry> entries;
  try {
    pending = source.pending_count();
    entries = source.pending(a.count);
  } catch (const Error& e) {
    if (!is_nogroup(e)) throw;
    group_exists = false;
  }
  if (g.json) {
    auto list = nlohmann::ordered_json::array();
    for (const auto& p : entries)
      list.push_back(nlohmann::ordered_json{
          {"id", p.id}, {"consumer", p.consumer}, {"idle_ms", p.idle.count()}, {"deliveries", p.deliveries}});
    nlohmann::ordered_json j{{"stream", so.stream},
                             {"group", so.group},
                             {"group_exists", group_exists},
                             {"length", length},
                             {"pending", pending},
                             {"dead_letter_stream", source.dead_letter_stream()},
                             {"dead_letter_length", dead},
                             {"pending_entries", list}};
    std::cout << j.dump() << "\n";
    return exit_code::ok;
  }
  std::cout << fmt::format("stream {}: {} entries; group {}: {}; dead letters ({}): {}\n", so.stream, length, so.group,
                           group_exists ? fmt::format("{} pending", pending) : std::string("does not exist"),
                           source.dead_letter_stream(), dead);
  if (!entries.empty()) {
    std::size_t idw = 2, cw = 8;
    for (const auto& p : entries) {
      idw = std::max(idw, p.id.size());
      cw = std::max(cw, p.consumer.size());
    }
    std::cout << fmt::format("{:<{}}  {:<{}}  {:>10}  {:>10}\n", "ID", idw, "CONSUMER", cw, "IDLE", "DELIVERIES");
    for (const auto& p : entries)
      std::cout << fmt::format("{:<{}}  {:<{}}  {:>10}  {:>10}\n", p.id, idw, p.consumer, cw, format_duration(p.idle),
                               p.deliveries);
    if (static_cast<std::int64_t>(entries.size()) < pending)
      std::cout << fmt::format("({} more pending; --count to see them)\n", pending - static_cast<std::int64_t>(entries.size()));
  }
  return exit_code::ok;
}

// --- dead ----------------------------------------------------------------------

struct DeadArgs {
  std::string stream;
  std::size_t count = 100;
};

int run_dead(const Globals& g, const DeadArgs& a) {
  job::StreamOptions so;
  so.stream = a.stream;
  auto client = connect(g, "jobguard-jobs");
  job::StreamSource source(*client, so);
  const auto entries = source.dead_letters(a.count);
  if (g.json) {
    auto list = nlohmann::ordered_json::array();
    for (const auto& d : entries)
      list.push_back(nlohmann::ordered_json{{"id", d.id},
                                            {"source_id", d.source_id},
                                            {"attempts", d.attempts},
                                            {"last_error", d.last_error},
                                            {"fields", fields_json(d.fields)}});
    std::cout << nlohmann::ordered_json{{"stream", so.stream}, {"dead_letter_stream", source.dead_letter_stream()},
                                        {"entries", list}}
                     .dump()
              << "\n";
    return exit_code::ok;
  }
  if (entries.empty()) {
    std::cout << fmt::format("no dead letters in {}\n", source.dead_letter_stream());
    return exit_code::ok;
  }
  for (const auto& d : entries)
    std::cout << fmt::format("{} (job {}) after {} deliveries: {}\n    {}\n", d.id, d.source_id, d.attempts, d.last_error,
                             fields_text(d.fields));
  return exit_code::ok;
}

// --- work ----------------------------------------------------------------------

struct WorkArgs {
  std::string stream, group = "jobguard", consumer;
  std::string cls;
  std::string consequence = "moderate";
  std::string on_redis_down = "fail-closed";
  std::string ttl = "30s";
  std::string timeout;
  std::string claim_idle = "30s";
  int max_attempts = 5;
  std::string id_field = "id", run_field = "run";
  std::string key_pattern;
  std::string grace = "10s";
  bool fence = false;
  std::int64_t max_jobs = 0;
  std::string exit_when_idle;
  std::string catalog;  // --catalog FILE: the class comes from it, not from the flags
  std::vector<std::string> cmd;
};

// JOBGUARD_FIELD_<NAME>: upper-cased, everything but [A-Z0-9] becomes '_'.
std::string field_env_name(std::string_view field) {
  std::string s = "JOBGUARD_FIELD_";
  for (unsigned char c : field) s += std::isalnum(c) && c < 0x80 ? static_cast<char>(std::toupper(c)) : '_';
  return s;
}

std::string default_consumer() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof host, "%s", "host");
  return fmt::format("{}-{}", host, ::getpid());
}

class Worker {
 public:
  Worker(const Globals& g, WorkArgs a) : g_(g), a_(std::move(a)), log_(observe::parse_log_format(g.log_format)) {}

  int run() {
    // Everything a user can get wrong is checked before touching the network,
    // so a usage error is 64 even when Redis is down.
    if (a_.cmd.empty()) throw Error(errc::invalid_argument, "no CMD given: put the command after `--`");
    job::LockClass cls;
    cls.name = a_.cls;
    cls.key_pattern = a_.key_pattern.empty() ? a_.cls + ":{id}" : a_.key_pattern;
    const auto consequence = job::parse_consequence(a_.consequence);
    if (!consequence || *consequence == job::Consequence::high)
      throw Error(errc::invalid_argument,
                  fmt::format("--consequence \"{}\": expected low or moderate (high needs a PostgreSQL effect; use the "
                              "library's GuardedRunner)", a_.consequence));
    cls.consequence = *consequence;
    const auto policy = job::parse_redis_down_policy(a_.on_redis_down);
    if (!policy)
      throw Error(errc::invalid_argument,
                  fmt::format("--on-redis-down \"{}\": expected fail-closed or fail-open", a_.on_redis_down));
    cls.on_redis_down = *policy;
    cls.ttl = duration_flag(a_.ttl, "--ttl");
    if (!a_.timeout.empty()) {
      cls.long_running = true;
      cls.hard_timeout = duration_flag(a_.timeout, "--timeout");
    }
    cls.fenced = a_.fence;
    cls.owner = "jobguard jobs work";
    cls.protects = fmt::format("CMD `{}` for each job of stream {}", a_.cmd.front(), a_.stream);
    if (!a_.catalog.empty()) {
      // The catalog's declaration wins over the class flags: it is the one
      // place the team wrote the class down (docs/operations.md).
      cls = job::Catalog::load(a_.catalog).get(a_.cls);
      if (cls.consequence == job::Consequence::high)
        throw Error(errc::invalid_argument,
                    fmt::format("--catalog {}: class '{}' is high (needs a PostgreSQL effect; use the library's "
                                "GuardedRunner)", a_.catalog, a_.cls));
    }
    cls.validate();
    cls_long_running_ = cls.long_running;
    grace_ = duration_flag(a_.grace, "--grace");
    // Zero: run until stopped.
    const milliseconds idle_limit =
        a_.exit_when_idle.empty() ? milliseconds(0) : duration_flag(a_.exit_when_idle, "--exit-when-idle");
    if (a_.max_jobs < 0) throw Error(errc::invalid_argument, "--max-jobs must be >= 0");
    if (a_.id_field.empty()) throw Error(errc::invalid_argument, "--id-field must not be empty");
    if (a_.consumer.empty()) a_.consumer = default_consumer();

    job::StreamOptions so;
    so.stream = a_.stream;
    so.group = a_.group;
    so.claim_idle = duration_flag(a_.claim_idle, "--claim-idle");
    so.max_attempts = a_.max_attempts;

    // Signals are taken before the first blocking call: SIGINT while
    // connecting or between jobs is handled at the next poll, not fatal.
    asio::signal_set signals(loop_, SIGINT, SIGTERM);
    wait_signal(signals);

    auto client = connect(g_, "jobguard-worker");
    observe::FleetPublisher fleet(*client);  // the fleet's numbers; last batch sent on return
    job::StreamSource source(*client, so);  // validates the options before any network call of its own
    source.ensure_group();
    auto leases = LeaseScheduler::create(LockService::create(*client));
    guard::RedisCompletionStore completions(*client);
    std::optional<guard::RedisIdempotencyStore> idempotency;
    job::RunnerBackends backends;
    backends.completions = &completions;
    if (cls.consequence == job::Consequence::moderate) {
      idempotency.emplace(*client);
      backends.idempotency = &*idempotency;
    }
    backends.log = &log_;
    backends.worker = a_.consumer;
    job::GuardedRunner runner(leases, cls, backends);

    auto last_job = steady_clock::now();
    while (!stopping_) {
      if (a_.max_jobs > 0 && finished() >= a_.max_jobs) break;
      std::optional<job::StreamJob> job;
      try {
        job = source.next(a_.consumer);
      } catch (const Error& e) {
        // A Redis outage mid-run: keep trying every 500 ms (the jobs wait in
        // the stream), with a log line per failed try so the outage is seen.
        if (next_step_for(e.code()) != next_step::retry_call) throw;
        log_.emit(observe::Event{.event = "error", .lock_class = cls.name, .outcome = "redis_unavailable",
                                 .extra = {{"message", std::string(e.what())}}});
        poll_for(milliseconds(500));
        continue;
      }
      poll_for(milliseconds(0));
      if (!job) {
        if (idle_limit.count() > 0 && steady_clock::now() - last_job >= idle_limit) break;
        continue;
      }
      ++jobs_;
      try {
        handle(source, runner, cls, *job);
      } catch (const Error& e) {
        // Redis went away between the run and its ack/fail: the job stays
        // pending and comes back; the worker keeps going.
        if (next_step_for(e.code()) != next_step::retry_call) throw;
        ++left_pending_;
        log_.emit(observe::Event{.event = "error", .job_id = job->id, .lock_class = cls.name,
                                 .outcome = "redis_unavailable", .extra = {{"message", std::string(e.what())}}});
      }
      last_job = steady_clock::now();
    }
    if (g_.json)
      std::cout << nlohmann::ordered_json{{"jobs", jobs_},           {"completed", completed_},
                                          {"skipped", skipped_},     {"failed", failed_},
                                          {"dead_lettered", dead_},  {"left_pending", left_pending_},
                                          {"stopped_by_signal", stopped_by_signal_}}
                       .dump()
                << "\n";
    return exit_code::ok;
  }

 private:
  void wait_signal(asio::signal_set& signals) {
    signals.async_wait([this, &signals](boost::system::error_code ec, int sig) {
      if (ec) return;
      if (!stopping_) {
        log_.emit(observe::Event{.event = "stopping", .outcome = "signal",
                                 .extra = {{"signal", static_cast<std::int64_t>(sig)},
                                           {"message", std::string(current_ ? "stopping CMD; its job stays pending"
                                                                            : "stopping")}}});
      }
      const bool second = stopping_;
      stopping_ = true;
      stopped_by_signal_ = true;
      if (current_) {
        interrupted_ = true;
        if (second) current_->kill();
        else current_->forward(SIGTERM);
      }
      wait_signal(signals);
    });
  }

  // Jobs that left the queue: acknowledged (completed, skipped) or dead-lettered.
  std::int64_t finished() const noexcept { return completed_ + skipped_ + dead_; }

  // Runs pending handlers (signals) for up to `d`; at once when zero.
  void poll_for(milliseconds d) {
    if (d.count() > 0) {
      loop_.restart();
      loop_.run_for(d);
    } else {
      loop_.restart();
      loop_.poll();
    }
  }

  void handle(job::StreamSource& source, job::GuardedRunner& runner, const job::LockClass& cls, const job::StreamJob& job) {
    const auto started = steady_clock::now();
    const bool has_id = std::any_of(job.fields.begin(), job.fields.end(), [&](const auto& f) { return f.first == a_.id_field; });
    job::Unit unit;
    unit.id = job.field(a_.id_field);
    unit.run_id = job.field(a_.run_field);
    if (unit.run_id.empty()) unit.run_id = job.id;
    unit.job_id = job.id;
    std::vector<std::pair<std::string, observe::FieldValue>> extra{
        {"unit", unit.id}, {"run_id", unit.run_id}, {"deliveries", job.deliveries}};
    if (job.reclaimed) extra.emplace_back("reclaimed", true);

    if (!has_id || unit.id.empty()) {
      const std::string why = has_id ? fmt::format("job field \"{}\" is empty", a_.id_field)
                                     : fmt::format("job has no field \"{}\"", a_.id_field);
      fail(source, cls, job, why, started, std::move(extra), {});
      return;
    }

    last_exit_.reset();
    interrupted_ = false;
    lock_key_.clear();
    job::RunResult r;
    try {
      r = runner.run(unit, [&](job::JobContext& ctx) { return effect(ctx, job); });
    } catch (const Error& e) {
      // A unit the runner refuses (a malformed id for the key pattern): the
      // job cannot succeed by retrying as it is.
      fail(source, cls, job, e.what(), started, std::move(extra), {});
      return;
    }
    if (r.fail_open) extra.emplace_back("fail_open", true);
    if (r.fence) extra.emplace_back("fence", *r.fence);
    const std::string key = !lock_key_.empty() || r.fail_open ? lock_key_ : KeyBuilder().lock_key(cls.resource_for(unit.id));
    switch (r.outcome) {
      case job::Outcome::completed:
      case job::Outcome::already_done: {
        const bool done = r.outcome == job::Outcome::already_done;
        source.ack(job.id);
        ++(done ? skipped_ : completed_);
        extra.emplace_back("action", "acked");
        if (done && !r.detail.empty()) extra.emplace_back("message", r.detail);
        emit(done ? "skipped" : "completed", cls, job, key, started, std::move(extra));
        return;
      }
      case job::Outcome::failed:
        if (interrupted_) break;  // our own shutdown stopped CMD: not the job's fault
        fail(source, cls, job, last_exit_ ? *last_exit_ : r.detail, started, std::move(extra), key);
        return;
      default:
        break;
    }
    // Busy, lost, timed out, Redis down, stale, or interrupted by shutdown:
    // not acknowledged, so the job comes back after claim-idle (each delivery
    // counts toward --max-attempts).
    ++left_pending_;
    extra.emplace_back("action", "left_pending");
    if (!r.detail.empty()) extra.emplace_back("message", r.detail);
    emit(interrupted_ ? "interrupted" : job::to_string(r.outcome), cls, job, key, started, std::move(extra));
  }

  void fail(job::StreamSource& source, const job::LockClass& cls, const job::StreamJob& job, const std::string& error,
            steady_clock::time_point started, std::vector<std::pair<std::string, observe::FieldValue>> extra,
            const std::string& key) {
    const bool dead = source.fail(job, error);
    ++failed_;
    if (dead) ++dead_;
    extra.emplace_back("action", dead ? "dead_lettered" : "left_pending");
    extra.emplace_back("message", error);
    emit(dead ? "dead_lettered" : "failed", cls, job, key, started, std::move(extra));
  }

  // The worker's one line per job (event "job"); the runner's own phase
  // events (acquired, skipped, completed, failed...) go to the same log.
  void emit(std::string_view outcome, const job::LockClass& cls, const job::StreamJob& job,
            const std::string& key, steady_clock::time_point started,
            std::vector<std::pair<std::string, observe::FieldValue>> extra) {
    log_.emit(observe::Event{.event = "job",
                             .lock_key = key,
                             .job_id = job.id,
                             .lock_class = cls.name,
                             .outcome = outcome,
                             .elapsed_ms = duration<double, std::milli>(steady_clock::now() - started).count(),
                             .extra = std::move(extra)});
  }

  // Runs CMD to its end on loop_. Called by the runner on this thread.
  std::string effect(job::JobContext& ctx, const job::StreamJob& job) {
    lock_key_ = ctx.lock_key();
    ctx.ensure();
    if (stopping_) {
      interrupted_ = true;
      throw std::runtime_error("worker stopping: CMD not started");
    }
    job::SupervisorOptions so;
    so.argv = a_.cmd;
    so.grace = grace_;
    so.env = {{"JOBGUARD_JOB_ID", job.id},
              {"JOBGUARD_KEY", ctx.lock_key()},
              {"JOBGUARD_IDEMPOTENCY_KEY", ctx.idempotency_key()}};
    if (ctx.fence()) so.env.emplace_back("JOBGUARD_FENCE", std::to_string(*ctx.fence()));
    for (const auto& [k, v] : job.fields) so.env.emplace_back(field_env_name(k), v);
    // A plain lock is not renewed: CMD past the lock's safe time would run
    // beside the next holder, so it is stopped there like on a lost lease.
    if (ctx.guarded() && !cls_long_running_) so.safe_time = std::max(milliseconds(1), ctx.safe_time_left());

    std::optional<job::CmdOutcome> out;
    loop_.restart();
    job::Supervisor sup(loop_.get_executor(), std::move(so), [&](const job::CmdOutcome& o) { out = o; });
    if (sup.pid() > 0) current_ = &sup;
    {
      // The runner requests a stop from its own thread (a lost lease, the hard
      // timeout); the Supervisor carries it to loop_ and drops it once it ended.
      std::stop_callback on_stop(ctx.stop_token(), [stop = sup.remote_stop()] {
        stop(job::Ending::lease_lost, "lease lost or hard timeout");
      });
      while (!out) loop_.run_one();
      current_ = nullptr;
    }
    if (out->ending == job::Ending::failed_to_start) {
      last_exit_ = fmt::format("cannot run CMD: {}", out->detail);
      throw std::runtime_error(*last_exit_);
    }
    const bool stopped_by_runner = out->ending == job::Ending::lease_lost;
    if (out->status.shell_status() == 0 && !stopped_by_runner) return std::string();
    last_exit_ = out->ending == job::Ending::stopped ? out->describe() : out->status.describe();
    if (stopped_by_runner)
      throw Error(errc::lease_lost,
                  fmt::format("CMD stopped: {}; {}",
                              cls_long_running_ ? "lease lost or hard timeout" : "the lock's TTL ran out", *last_exit_));
    throw std::runtime_error(*last_exit_);
  }

  const Globals& g_;
  WorkArgs a_;
  observe::EventLog log_;
  asio::io_context loop_;
  // Keeps run_one() waiting for CMD's exit even when no other handler is queued.
  asio::executor_work_guard<asio::io_context::executor_type> work_{loop_.get_executor()};
  milliseconds grace_{10000};
  job::Supervisor* current_ = nullptr;  // the running CMD; loop thread only
  bool cls_long_running_ = false;
  bool stopping_ = false, stopped_by_signal_ = false, interrupted_ = false;
  std::optional<std::string> last_exit_;
  std::string lock_key_;
  std::int64_t jobs_ = 0, completed_ = 0, skipped_ = 0, failed_ = 0, dead_ = 0, left_pending_ = 0;
};

// Everything after the first "--" that follows `jobs ... work`: CLI11
// rewrites a positional like "[a,b]" as a list, CMD must get its words as typed.
std::optional<std::vector<std::string>> cmd_from_raw_args(const std::vector<std::string>& argv) {
  auto jobs = std::find(argv.begin(), argv.end(), "jobs");
  if (jobs == argv.end()) return std::nullopt;
  auto work = std::find(jobs, argv.end(), "work");
  if (work == argv.end()) return std::nullopt;
  auto dashes = std::find(work, argv.end(), "--");
  if (dashes == argv.end()) return std::nullopt;
  return std::vector<std::string>(dashes + 1, argv.end());
}

// Errors named after the full subcommand ("jobguard jobs add: ..."), one line.
template <class F>
Action reported(const char* name, F body) {
  return [name, body = std::move(body)]() -> int {
    try {
      return body();
    } catch (const Error& e) {
      std::cerr << "jobguard jobs " << name << ": " << e.what() << "\n";
      return exit_status_for(e);
    }
  };
}

void add(CLI::App& root, Globals& g, std::vector<std::pair<CLI::App*, Action>>& out) {
  auto* jobs = root.add_subcommand("jobs", "A Redis Streams job queue: add, ls, dead, work");
  jobs->footer(kJobsHelp);
  jobs->require_subcommand(1);
  jobs->fallthrough();

  auto add_args = std::make_shared<AddArgs>();
  auto* add = jobs->add_subcommand("add", "Enqueue one job (XADD); prints its id");
  add->fallthrough();
  add->add_option("--stream", add_args->stream, "Stream key (required)")->required();
  add->add_option("--group", add_args->group, "Consumer group (created if missing)")->capture_default_str();
  add->add_option("FIELD=VALUE", add_args->fields, "The job's fields")->required();
  out.emplace_back(add, reported("add", [&g, add_args] { return run_add(g, *add_args); }));

  auto ls_args = std::make_shared<LsArgs>();
  auto* ls = jobs->add_subcommand("ls", "Stream length, pending jobs, dead-letter length");
  ls->fallthrough();
  ls->add_option("--stream", ls_args->stream, "Stream key (required)")->required();
  ls->add_option("--group", ls_args->group, "Consumer group")->capture_default_str();
  ls->add_option("--count", ls_args->count, "Show at most N pending entries")->capture_default_str();
  out.emplace_back(ls, reported("ls", [&g, ls_args] { return run_ls(g, *ls_args); }));

  auto dead_args = std::make_shared<DeadArgs>();
  auto* dead = jobs->add_subcommand("dead", "Dead-letter entries with their last error");
  dead->fallthrough();
  dead->add_option("--stream", dead_args->stream, "Stream key (required)")->required();
  dead->add_option("--count", dead_args->count, "Show at most N entries (newest first)")->capture_default_str();
  out.emplace_back(dead, reported("dead", [&g, dead_args] { return run_dead(g, *dead_args); }));

  auto w = std::make_shared<WorkArgs>();
  auto* work = jobs->add_subcommand("work", "Run CMD for each job, guarded as lock class NAME");
  work->fallthrough();
  work->footer("See `jobguard jobs --help` for the environment, outcomes and exit status.");
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
  work->add_option("--max-jobs", w->max_jobs, "Exit after N jobs finished: acknowledged or dead-lettered (0: no limit)")->capture_default_str();
  work->add_option("--exit-when-idle", w->exit_when_idle, "Exit after DUR without a job")->check(duration_validator());
  work->add_option("CMD", w->cmd, "The command and its arguments, after --")->required();
  out.emplace_back(work, reported("work", [&g, w] {
                     if (auto verbatim = cmd_from_raw_args(raw_args())) w->cmd = std::move(*verbatim);
                     Worker worker(g, *w);
                     return worker.run();
                   }));
}

}  // namespace

void add_jobs(CLI::App& root, Globals& g, Commands& out) { add(root, g, out); }
}  // namespace jobguard::cli
