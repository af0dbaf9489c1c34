// `jobguard run`: a distributed flock(1). Holds KEY in Redis while CMD runs in
// its own process group, renews the lease, and stops CMD when the lease is
// lost or the hard timeout passes. The exit statuses are a contract
// (scripts depend on them); the --help text below is their documentation.
//
// The work is job::run_locked (acquire, --once, CMD under job::Supervisor,
// release); this file parses flags, reports events and maps the result to the
// exit status. Threads: the main thread; the Redis client runs its own loop.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli.hpp"
#include "jobguard/observe/fleet.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "jobguard/guard/completion.hpp"
#include "jobguard/job/catalog.hpp"
#include "jobguard/job/lock_class.hpp"
#include "jobguard/job/locked_run.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/event_log.hpp"
#include "jobguard/redis/client.hpp"
#include "postgres.hpp"

using namespace std::chrono;

namespace jobguard::cli {
namespace {

constexpr const char* kRunHelp = R"(Run CMD while holding the Redis lock KEY: a distributed flock(1).

  jobguard run --key KEY [--ttl 30s] [--wait DUR] [--timeout DUR] [--grace 10s]
               [--fence] [--fair | --permits N | --shared | --exclusive]
               [--once RUN_ID] [--job-id ID]
               [--class NAME [--catalog FILE]] [--foreground] -- CMD [ARGS...]
  jobguard run --key A --key B [--key C...] [--ttl 30s] [--wait DUR] [--fence]
               [--timeout DUR] [--grace 10s] [--job-id ID] [--class NAME]
               [--foreground] -- CMD [ARGS...]

KEY names the business object ("invoice:48291"); the Redis key is
jobguard:lock:{KEY}. The lease is renewed every ttl/3 while CMD runs. CMD runs
in its own process group with these variables added to its environment
($JOBGUARD_*_URL and $JOBGUARD_*_PASSWORD are removed from it):
  JOBGUARD_KEY    the Redis key that holds the lock (prefix included)
  JOBGUARD_TOKEN  the value stored in it (our owner token)
  JOBGUARD_FENCE  the fencing token of this grant (only with --fence)

--permits N: take one of N permits of a counting semaphore on KEY instead of
the lock (at most N runs hold KEY at once; docs/semaphore.md). Waiters are
served in arrival order; a crashed holder's permit comes back when its TTL
has passed. The holders are in jobguard:sem:{KEY}; a count stored with the
library's set_permits overrides N. CMD also gets:
  JOBGUARD_PERMITS      the permit count the grant was made under
  JOBGUARD_PERMIT_SLOT  this permit's slot in 0..N-1 (no other live holder
                        has it: fence writes per slot, as for a lock)
JOBGUARD_KEY is then the holders' key and JOBGUARD_TOKEN this holder's token.
--permits must be 1..10000 and does not go with --fair (exit 64).

--shared / --exclusive: hold KEY's read-write lock instead of the lock, as a
reader (any number of --shared runs at once) or its writer (an --exclusive run
alone: no reader, no other writer; docs/rwlock.md). A waiting writer stops
new readers from entering: it waits only for the holders it found and the
waiters ahead of it. Waiters are served in arrival order; a crashed holder's
place comes back when its TTL has passed. Readers are in jobguard:rwr:{KEY},
the writer in jobguard:rww:{KEY} (JOBGUARD_KEY); CMD also gets
JOBGUARD_LOCK_MODE (shared or exclusive). With --fence a writer's fence
is above every fence of the readers it waited for. They go with none of
--permits, --fair, or each other (exit 64).
When the lease is lost, or at --timeout (counted from CMD's start), jobguard
sends SIGTERM to CMD's process group and SIGKILL after --grace. HUP, INT, QUIT,
USR1, USR2, ALRM, TERM (every catchable signal that would end jobguard) are
forwarded to the group, again with SIGKILL after --grace; SIGPIPE is ignored.
If jobguard dies anyhow (kill -9 included), a guardian process kills CMD's
group. A CMD stopped (SIGTTIN, SIGTSTP...) for longer than --grace is killed;
--foreground puts CMD in the terminal's foreground so it can read it. The lock
is released after CMD exits and what it left in its group is killed.
CMD must follow `--`.

--key given more than once: hold every KEY or none (docs/multilock.md). Each
is a plain lock (jobguard:lock:{KEY}, its own token and fence counter). One
server grants them all or none in one script; a Redis Cluster's are taken one
at a time in byte order of the names, and when one is busy the keys already
taken are released before jobguard waits (retrying with backoff until --wait
runs out) or exits 75: it never holds some while it waits for others. One
lease renews them all; losing any of them stops CMD (exit 70). CMD gets,
space-separated and in that order, one word per KEY (instead of JOBGUARD_KEY,
JOBGUARD_TOKEN and JOBGUARD_FENCE):
  JOBGUARD_RESOURCES  the KEY names
  JOBGUARD_KEYS       the Redis keys
  JOBGUARD_TOKENS     our owner token in each
  JOBGUARD_FENCES     each key's fencing token, from its own counter (--fence)
A KEY named twice, several --key with --permits, --fair, --once, --shared or
--exclusive: exit 64.

--once RUN_ID: if a completion record for (KEY, RUN_ID) exists, CMD is skipped
(exit 0, with a message); when CMD exits 0 on its own, a record is written
before the lock is released. Records live in PostgreSQL when --postgres (or
$JOBGUARD_POSTGRES_URL) is set (tables from `jobguard pg migrate`), else in
Redis under jobguard:done:.

--catalog FILE (with --class NAME): NAME's declaration in the lock catalog
FILE decides what the run holds: one of its `permits` (as --permits), its
`mode` (as --shared / --exclusive) or the plain lock; its ttl, its fencing
(as --fence), and CMD's --timeout unless given (the hard_timeout of a
renewing class, the ttl of any other). --ttl, --permits, --shared or
--exclusive with --catalog, or a NAME the file lacks: exit 64.

--class NAME: the lock class this run's numbers are counted under (default
"run"): the fleet's metrics (`jobguard stats`, `jobguard serve`'s
jobguard_fleet_* families, label class="NAME") and the lock_class log field.
Use the name of the class in your lock catalog, so `policy lint` compares its
TTL with this class's observed hold times. Letters, digits, '_', '-', '.', at
most 64 bytes, the catalog's rule; one name per kind of job, never per key.

