// `jobguard run`: a distributed flock(1). Holds KEY in Redis while CMD runs in
// its own process group, renews the lease, and stops CMD when the lease is
// lost or the hard timeout passes. The exit statuses are a contract
// (BRIEF.md section 2); the --help text below is their documentation.
//
// Threads: the main thread connects, acquires and then runs one io_context
// that owns the child, the signals and the timers. The Redis client runs its
// own loop thread; lease-lost callbacks hop from there to the main loop.
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>

#include "cli.hpp"
#include "jobguard/observe/fleet.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "jobguard/guard/completion.hpp"
#include "jobguard/job/process.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/event_log.hpp"
#include "jobguard/redis/client.hpp"

namespace asio = boost::asio;
using namespace std::chrono;

namespace jobguard::cli {
namespace {

constexpr const char* kRunHelp = R"(Run CMD while holding the Redis lock KEY: a distributed flock(1).

  jobguard run --key KEY [--ttl 30s] [--wait DUR] [--timeout DUR] [--grace 10s]
               [--fence] [--fair] [--once RUN_ID] [--job-id ID] -- CMD [ARGS...]

KEY names the business object ("invoice:48291"); the Redis key is
jobguard:lock:{KEY}. The lease is renewed every ttl/3 while CMD runs. CMD runs
in its own process group with these variables added to its environment:
  JOBGUARD_KEY    the Redis key that holds the lock (prefix included)
  JOBGUARD_TOKEN  the value stored in it (our owner token)
  JOBGUARD_FENCE  the fencing token of this grant (only with --fence)
When the lease is lost, or at --timeout (counted from CMD's start), jobguard
sends SIGTERM to CMD's process group and SIGKILL after --grace. SIGINT, SIGTERM
and SIGHUP sent to jobguard are forwarded to the group. The lock is released
when CMD exits (processes CMD leaves behind in its group are not waited for).
Put CMD after `--`.

--once RUN_ID: if a completion record for (KEY, RUN_ID) exists, CMD is skipped
(exit 0, with a message); when CMD exits 0 on its own, a record is written
before the lock is released. Records live in PostgreSQL when --postgres (or
$JOBGUARD_POSTGRES_URL) is set (tables from `jobguard pg migrate`), else in
Redis under jobguard:done:.

Exit status:
  CMD's own   CMD ran to the end; 128+N when it died by signal N (as a shell
              reports it), e.g. 143 when it dies of a forwarded SIGTERM
  0           --once: RUN_ID was already done, CMD skipped
  64          usage: missing --key or CMD, malformed duration, URL or key
  69          Redis (or PostgreSQL for --once) unavailable: connect failed or
              timed out; fail-closed, CMD not run
  70          the lease was lost while CMD ran (CMD was stopped)
  75          lock busy (after --wait, if given)
  124         --timeout passed (CMD was stopped)
  126, 127    CMD could not be executed / was not found

Logs go to stderr. By default only problems are reported (busy, lost, timeout,
skipped, errors). With an explicit --log-format every event is logged
(acquired, busy, renewed, lost, timeout, released, skipped, error); with
--log-format json each line is one JSON object with event, lock_key, job_id,
outcome and elapsed_ms (acquired/busy: time spent acquiring; renewed, lost,
timeout, released: time since the lock was acquired; skipped, error: since start).)";

struct RunArgs {
  std::string key;
  std::string ttl = "30s";
  std::string wait;
  std::string timeout;
  std::string grace = "10s";
  bool fence = false;
  bool fair = false;
  std::string once;
  std::string job_id;
  std::vector<std::string> cmd;
};

milliseconds to_ms(microseconds d) { return duration_cast<milliseconds>(d); }

double ms_since(steady_clock::time_point t) {
  return duration<double, std::milli>(steady_clock::now() - t).count();
}

// Log lines on stderr. Problems always; every event when the user asked for a
// log format explicitly. Callable from the main thread only.
class Reporter {
 public:
  Reporter(observe::LogFormat format, bool verbose) : log_(format), verbose_(verbose) {}

  void set_context(std::string key, std::string job_id) {
    key_ = std::move(key);
    job_id_ = std::move(job_id);
  }

