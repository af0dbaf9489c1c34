// `jobguard jobs`: enqueue and inspect a Redis Streams job queue
// (job::StreamSource); `jobs work` (cmd_jobs_work.cpp) is the worker.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "jobguard/job/stream_source.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::cli {
namespace {

constexpr const char* kJobsHelp = R"(A job queue on a Redis Stream with a consumer group (at-least-once).

  jobguard jobs add  --stream S [--group G] [--unique STRATEGY [--unique-for DUR]
                     [--on-conflict reject|replace|log] [--unique-by FIELD]...] FIELD=VALUE...
  jobguard jobs ls   --stream S [--group G] [--count 100]
  jobguard jobs dead --stream S [--count 100]
  jobguard jobs retry --stream S (DEAD_ID... | --all [--count 1000])
  jobguard jobs work --stream S --class NAME [--group G] [--consumer NAME]
                     [--consequence low|moderate] [--on-redis-down fail-closed|fail-open]
                     [--ttl 30s] [--timeout DUR] [--claim-idle 30s] [--max-attempts 5]
                     [--id-field id] [--run-field run] [--key-pattern CLASS:{id}]
                     [--grace 10s] [--fence] [--max-jobs N] [--exit-when-idle DUR]
                     [--concurrency 1] [--catalog FILE] [--unique-reap-interval 30s]
                     [--rate [FIELD=]N/PERIOD]...
                     -- CMD [ARGS...]

add   appends one job (XADD) and prints its id ({"id":...} with --json).
      --unique STRATEGY enqueues it once however often it is added
      (docs/unique-jobs.md): a unique lock on the values of the --unique-by
      fields (default: id), held by this job alone,
        until-executed             until it leaves the queue (done or dead-lettered)
        until-and-while-executing  until its run starts (runs stay one per unit)
        until-expired              for --unique-for DUR (required), whatever happens
        while-executing            no lock at enqueue; a copy delivered while
                                   its unit runs is a conflict at the worker
      --unique-for DUR caps the first two (default: no TTL; the workers' reaper
      frees a lock whose job is gone). A conflict (the lock held by a job that
      is waiting or running): reject (the default: nothing added, exit 75,
      names the holder), replace (the holder is deleted if not yet delivered,
      else reject), log (nothing added, reported on stderr, exit 0). For
      while-executing, reject dead-letters the copy and log acknowledges it.
ls    the stream's length, the group's pending jobs (id, consumer, idle time,
      deliveries) and the dead-letter stream's length.
dead  the dead-letter entries (newest first): the job's fields, its last error
      and how many times it was delivered.
retry puts dead letters back on the job stream with their own fields (a
      fresh entry: its deliveries start again at 1) and removes them from the
      dead-letter stream, in that order: a crash in between leaves the job in
      both (a duplicate delivery, which completion records absorb), never in
      neither. DEAD_ID is the dead-letter entry's id (`jobs dead`); --all
      takes the dead letters there are when it starts, up to --count, oldest
      first. Prints "DEAD_ID -> NEW_ID" per job ({"retried":[...]} with --json).
work  takes jobs (up to --concurrency at once, each its own supervised CMD)
      and runs CMD for each, guarded as the lock
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
        JOBGUARD_PERMITS, JOBGUARD_PERMIT_SLOT
                                  a --catalog class with permits: N (or the
                                  count stored for the resource), and this
                                  holder's slot in 0..N-1
        JOBGUARD_FIELD_<NAME>     each job field (NAME upper-cased, other than
                                  A-Z and 0-9 -> '_')
      CMD exits 0: the job is acknowledged. Non-zero: the attempt failed; after
      --max-attempts deliveries the job moves to the dead-letter stream with
      the error ("exit status 3"). Lock busy, lease lost, timeout, Redis
      unavailable: the job stays pending and is taken over after --claim-idle.
      Already done: acknowledged without running CMD ("skipped").
      When the lease is lost or --timeout passes, CMD's group gets SIGTERM and
      SIGKILL after --grace. SIGINT/SIGTERM stop the worker: every running
      CMD gets SIGTERM (a second signal: SIGKILL), their jobs stay pending, exit 0.
      A job without the --id-field (or with one the key pattern cannot take)
      goes to the dead-letter stream at once: no retry can mend it.
      One log line per job on stderr (--log-format human|json); with --json a
      summary object on stdout at exit.