Exit status:
  CMD's own   CMD ran to the end; 128+N when it died by signal N (as a shell
              reports it), e.g. 143 when it dies of a forwarded SIGTERM, and
              128+N when it stayed stopped by signal N (149: SIGTTIN)
  0           --once: RUN_ID was already done, CMD skipped
  64          usage: missing --key, CMD or `--`, malformed duration, URL, key
              or --class, a KEY named twice, --json (use --log-format json)
  69          Redis (or PostgreSQL for --once) unavailable: connect failed or
              timed out; fail-closed, CMD not run
  78          --once with a PostgreSQL URL in a Redis-only build (or a wrong
              password, a TLS or certificate failure); CMD not run
  70          the lease was lost while CMD ran (CMD was stopped)
  75          lock busy (after --wait, if given)
  124         --timeout passed (CMD was stopped)
  126, 127    CMD could not be executed / was not found

Logs go to stderr. By default only problems are reported (busy, lost, timeout,
stopped, skipped, errors). With an explicit --log-format every event is logged
(acquired, busy, renewed, lost, timeout, stopped, released, skipped, error);
with --log-format json each line is one JSON object with event, lock_key,
job_id, outcome and elapsed_ms.)";

struct RunArgs {
  std::vector<std::string> keys;  // one: a lock or a permit; several: all or none
  std::string ttl = "30s";
  std::string wait;
  std::string timeout;
  std::string grace = "10s";
  bool fence = false;
  bool fair = false;
  std::string permits;  // empty: a lock
  bool shared = false, exclusive = false;  // a read-write lock's reader / writer
  std::string once;
  std::string job_id;
  std::string cls = "run";
  std::string catalog;     // --catalog FILE: class --class's declaration
  bool ttl_given = false;  // --ttl on the command line (not its default)
  bool foreground = false;
  std::vector<std::string> cmd;
};

// Log lines on stderr: problems always, every event when the user asked for
// a log format explicitly. Main thread only.
struct Reporter {
  observe::EventLog log;
  bool verbose = false;
  std::string key, job_id, cls;

  void operator()(job::RunEvent ev) {
    if (!ev.problem && !verbose) return;
    if (!verbose && log.format() == observe::LogFormat::human) {
      std::cerr << "jobguard run: " << ev.message << std::endl;
      return;
    }
    if (!ev.message.empty()) ev.extra.emplace_back("message", ev.message);
    log.emit(observe::Event{.event = ev.event, .lock_key = key, .job_id = job_id, .lock_class = cls,
                            .outcome = ev.outcome, .elapsed_ms = ev.elapsed_ms, .extra = std::move(ev.extra)});
  }
};