  // `message` is the one line a human reads; it also goes into the structured forms.
  void event(std::string_view name, std::string_view outcome, std::optional<double> elapsed_ms, bool problem,
             const std::string& message, std::vector<std::pair<std::string, observe::FieldValue>> extra = {}) {
    if (!problem && !verbose_) return;
    if (!verbose_ && log_.format() == observe::LogFormat::human) {
      std::cerr << "jobguard run: " << message << std::endl;
      return;
    }
    if (!message.empty()) extra.emplace_back("message", message);
    log_.emit(observe::Event{.event = name,
                             .lock_key = key_,
                             .job_id = job_id_,
                             .lock_class = {},
                             .outcome = outcome,
                             .elapsed_ms = elapsed_ms,
                             .extra = std::move(extra)});
  }

  bool verbose() const noexcept { return verbose_; }

 private:
  observe::EventLog log_;
  bool verbose_;
  std::string key_, job_id_;
};

// Why CMD was stopped by us, if it was.
enum class Cause { none, lost, timeout };

class Runner {
 public:
  Runner(const Globals& g, const RunArgs& a, Reporter& rep) : g_(g), a_(a), rep_(rep) {}

  int run() {
    const auto started = steady_clock::now();
    // Everything a user can get wrong is checked before touching the network,
    // so a usage error is 64 even when Redis is down.
    if (a_.cmd.empty()) throw Error(errc::invalid_argument, "no CMD given: put the command after `--`");
    const auto ttl = to_ms(parse_duration(a_.ttl, "--ttl"));
    if (ttl < milliseconds(10)) throw Error(errc::invalid_argument, fmt::format("--ttl {} is below the minimum of 10ms", a_.ttl));
    const auto wait = a_.wait.empty() ? milliseconds(0) : to_ms(parse_duration(a_.wait, "--wait"));
    const auto timeout = a_.timeout.empty() ? milliseconds(0) : to_ms(parse_duration(a_.timeout, "--timeout"));
    const auto grace = to_ms(parse_duration(a_.grace, "--grace"));
    if (!a_.once.empty() && (a_.once.find_first_of(" \t\r\n") != std::string::npos || a_.once.size() > 512))
      throw Error(errc::invalid_argument, fmt::format("--once \"{}\": a run id must be 1..512 bytes without whitespace", a_.once));
    KeyBuilder keys;
    KeyBuilder::validate_resource(a_.key);  // names the key and the offending character
    const std::string lock_key = keys.lock_key(a_.key);
    rep_.set_context(lock_key, a_.job_id);
    auto conn = redis::parse_url(g_.redis_url);
    if (conn.client_name.empty()) conn.client_name = "jobguard-run";
    const auto token_probe = make_token(a_.job_id);  // validates --job-id (no '#', no whitespace)
    (void)token_probe;

    // --- connect: fail-closed, within the connect deadline -------------------
    redis::Client client(conn);
    try {
      client.exec(redis::Command{"PING"}, redis::CallOptions{conn.connect_timeout});
    } catch (const Error& e) {
      throw Error(errc::redis_unavailable,
                  fmt::format("cannot reach Redis at {}: {}; CMD not run (fail-closed)", redis::to_display_url(conn), e.what()));
    }

    // Before the lock and lease (destroyed after them): its last batch, sent
    // on return, carries this run's acquire, hold and release.
    observe::FleetPublisher fleet(client);

    std::unique_ptr<guard::CompletionStore> done_store;
    if (!a_.once.empty()) {
      done_store = open_completion_store(client);
      if (auto rec = find_record(*done_store)) return skipped(*rec, started);
    }

    // --- acquire ------------------------------------------------------------
    auto service = LockService::create(client, keys);
    LockOptions lo;
    lo.ttl = ttl;
    lo.wait = wait;
    lo.fence = a_.fence;
    lo.fair = a_.fair;
    lo.job_id = a_.job_id;
    lo.lock_class = "run";
    const auto acquire_start = steady_clock::now();
    std::optional<Lock> lock;
    try {
      lock = service->acquire(a_.key, lo);
    } catch (const Error& e) {
      if (next_step_for(e.code()) == next_step::retry_call)
        throw Error(errc::redis_unavailable, fmt::format("Redis failed while acquiring {}: {}; CMD not run (fail-closed)", lock_key, e.what()));
      throw;
    }
    if (!lock) {
      rep_.event("busy", "busy", ms_since(acquire_start), true,
                 fmt::format("lock busy: {} is held by {}{}", lock_key, describe_holder(client, lock_key),
                             wait.count() > 0 ? fmt::format(" (waited {})", format_duration(wait)) : std::string()));
      return exit_code::busy;
    }
    acquired_at_ = lock->acquired_at();
    rep_.event("acquired", "ok", ms_since(acquire_start), false, fmt::format("acquired {}", lock_key),
               a_.fence && lock->fence() ? std::vector<std::pair<std::string, observe::FieldValue>>{{"fence", *lock->fence()}}
                             : std::vector<std::pair<std::string, observe::FieldValue>>{});

    job::ProcessOptions po;
    po.argv = a_.cmd;
    po.env = {{"JOBGUARD_KEY", lock->key()}, {"JOBGUARD_TOKEN", lock->token()}};
    if (a_.fence && lock->fence()) po.env.emplace_back("JOBGUARD_FENCE", std::to_string(*lock->fence()));

    // The authoritative --once check happens under the lock: two runs that
    // both passed the check above cannot both get here and find no record.
    if (done_store) {
      if (auto rec = find_record(*done_store)) {
        lock->release();
        return skipped(*rec, started);
      }
    }

    // Declared after `client`, so destroyed before it: the lease is released
    // while the client still runs, and no on_lost callback can run after
    // `ctx` is gone (the client joins its loop thread before `ctx` dies).
    auto scheduler = LeaseScheduler::create(service);
    Lease lease = scheduler->adopt(std::move(*lock));
    return supervise(lease, po, timeout, grace, done_store.get(), started);
  }