      --rate [FIELD=]N/PERIOD: at most N starts per PERIOD for each value of
      the job's FIELD (without FIELD: for the whole class), counted in Redis
      (GCRA: an even spacing, shared by every worker, kept across restarts);
      a job over the limit waits in its slot for its turn, never dropped and
      never failed (docs/jobs.md).
      A unique job (add --unique) gives its lock up as its strategy says; every
      --unique-reap-interval the worker frees unique locks whose job is gone.

--max-jobs N counts jobs that left the queue (acknowledged or dead-lettered);
--exit-when-idle DUR stops after DUR in which no job was delivered.

Exit status: 0 ok (work: stopped by a signal, --max-jobs or --exit-when-idle);
64 usage (bad FIELD=VALUE, unknown --consequence or --on-redis-down, missing
--stream, --class, or CMD after `--`; a --rate of 0 or without N/PERIOD;
retry with neither DEAD_ID nor --all,
or both; an unknown --unique or --on-conflict, --unique-for or --unique-by
where the strategy takes none, --unique-for without --unique); 65 retry: a
DEAD_ID that is not in the dead-letter stream (the others are retried);
69 Redis unreachable; 75 add --unique: the job is already enqueued (reject).)";

using Fields = std::vector<std::pair<std::string, std::string>>;

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

struct AddArgs {
  std::string stream, group = "jobguard";
  std::vector<std::string> fields;
  std::string unique, unique_for, on_conflict;
  std::vector<std::string> unique_by;
};

// The --unique flags, checked before anything connects.
std::optional<job::UniqueOptions> unique_options(const AddArgs& a) {
  if (a.unique.empty()) {
    const char* stray = !a.unique_for.empty()    ? "--unique-for"
                        : !a.on_conflict.empty() ? "--on-conflict"
                        : !a.unique_by.empty()   ? "--unique-by"
                                                 : nullptr;
    if (stray) throw Error(errc::invalid_argument, fmt::format("{} needs --unique STRATEGY", stray));
    return std::nullopt;
  }
  job::UniqueOptions u;
  const auto strategy = job::parse_unique_strategy(a.unique);
  if (!strategy)
    throw Error(errc::invalid_argument,
                fmt::format("--unique \"{}\": expected until-executed, until-and-while-executing, until-expired or "
                            "while-executing",
                            a.unique));
  u.strategy = *strategy;
  if (!a.on_conflict.empty()) {
    const auto c = job::parse_unique_conflict(a.on_conflict);
    if (!c) throw Error(errc::invalid_argument,
                        fmt::format("--on-conflict \"{}\": expected reject, replace or log", a.on_conflict));
    u.on_conflict = *c;
  }
  if (!a.unique_for.empty()) {
    u.unique_for = parse_duration_ms(a.unique_for, "--unique-for");
    if (u.unique_for.count() <= 0) throw Error(errc::invalid_argument, "--unique-for: must be more than 0");
  }
  u.by = a.unique_by;
  try {
    job::validate(u);
  } catch (const Error& e) {
    // The library names its options; the user typed flags.
    std::string m(e.detail());
    for (auto [from, to] : {std::pair{"unique_for", "--unique-for"}, std::pair{"fields to key by", "--unique-by"}})
      if (auto at = m.find(from); at != std::string::npos) m.replace(at, std::string_view(from).size(), to);
    throw Error(errc::invalid_argument, m);
  }
  return u;
}

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
  const auto unique = unique_options(a);
  job::StreamOptions so;
  so.stream = a.stream;
  so.group = a.group;
  so.validate();
  auto client = connect_redis(g, "jobguard-jobs");
  job::StreamSource source(*client, so);
  source.ensure_group();
  if (!unique) {
    const std::string id = source.add(fields);
    if (g.json) std::cout << nlohmann::json{{"id", id}}.dump() << "\n";
    else std::cout << id << "\n";
    return exit_code::ok;
  }
  const auto r = source.add_unique(fields, *unique);
  if (r.result != job::UniqueAdd::Result::conflict) {
    if (g.json) {
      nlohmann::ordered_json j{{"id", r.id}, {"unique_key", r.lock_key}};
      if (!r.holder.empty()) j[r.result == job::UniqueAdd::Result::replaced ? "replaced" : "orphan_taken_over"] = r.holder;
      std::cout << j.dump() << "\n";
    } else {
      std::cout << r.id << "\n";
    }
    if (r.result == job::UniqueAdd::Result::replaced)
      std::cerr << fmt::format("jobs add: replaced job {} (not yet delivered) under {}\n", r.holder, r.lock_key);
    return exit_code::ok;
  }
  const std::string what = fmt::format("already enqueued as {} ({}) under {}", r.holder, r.holder_state, r.lock_key);
  if (g.json)
    std::cout << nlohmann::ordered_json{{"id", nullptr}, {"conflict", r.holder}, {"state", r.holder_state},
                                        {"unique_key", r.lock_key}}
                     .dump()
              << "\n";
  if (unique->on_conflict == job::UniqueConflict::log) {
    std::cerr << "jobs add: " << what << "; nothing added (--on-conflict log)\n";
    return exit_code::ok;
  }
  std::cerr << "jobs add: " << what << "; nothing added\n";
  return exit_code::busy;
}