// --catalog: the class's declaration sets the lock's kind, TTL, fencing and
// time limit. A flag that says the same thing is refused rather than
// silently overridden (or overriding): the catalog is the one declaration.
void apply_catalog(RunArgs& a) {
  const job::LockClass cls = job::Catalog::load(a.catalog).get(a.cls);
  for (const auto& [given, flag] : {std::pair{a.ttl_given, "--ttl"}, std::pair{!a.permits.empty(), "--permits"},
                                    std::pair{a.shared, "--shared"}, std::pair{a.exclusive, "--exclusive"}})
    if (given)
      throw Error(errc::invalid_argument,
                  fmt::format("{} with --catalog: class '{}' in {} declares it", flag, cls.name, a.catalog));
  a.ttl = fmt::format("{}ms", cls.ttl.count());
  a.fence = a.fence || cls.fenced || cls.consequence == job::Consequence::high;
  if (cls.permits > 0) a.permits = std::to_string(cls.permits);
  a.shared = cls.mode == LockMode::shared;
  a.exclusive = cls.mode == LockMode::exclusive;
  // A renewing class is stopped at its hard timeout; any other must finish within its TTL.
  if (a.timeout.empty()) a.timeout = fmt::format("{}ms", (cls.long_running ? cls.hard_timeout : cls.ttl).count());
}

class Runner {
 public:
  Runner(const Globals& g, const RunArgs& a, Reporter& rep) : g_(g), a_(a), rep_(rep) {}

  int run() {
    // Everything a user can get wrong is checked before touching the network,
    // so a usage error is 64 even when Redis is down.
    job::LockedRunOptions o = options();
    KeyBuilder keys;
    const std::string& key = a_.keys.front();
    rep_.key = !a_.permits.empty() ? keys.permit_holders_key(key)
               : a_.shared           ? keys.rw_readers_key(key)
               : a_.exclusive        ? keys.rw_writer_key(key)
                                     : keys.lock_key(key);
    for (std::size_t i = 1; i < a_.keys.size(); ++i) rep_.key += "," + keys.lock_key(a_.keys[i]);
    rep_.job_id = a_.job_id;
    rep_.cls = a_.cls;
    auto conn = redis::parse_url(g_.redis_url);
    if (conn.client_name.empty()) conn.client_name = "jobguard-run";
    (void)make_token(a_.job_id);  // validates --job-id (no '#', no whitespace)

    // Fail-closed, within the connect deadline.
    redis::Client client(conn);
    try {
      client.exec(redis::Command{"PING"}, redis::CallOptions{conn.connect_timeout});
    } catch (const Error& e) {
      throw connect_error(e, redis::to_display_url(conn), "; CMD not run (fail-closed)");
    }

    // Before the lock and lease (destroyed after them): its last batch, sent
    // on return, carries this run's acquire, hold and release.
    observe::FleetPublisher fleet(client);

    std::unique_ptr<guard::CompletionStore> done_store;
    if (!a_.once.empty()) done_store = open_completion_store(client);
    o.once = done_store.get();
    return status_of(job::run_locked(client, keys, std::move(o), std::ref(rep_)));
  }