 private:
  int supervise(Lease& lease, const job::ProcessOptions& po, milliseconds timeout, milliseconds grace,
                guard::CompletionStore* done_store, steady_clock::time_point started) {
    asio::io_context ctx;
    auto work_guard = asio::make_work_guard(ctx);
    Cause cause = Cause::none;
    bool lost_reported = false;
    std::optional<job::ExitStatus> status;
    std::unique_ptr<job::Process> proc;
    asio::steady_timer timeout_timer(ctx), renew_timer(ctx);
    asio::signal_set signals(ctx, SIGINT, SIGTERM, SIGHUP);
    signals.add(SIGCONT);

    auto stop_cmd = [&](Cause why, const std::string& message, std::string_view event, std::string_view outcome) {
      if (cause != Cause::none || status) return;
      cause = why;
      rep_.event(event, outcome, ms_since(acquired_at_), true,
                 fmt::format("{}; sending SIGTERM to CMD's process group {}, SIGKILL after {}", message, proc->pgid(),
                             format_duration(grace)));
      lost_reported = lost_reported || why == Cause::lost;
      proc->terminate(grace);
    };
    auto on_lost = [&](const std::string& reason) { stop_cmd(Cause::lost, reason, "lost", "lost"); };

    // The lease's callback runs on the client's loop, possibly racing with
    // our return (a loss published while we release): it reaches `ctx` only
    // through this mailbox, which is closed before `ctx` is destroyed.
    struct Mailbox {
      std::mutex mu;
      asio::io_context* ctx = nullptr;
    };
    auto mailbox = std::make_shared<Mailbox>();
    mailbox->ctx = &ctx;
    struct CloseMailbox {
      std::shared_ptr<Mailbox> mb;
      ~CloseMailbox() {
        std::lock_guard<std::mutex> g(mb->mu);
        mb->ctx = nullptr;
      }
    } close_mailbox{mailbox};
    lease.on_lost([mailbox, &on_lost](LeaseState, const std::string& why) {
      std::lock_guard<std::mutex> g(mailbox->mu);
      if (mailbox->ctx) asio::post(*mailbox->ctx, [&on_lost, why] { on_lost(why); });
    });

    std::function<void()> wait_signal = [&] {
      signals.async_wait([&](boost::system::error_code ec, int sig) {
        if (ec) return;
        if (sig == SIGCONT) {
          // Back from a stop (SIGSTOP, a frozen VM): the safe time is computed
          // from the monotonic clock, so we know at once whether the TTL ran
          // out while we were not running, before any renewal timer fires.
          if (lease.safe_time_left().count() <= 0)
            on_lost(lease.lost() ? lease.reason()
                                 : fmt::format("lease on {} lost: the process was stopped past the lock's safe time",
                                               lease.key()));
        } else if (proc && !status) {
          proc->forward(sig);
        }
        wait_signal();
      });
    };
    wait_signal();

    try {
      proc = std::make_unique<job::Process>(ctx.get_executor(), po, [&](job::ExitStatus st) {
        status = st;
        timeout_timer.cancel();
        renew_timer.cancel();
        signals.cancel();
        work_guard.reset();
        ctx.stop();
      });
    } catch (const std::system_error& e) {
      signals.cancel();
      const std::string key = lease.key();
      const bool ours = lease.release();
      rep_.event("released", ours ? "ok" : "not_ours", ms_since(acquired_at_), false, fmt::format("released {}", key));
      rep_.event("error", "error", ms_since(started), true, e.what());
      return e.code().value() == ENOENT ? 127 : 126;
    }

    if (timeout.count() > 0) {
      timeout_timer.expires_after(timeout);
      timeout_timer.async_wait([&](boost::system::error_code ec) {
        if (ec) return;
        stop_cmd(Cause::timeout, fmt::format("hard timeout: CMD still running after {}", format_duration(timeout)),
                 "timeout", "timeout");
      });
    }
    // The scheduler renews on the client's loop; report renewals from here.
    // (Lives as long as ctx.run(): its handlers refer to it.)
    const auto period = std::max(milliseconds(10), lease_period(lease));
    std::function<void(std::uint64_t)> watch;
    if (rep_.verbose()) {
      watch = [&](std::uint64_t seen) {
        renew_timer.expires_after(period);
        renew_timer.async_wait([&, seen](boost::system::error_code ec) {
          if (ec) return;
          const auto n = lease.renewals();
          if (n != seen && !lease.lost())
            rep_.event("renewed", "ok", ms_since(acquired_at_), false, fmt::format("renewed {}", lease.key()),
                       {{"renewals", static_cast<std::int64_t>(n)},
                        {"safe_ms", static_cast<std::int64_t>(lease.safe_time_left().count())}});
          watch(n);
        });
      };
      watch(0);
    }

    ctx.run();
    const job::ExitStatus st = status.value_or(job::ExitStatus{true, 0, SIGKILL});
    // A lease that ran out while CMD ran means someone else may have held the
    // lock at the same time, whether or not we heard it before CMD ended.
    const bool lost = cause == Cause::lost || lease.lost() || lease.safe_time_left().count() <= 0;
    int rc = st.shell_status();
    if (lost) {
      if (!lost_reported)
        rep_.event("lost", "lost", ms_since(acquired_at_), true,
                   lease.reason().empty() ? fmt::format("lease on {} lost while CMD ran", lease.key()) : lease.reason());
      rc = exit_code::lease_lost;
    } else if (cause == Cause::timeout) {
      rc = exit_code::timeout;
    }

    // Recorded before the release, so the next holder of the lock sees it.
    if (done_store && cause == Cause::none && st.shell_status() == 0) {
      try {
        done_store->record("run", a_.key, a_.once, token_owner(lease.token()));
      } catch (const Error& e) {
        rep_.event("error", "error", ms_since(started), true,
                   fmt::format("CMD succeeded but its completion record for run {} could not be written: {}; a rerun "
                               "will repeat it", a_.once, e.what()));
        if (rc == 0) rc = exit_code::unavailable;
      }
    }

    const auto held_ms = ms_since(acquired_at_);
    const std::string key = lease.key();  // release() empties the handle
    const bool ours = lease.release();
    if (ours || lost) {
      rep_.event("released", ours ? "ok" : "lost", held_ms, false,
                 fmt::format("released {} ({})", key, st.describe()),
                 {{"exit_status", static_cast<std::int64_t>(rc)}});
    } else {
      // Renewals were fine until CMD ended, so exclusion held while it ran;
      // the key vanished since (force-released) or Redis could not be reached.
      rep_.event("released", "not_ours", held_ms, true,
                 fmt::format("could not release {}: it was no longer ours or Redis was unreachable (it expires by its TTL)",
                             key),
                 {{"exit_status", static_cast<std::int64_t>(rc)}});
    }
    return rc;
  }