struct LsArgs {
  std::string stream, group = "jobguard";
  std::size_t count = 100;
};

int run_ls(const Globals& g, const LsArgs& a) {
  job::StreamOptions so;
  so.stream = a.stream;
  so.group = a.group;
  so.validate();
  auto client = connect_redis(g, "jobguard-jobs");
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
  const auto unique = source.unique_locks(a.count);
  if (g.json) {
    auto locks = nlohmann::ordered_json::array();
    for (const auto& [lock, holder] : unique) locks.push_back(nlohmann::ordered_json{{"unique_key", lock}, {"id", holder}});
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
                             {"pending_entries", list},
                             {"unique_locks", locks}};
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
  if (!unique.empty()) {
    std::size_t kw = 10;
    for (const auto& u : unique) kw = std::max(kw, u.first.size());
    std::cout << fmt::format("{:<{}}  {}\n", "UNIQUE KEY", kw, "HELD BY");
    for (const auto& [lock, holder] : unique) std::cout << fmt::format("{:<{}}  {}\n", lock, kw, holder);
  }
  return exit_code::ok;
}

struct DeadArgs {
  std::string stream;
  std::size_t count = 100;
};

int run_dead(const Globals& g, const DeadArgs& a) {
  job::StreamOptions so;
  so.stream = a.stream;
  so.validate();
  auto client = connect_redis(g, "jobguard-jobs");
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

struct RetryArgs {
  std::string stream;
  std::vector<std::string> ids;
  bool all = false;
  std::size_t count = 1000;
};

int run_retry(const Globals& g, const RetryArgs& a) {
  if (a.all == !a.ids.empty())
    throw Error(errc::invalid_argument, a.all ? "jobs retry: give DEAD_ID... or --all, not both"
                                              : "jobs retry: give the dead letters' ids (DEAD_ID...) or --all");
  if (a.all && a.count == 0) throw Error(errc::invalid_argument, "--count 0: retry at least one dead letter");
  job::StreamOptions so;
  so.stream = a.stream;
  so.validate();
  auto client = connect_redis(g, "jobguard-jobs");
  job::StreamSource source(*client, so);
  std::vector<std::string> ids = a.ids;
  if (a.all) {
    // A snapshot: dead letters that arrive while this runs wait for the next
    // retry, so a job that keeps failing cannot keep this loop going.
    for (const auto& d : source.dead_letters(a.count)) ids.push_back(d.id);
    std::reverse(ids.begin(), ids.end());  // oldest first: the stream keeps the order they failed in
  }
  auto retried = nlohmann::ordered_json::array();
  std::vector<std::string> missing;
  for (const auto& id : ids) {
    if (auto new_id = source.retry_dead_letter(id)) {
      retried.push_back(nlohmann::ordered_json{{"dead_id", id}, {"id", *new_id}});
      if (!g.json) std::cout << fmt::format("{} -> {}\n", id, *new_id);
    } else {
      missing.push_back(id);
    }
  }
  if (g.json)
    std::cout << nlohmann::ordered_json{{"stream", so.stream}, {"retried", retried}, {"missing", missing}}.dump()
              << "\n";
  else if (ids.empty())
    std::cout << fmt::format("no dead letters in {}\n", source.dead_letter_stream());
  if (missing.empty()) return exit_code::ok;
  std::cerr << fmt::format("jobguard jobs retry: not in {}: {}\n", source.dead_letter_stream(),
                           fmt::join(missing, ", "));
  return exit_code::data;
}

}  // namespace