 private:
  // The run's options from the flags; throws invalid_argument (exit 64).
  job::LockedRunOptions options() const {
    refuse_json(g_, "run prints nothing of its own on stdout (CMD's output is CMD's); --log-format json makes its "
                    "log lines on stderr JSON");
    if (a_.cmd.empty()) throw Error(errc::invalid_argument, "no CMD given: put the command after `--`");
    job::LockedRunOptions o;
    o.resource = a_.keys.front();
    if (a_.keys.size() > 1) {
      check_several();
      o.more_resources.assign(a_.keys.begin() + 1, a_.keys.end());
    }
    o.lock.ttl = parse_duration_ms(a_.ttl, "--ttl");
    if (o.lock.ttl < milliseconds(10))
      throw Error(errc::invalid_argument, fmt::format("--ttl {} is below the minimum of 10ms", a_.ttl));
    o.lock.wait = a_.wait.empty() ? milliseconds(0) : parse_duration_ms(a_.wait, "--wait");
    o.lock.fence = a_.fence;
    o.lock.fair = a_.fair;
    lock_kind(o.lock);
    o.lock.job_id = a_.job_id;
    try {
      job::validate_class_name(a_.cls);
    } catch (const Error& e) {
      throw Error(errc::invalid_argument, fmt::format("--class: {}", e.detail()));
    }
    o.lock.lock_class = a_.cls;
    o.cmd.argv = a_.cmd;
    o.cmd.timeout = a_.timeout.empty() ? milliseconds(0) : parse_duration_ms(a_.timeout, "--timeout");
    o.cmd.grace = parse_duration_ms(a_.grace, "--grace");
    o.cmd.forward_signals = true;
    o.cmd.foreground = a_.foreground;
    if (a_.foreground && !::isatty(STDIN_FILENO))
      throw Error(errc::invalid_argument, "--foreground: standard input is not a terminal");
    if (!a_.once.empty() && (a_.once.find_first_of(" \t\r\n") != std::string::npos || a_.once.size() > 512))
      throw Error(errc::invalid_argument, fmt::format("--once \"{}\": a run id must be 1..512 bytes without whitespace", a_.once));
    o.run_id = a_.once;
    for (const auto& k : a_.keys) KeyBuilder::validate_resource(k);  // names the key and the offending character
    // Records meant for PostgreSQL are never quietly kept in Redis instead.
    if (!a_.once.empty() && !g_.postgres_url.empty()) pg::require("--once with --postgres (or $JOBGUARD_POSTGRES_URL)");
    return o;
  }

  // Several --key: all or none of plain locks, so nothing that is about one KEY.
  void check_several() const {
    if (!a_.permits.empty()) throw Error(errc::invalid_argument, "--permits with several --key: a semaphore is on one KEY");
    if (a_.fair) throw Error(errc::invalid_argument, "--fair with several --key: fair mode queues on one KEY");
    if (!a_.once.empty()) throw Error(errc::invalid_argument, "--once with several --key: a run record is for one KEY");
    if (a_.shared || a_.exclusive)
      throw Error(errc::invalid_argument, fmt::format("{} with several --key: a read-write lock is on one KEY",
                                                      a_.shared ? "--shared" : "--exclusive"));
    std::vector<std::string> sorted = a_.keys;
    std::sort(sorted.begin(), sorted.end());
    if (auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end())
      throw Error(errc::invalid_argument, fmt::format("--key {} given twice", *d));
  }

  // A lock, a semaphore's permit (--permits) or a read-write lock's reader or
  // writer (--shared, --exclusive): one of them.
  void lock_kind(LockOptions& lock) const {
    if (!a_.permits.empty()) {
      int n = 0;
      const auto* end = a_.permits.data() + a_.permits.size();
      auto [p, ec] = std::from_chars(a_.permits.data(), end, n);
      if (ec != std::errc() || p != end || n < 1 || n > LockOptions::kMaxPermits)
        throw Error(errc::invalid_argument,
                    fmt::format("--permits {}: must be a whole number in 1..{}", a_.permits, LockOptions::kMaxPermits));
      if (a_.fair)
        throw Error(errc::invalid_argument, "--permits with --fair: semaphore permits are always served in order");
      lock.permits = n;
    }
    if (a_.shared && a_.exclusive)
      throw Error(errc::invalid_argument, "--shared with --exclusive: a run is a reader or the writer, not both");
    const char* rw = a_.shared ? "--shared" : "--exclusive";
    if ((a_.shared || a_.exclusive) && !a_.permits.empty())
      throw Error(errc::invalid_argument, fmt::format("{} with --permits: a read-write lock is not a semaphore", rw));
    if ((a_.shared || a_.exclusive) && a_.fair)
      throw Error(errc::invalid_argument,
                  fmt::format("{} with --fair: a read-write lock's line is always served in order", rw));
    if (a_.shared) lock.mode = LockMode::shared;
    if (a_.exclusive) lock.mode = LockMode::exclusive;
  }

  // The exit status of a run that got as far as the lock (see kRunHelp).
  static int status_of(const job::LockedRunResult& r) {
    using S = job::LockedRunResult::Status;
    if (r.status == S::busy) return exit_code::busy;
    if (r.status == S::skipped) return exit_code::ok;
    switch (r.outcome.ending) {
      case job::Ending::failed_to_start: return r.outcome.error == ENOENT ? 127 : 126;
      case job::Ending::timed_out: return r.lost ? exit_code::lease_lost : exit_code::timeout;
      case job::Ending::stopped: return r.lost ? exit_code::lease_lost : 128 + r.outcome.signal;  // as a shell reports it
      default: break;
    }
    if (r.lost) return exit_code::lease_lost;
    if (r.record_failed) return exit_status_for(r.record_error);
    return r.outcome.status.shell_status();
  }