  static milliseconds lease_period(const Lease& lease) {
    return std::max(milliseconds(10), duration_cast<milliseconds>(lease.safe_time_left() / 3));
  }

  std::unique_ptr<guard::CompletionStore> open_completion_store(redis::Client& client) {
    if (!g_.postgres_url.empty()) {
      guard::PgOptions po;
      po.url = g_.postgres_url;
      po.application_name = "jobguard-run";
      try {
        return std::make_unique<guard::PgCompletionStore>(po);
      } catch (const Error& e) {
        if (next_step_for(e.code()) == next_step::retry_call)
          throw Error(errc::postgres_unavailable, fmt::format("cannot reach PostgreSQL for --once: {}; CMD not run (fail-closed)", e.what()));
        throw;
      }
    }
    return std::make_unique<guard::RedisCompletionStore>(client);
  }

  std::optional<guard::CompletionRecord> find_record(guard::CompletionStore& store) {
    try {
      return store.find("run", a_.key, a_.once);
    } catch (const Error& e) {
      if (next_step_for(e.code()) == next_step::retry_call)
        throw Error(e.code(), fmt::format("cannot read the completion record of run {}: {}; CMD not run (fail-closed)", a_.once, e.what()));
      throw;
    }
  }

  int skipped(const guard::CompletionRecord& rec, steady_clock::time_point started) {
    rep_.event("skipped", "done", ms_since(started), true,
               fmt::format("run {} of {} already done{}; CMD skipped", a_.once, a_.key,
                           rec.completed_by.empty() ? std::string() : fmt::format(" (by {})", rec.completed_by)),
               {{"run_id", a_.once}});
    return exit_code::ok;
  }