void add_jobs(CLI::App& root, Globals& g, Commands& out) {
  auto* jobs = root.add_subcommand("jobs", "A Redis Streams job queue: add, ls, dead, retry, work");
  jobs->footer(exit_status_help(kJobsHelp));
  jobs->require_subcommand(1);
  jobs->fallthrough();

  auto add_args = std::make_shared<AddArgs>();
  auto* add = jobs->add_subcommand("add", "Enqueue one job (XADD); prints its id");
  add->fallthrough();
  add->footer(exit_status_help(
      "Exit status: 0 enqueued (its id printed), or with --unique and --on-conflict log nothing added;\n"
      "75 --unique: already enqueued (nothing added; the holder named)."));
  add->add_option("--stream", add_args->stream, "Stream key (required)")->required();
  add->add_option("--group", add_args->group, "Consumer group (created if missing)")->capture_default_str();
  add->add_option("--unique", add_args->unique,
                  "until-executed, until-and-while-executing, until-expired or while-executing");
  add->add_option("--unique-for", add_args->unique_for, "The unique lock's TTL (until-expired: required)");
  add->add_option("--on-conflict", add_args->on_conflict, "reject (default, exit 75), replace or log");
  add->add_option("--unique-by", add_args->unique_by, "Field whose value makes the unique key (default id; repeatable)")
      ->allow_extra_args(false);
  add->add_option("FIELD=VALUE", add_args->fields, "The job's fields")->required();
  out.emplace_back(add, reported("jobs add", [&g, add_args] { return run_add(g, *add_args); }));

  auto ls_args = std::make_shared<LsArgs>();
  auto* ls = jobs->add_subcommand("ls", "Stream length, pending jobs, dead-letter length");
  ls->fallthrough();
  ls->footer(exit_status_help("Exit status: 0 ok."));
  ls->add_option("--stream", ls_args->stream, "Stream key (required)")->required();
  ls->add_option("--group", ls_args->group, "Consumer group")->capture_default_str();
  ls->add_option("--count", ls_args->count, "Show at most N pending entries")->capture_default_str();
  out.emplace_back(ls, reported("jobs ls", [&g, ls_args] { return run_ls(g, *ls_args); }));

  auto dead_args = std::make_shared<DeadArgs>();
  auto* dead = jobs->add_subcommand("dead", "Dead-letter entries with their last error");
  dead->fallthrough();
  dead->footer(exit_status_help("Exit status: 0 ok."));
  dead->add_option("--stream", dead_args->stream, "Stream key (required)")->required();
  dead->add_option("--count", dead_args->count, "Show at most N entries (newest first)")->capture_default_str();
  out.emplace_back(dead, reported("jobs dead", [&g, dead_args] { return run_dead(g, *dead_args); }));

  auto retry_args = std::make_shared<RetryArgs>();
  auto* retry = jobs->add_subcommand("retry", "Put dead letters back on the job stream");
  retry->fallthrough();
  retry->footer(exit_status_help("Exit status: 0 retried; 65 a DEAD_ID not in the dead-letter stream (the others are retried)."));
  retry->add_option("--stream", retry_args->stream, "Stream key (required)")->required();
  retry->add_flag("--all", retry_args->all, "Every dead letter there is when it starts (up to --count)");
  retry->add_option("--count", retry_args->count, "With --all: at most N, oldest first")->capture_default_str();
  retry->add_option("DEAD_ID", retry_args->ids, "Dead-letter entry ids (jobs dead)");
  out.emplace_back(retry, reported("jobs retry", [&g, retry_args] { return run_retry(g, *retry_args); }));

  add_jobs_work(*jobs, g, out);
}

}  // namespace jobguard::cli