  std::unique_ptr<guard::CompletionStore> open_completion_store(redis::Client& client) {
    if (g_.postgres_url.empty()) return std::make_unique<guard::RedisCompletionStore>(client);
    guard::PgOptions po;
    po.url = g_.postgres_url;
    po.application_name = "jobguard-run";
    try {
      return pg::completion_store(po, false);
    } catch (const Error& e) {
      if (next_step_for(e.code()) == next_step::retry_call)
        throw Error(errc::postgres_unavailable, fmt::format("cannot reach PostgreSQL for --once: {}; CMD not run (fail-closed)", e.what()));
      throw;
    }
  }

  const Globals& g_;
  const RunArgs& a_;
  Reporter& rep_;
};

}  // namespace

void add_run(CLI::App& root, Globals& g, Commands& out) {
  auto args = std::make_shared<RunArgs>();
  auto* sub = root.add_subcommand("run", "Run CMD while holding a Redis lock (a distributed flock)");
  sub->footer(exit_status_help(kRunHelp));
  // One value per --key: `--key A B` is not two keys (B would be taken from CMD's side).
  sub->add_option("--key", args->keys, "Resource to lock, e.g. invoice:48291 (required; repeat to hold several, all or none)")
      ->required()
      ->allow_extra_args(false);
  sub->add_option("--ttl", args->ttl, "Lock TTL; renewed every ttl/3 (>= 10ms)")->check(duration_validator())->capture_default_str();
  sub->add_option("--wait", args->wait, "Wait up to DUR for a busy lock (default: try once)")->check(duration_validator());
  sub->add_option("--timeout", args->timeout, "Hard timeout for CMD, from its start (exit 124)")->check(duration_validator());
  sub->add_option("--grace", args->grace, "Time between SIGTERM and SIGKILL when stopping CMD")
      ->check(duration_validator())
      ->capture_default_str();
  sub->add_flag("--fence", args->fence, "Issue a fencing token, exported as JOBGUARD_FENCE");
  sub->add_flag("--fair", args->fair, "FIFO handoff among waiters (every contender must use --fair)");
  sub->add_option("--permits", args->permits, "Hold one of N permits of a counting semaphore on KEY (1..10000)");
  sub->add_flag("--shared", args->shared, "Hold KEY's read-write lock as one of its readers (docs/rwlock.md)");
  sub->add_flag("--exclusive", args->exclusive, "Hold KEY's read-write lock as its writer, alone (docs/rwlock.md)");
  sub->add_option("--once", args->once, "Skip CMD if RUN_ID is recorded as done; record it when CMD exits 0");
  sub->add_option("--job-id", args->job_id, "Job id for the owner token and the logs");
  sub->add_option("--class", args->cls, "Lock class of this run's metrics and logs (a catalog class name)")
      ->capture_default_str();
  sub->add_option("--catalog", args->catalog,
                  "Lock catalog YAML: --class NAME's declaration sets the lock (permits or mode), ttl, fencing, timeout");
  sub->add_flag("--foreground", args->foreground, "Put CMD in the terminal's foreground process group (it may read it)");
  // CLI11 checks that CMD is there; its words are taken verbatim from the
  // command line (cmd_after_dashes) because CLI11 rewrites "[a,b]" as a list.
  sub->add_option("CMD", args->cmd, "The command and its arguments, after --")->required();
  CLI::Option* log_format = root.get_option_no_throw("--log-format");
  CLI::Option* ttl = sub->get_option("--ttl");
  out.emplace_back(sub, [&g, args, log_format, ttl] {
    Reporter rep{observe::EventLog(observe::parse_log_format(g.log_format)), log_format && log_format->count() > 0};
    auto verbatim = cmd_after_dashes({"run"});
    try {
      if (!verbatim) throw Error(errc::invalid_argument, "CMD must follow `--`: jobguard run --key KEY [FLAGS] -- CMD [ARGS...]");
      args->cmd = std::move(*verbatim);
      args->ttl_given = ttl->count() > 0;
      if (!args->catalog.empty()) apply_catalog(*args);
      Runner runner(g, *args, rep);
      return runner.run();
    } catch (const Error& e) {
      // Reported here rather than by main so --log-format json stays one JSON
      // object per line.
      rep(job::RunEvent{"error", "error", std::nullopt, true, e.what(), {}});
      return exit_status_for(e);
    }
  });
}

}  // namespace jobguard::cli