  // "web-3/4121/job (ttl 2.1s left)", best effort, for the busy message.
  static std::string describe_holder(redis::Client& client, const std::string& key) {
    try {
      const auto v = client.exec(redis::Command{"GET", key}, redis::CallOptions{milliseconds(500)});
      const auto t = client.exec(redis::Command{"PTTL", key}, redis::CallOptions{milliseconds(500)});
      if (v.is_nil()) return "another owner (released just now)";
      std::string out = token_owner(v.str);
      if (t.is_integer() && t.integer > 0) out += fmt::format(" (ttl {} left)", format_duration(milliseconds(t.integer)));
      return out;
    } catch (const Error&) {
      return "another owner";
    }
  }

  const Globals& g_;
  const RunArgs& a_;
  Reporter& rep_;
  steady_clock::time_point acquired_at_{};
};

// Everything after the first "--" that follows the `run` word.
std::optional<std::vector<std::string>> cmd_from_raw_args(const std::vector<std::string>& argv) {
  auto run = std::find(argv.begin(), argv.end(), "run");
  if (run == argv.end()) return std::nullopt;
  auto dashes = std::find(run, argv.end(), "--");
  if (dashes == argv.end()) return std::nullopt;
  return std::vector<std::string>(dashes + 1, argv.end());
}

void add(CLI::App& root, Globals& g, std::vector<std::pair<CLI::App*, Action>>& out) {
  auto args = std::make_shared<RunArgs>();
  auto* sub = root.add_subcommand("run", "Run CMD while holding a Redis lock (a distributed flock)");
  sub->footer(kRunHelp);
  sub->add_option("--key", args->key, "Resource to lock, e.g. invoice:48291 (required)")->required();
  sub->add_option("--ttl", args->ttl, "Lock TTL; renewed every ttl/3 (>= 10ms)")->check(duration_validator())->capture_default_str();
  sub->add_option("--wait", args->wait, "Wait up to DUR for a busy lock (default: try once)")->check(duration_validator());
  sub->add_option("--timeout", args->timeout, "Hard timeout for CMD, from its start (exit 124)")->check(duration_validator());
  sub->add_option("--grace", args->grace, "Time between SIGTERM and SIGKILL when stopping CMD")
      ->check(duration_validator())
      ->capture_default_str();
  sub->add_flag("--fence", args->fence, "Issue a fencing token, exported as JOBGUARD_FENCE");
  sub->add_flag("--fair", args->fair, "FIFO handoff among waiters (every contender must use --fair)");
  sub->add_option("--once", args->once, "Skip CMD if RUN_ID is recorded as done; record it when CMD exits 0");
  sub->add_option("--job-id", args->job_id, "Job id for the owner token and the logs");
  // CLI11 checks that CMD is there; its words are taken verbatim from the
  // command line (cmd_from_raw_args) because CLI11 rewrites "[a,b]" as a list.
  sub->add_option("CMD", args->cmd, "The command and its arguments, after --")->required();
  CLI::Option* log_format = root.get_option_no_throw("--log-format");
  out.emplace_back(sub, [&g, args, log_format] {
    const bool verbose = log_format && log_format->count() > 0;
    const auto format = observe::parse_log_format(g.log_format);
    Reporter rep(format, verbose);
    if (auto verbatim = cmd_from_raw_args(raw_args())) args->cmd = std::move(*verbatim);
    try {
      Runner runner(g, *args, rep);
      return runner.run();
    } catch (const Error& e) {
      // Reported here rather than by main so --log-format json stays one JSON
      // object per line.
      rep.event("error", "error", std::nullopt, true, e.what());
      return exit_status_for(e);
    }
  });
}

JOBGUARD_COMMAND(add);

}  // namespace
}  // namespace jobguard::cli
