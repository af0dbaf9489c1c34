// `jobguard demo`: the billing scenario, guarded beside naive, on an embedded
// redis-server unless a Redis URL is given (--redis or $JOBGUARD_REDIS_URL),
// with the guarded run's completion records in an embedded PostgreSQL unless
// a PostgreSQL URL is given likewise (or the in-process stand-in, when asked
// for with --completions memory, and always in a Redis-only build).
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cli.hpp"
#include "jobguard/error.hpp"
#include "jobguard/testing/embedded_postgres.hpp"
#include "jobguard/testing/embedded_redis.hpp"
#include "billing/demo.hpp"
#include "postgres.hpp"

namespace jobguard::cli {
namespace {

struct DemoArgs {
  int workers = 8;
  int subscriptions = 120000;
  double scale = 0.01;
  // postgres | memory; a Redis-only build has only the stand-in.
  std::string completions = pg::built_in() ? "postgres" : "memory";
};

// The embedded servers must not outlive the demo, nor leave their temporary
// directories behind, when it is interrupted. Their children already die with
// the process (parent-death signal), but a killed process runs no
// destructors: SIGINT and SIGTERM are taken by a thread of their own
// (sigwait) that stops the servers, removes their directories and exits as
// the signal would have. Blocked before any thread starts so every thread
// inherits the mask and only that one receives them.
class InterruptCleanup {
 public:
  InterruptCleanup() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    std::thread([this] {
      int sig = 0;
      while (sigwait(&set_, &sig) != 0) {
      }
      std::lock_guard<std::mutex> g(mu_);
      if (postgres_ != nullptr || redis_ != nullptr)
        std::fputs("\njobguard demo: interrupted; stopping and removing the embedded servers\n", stderr);
      if (postgres_ != nullptr) {
        // Not stop_immediate(): the main thread may be in start(), with
        // initdb running or the server about to be started.
        postgres_->abandon();
        std::error_code ec;
        std::filesystem::remove_all(postgres_->dir(), ec);
      }
      if (redis_ != nullptr) {
        redis_->kill();
        std::error_code ec;
        std::filesystem::remove_all(redis_->dir(), ec);
      }
      ::_exit(128 + sig);
    }).detach();  // lives until the process exits: a signal may come at any time
  }
  void watch(EmbeddedPostgres* pg, EmbeddedRedis* redis) {
    std::lock_guard<std::mutex> g(mu_);
    postgres_ = pg;
    redis_ = redis;
  }
  // Before the servers are destroyed: from here a signal just ends the process.
  void forget() { watch(nullptr, nullptr); }

 private:
  sigset_t set_{};
  std::mutex mu_;
  EmbeddedPostgres* postgres_ = nullptr;
  EmbeddedRedis* redis_ = nullptr;
};

nlohmann::json run_json(const job::BillingRunResult& r) {
  return {{"double_charges", r.double_charges},
          {"missing", r.missing},
          {"stale_writes_rejected", r.stale_writes_rejected},
          {"stale_writes_accepted", r.stale_writes_accepted},
          {"charges", r.charges},
          {"idempotent_replays", r.idempotent_replays},
          {"chunks_reclaimed", r.chunks_reclaimed},
          {"chunks_skipped", r.chunks_skipped},
          {"attempts_abandoned", r.attempts_abandoned},
          {"dead_lettered", r.dead_lettered},
          {"makespan_s", r.makespan_s},
          {"ideal_makespan_s", r.ideal_makespan_s}};
}

// Where the guarded run's completion records went, for the table's header.
std::string store_description(const std::string& completions, const EmbeddedPostgres* embedded) {
  if (completions == "memory")
    return "an in-process stand-in for PostgreSQL (--completions memory; lost when the demo ends)";
  if (embedded != nullptr)
    return fmt::format("PostgreSQL (a private server the demo started on 127.0.0.1:{}, removed afterwards; "
                       "--postgres URL for your own)",
                       embedded->port());
  return "PostgreSQL (--postgres)";
}

void print_table(const job::BillingDemoResult& res, const std::string& store) {
  const auto& g = res.guarded;
  const auto& n = res.naive;
  auto vs = [](const job::BillingRunResult& r) {
    return fmt::format("{:.2f}s ({:+.1f}%)", r.makespan_s, (r.makespan_s / r.ideal_makespan_s - 1) * 100);
  };
  std::string out;
  out += fmt::format(
      "Billing demo: {} subscriptions, {} workers per run, chunks of {}, scale {} "
      "(charge 200 ms avg, slowest 1% 8 s, times scaled)\n",
      res.subscriptions, res.workers, res.chunk, res.scale);
  out += fmt::format("Faults in both runs: a worker killed after charging, before its ack; a worker paused past its "
                     "TTL; {}\n",
                     res.redis_restarted ? "a Redis restart without persistence" : "(no Redis restart: external Redis)");
  out += fmt::format("Guarded run: GuardedRunner, lock class 'billing' (moderate, long-running, fenced, fail-closed); "
                     "completion records in {}\n\n",
                     store);
  out += fmt::format("  {:<34} {:>18} {:>18}\n", "", "guarded", "naive");
  out += fmt::format("  {:<34} {:>18} {:>18}\n", "double charges", g.double_charges, n.double_charges);
  out += fmt::format("  {:<34} {:>18} {:>18}\n", "missing subscriptions", g.missing, n.missing);
  out += fmt::format("  {:<34} {:>18} {:>18}\n", "stale writes rejected", g.stale_writes_rejected,
                     n.stale_writes_rejected);
  out += fmt::format("  {:<34} {:>18} {:>18}\n", "stale writes let through", g.stale_writes_accepted,
                     n.stale_writes_accepted);
  out += fmt::format("  {:<34} {:>18} {:>18}\n", "charges answered by idempotency key", g.idempotent_replays,
                     n.idempotent_replays);
  out += fmt::format("  {:<34} {:>18} {:>18}\n", "jobs reclaimed (XAUTOCLAIM)", g.chunks_reclaimed,
                     n.chunks_reclaimed);
  out += fmt::format("  {:<34} {:>18} {:>18}\n", "makespan (vs ideal)", vs(g), vs(n));
  out += fmt::format("  {:<34} {:>18.2f}s {:>17.2f}s\n\n", "ideal = total work / workers", g.ideal_makespan_s,
                     n.ideal_makespan_s);
  out += fmt::format(
      "Guarded lock class: {} acquisitions, {} busy answers, p99 hold {:.3f}s, {} renewals, {} leases lost, "
      "{} Redis errors\n",
      res.acquisitions, res.contention, res.p99_hold_s, res.renewals, res.leases_lost, res.redis_errors);
  std::fputs(out.c_str(), stdout);
}

// The report --json prints (`postgres`: none, embedded or given).
nlohmann::json report_json(const job::BillingDemoResult& res, const job::BillingDemoOptions& o, bool embedded_pg) {
  const bool memory = o.completions == nullptr;
  nlohmann::json j{{"subscriptions", res.subscriptions},
                   {"workers", res.workers},
                   {"chunk", res.chunk},
                   {"scale", res.scale},
                   {"redis_restarted", res.redis_restarted},
                   {"completion_store", memory ? "memory" : "postgres"},
                   {"postgres", memory ? "none" : embedded_pg ? "embedded" : "given"},
                   {"guarded", run_json(res.guarded)},
                   {"naive", run_json(res.naive)},
                   {"metrics",
                    {{"acquisitions", res.acquisitions},
                     {"contention", res.contention},
                     {"p99_hold_s", res.p99_hold_s},
                     {"leases_lost", res.leases_lost},
                     {"renewals", res.renewals},
                     {"redis_errors", res.redis_errors}}}};
  return j;
}

int demo(CLI::App* root, const Globals& g, const DemoArgs& a) {
  // An explicit --completions memory wins over $JOBGUARD_POSTGRES_URL, not
  // over an explicit --postgres.
  const bool memory_asked =
      a.completions == "memory" && root->get_subcommand("demo")->get_option("--completions")->count() > 0;
  if (root->get_option("--postgres")->count() > 0 && memory_asked)
    throw Error(errc::invalid_argument, "--completions memory and --postgres exclude each other");
  // A Redis-only build's default is the stand-in: a PostgreSQL the user names
  // is refused, never quietly replaced by it.
  if (g.postgres_given && !memory_asked)
    pg::require("--postgres (or $JOBGUARD_POSTGRES_URL)");
  if (a.completions == "postgres") pg::require("--completions postgres");
  const bool postgres_given = g.postgres_given && a.completions == "postgres";
  job::BillingDemoOptions o;
  o.workers = a.workers;
  o.subscriptions = a.subscriptions;
  o.scale = a.scale;
  // Never destroyed: its thread may take a signal until the process exits.
  static InterruptCleanup& cleanup = *new InterruptCleanup();
  // The durable completion records of the guarded run: the given PostgreSQL,
  // else a private one, unless the stand-in was asked for.
  std::optional<EmbeddedPostgres> embedded_pg;
  std::unique_ptr<guard::CompletionStore> completions;
  std::optional<EmbeddedRedis> embedded;
  struct Forget {
    InterruptCleanup& c;
    ~Forget() { c.forget(); }
  } forget{cleanup};  // declared after the servers: runs before their destructors
  guard::PgOptions po;
  po.application_name = "jobguard-demo";
  if (postgres_given) {
    po.url = g.postgres_url;
  } else if (a.completions == "postgres") {
    embedded_pg.emplace();
    cleanup.watch(&*embedded_pg, nullptr);
    // On stderr in --json mode too: it says what runs and where.
    std::fputs(fmt::format("jobguard demo: starting a private PostgreSQL for the completion records (initdb in {})\n",
                           embedded_pg->dir())
                   .c_str(),
               stderr);
    embedded_pg->start();
    po.url = embedded_pg->url();
  }
  if (!po.url.empty()) {
    completions = pg::completion_store(po, true);
    o.completions = completions.get();
  }
  if (g.redis_given) {
    o.redis_url = g.redis_url;
  } else {
    embedded.emplace();
    cleanup.watch(embedded_pg ? &*embedded_pg : nullptr, &*embedded);
    embedded->start();
    o.redis_url = embedded->url();
    o.restartable = &*embedded;
  }
  const bool bar = !g.json && ::isatty(STDERR_FILENO);
  if (bar) {
    o.progress = [](double gf, double nf) {
      auto draw = [](double f) {
        int w = static_cast<int>(f * 20);
        return std::string(static_cast<std::size_t>(w), '#') + std::string(static_cast<std::size_t>(20 - w), '.');
      };
      std::fputs(fmt::format("\r  guarded [{}] {:3.0f}%   naive [{}] {:3.0f}%", draw(gf), gf * 100, draw(nf), nf * 100)
                     .c_str(),
                 stderr);
    };
  }
  auto res = job::run_billing_demo(o);
  if (bar) std::fputs("\n", stderr);
  if (g.json) {
    const auto j = report_json(res, o, embedded_pg.has_value());
    std::fputs((j.dump(2) + "\n").c_str(), stdout);
  } else {
    print_table(res, store_description(a.completions, embedded_pg ? &*embedded_pg : nullptr));
  }
  return exit_code::ok;
}

}  // namespace

void add_demo(CLI::App& root, Globals& g, Commands& out) {
  auto* sub = root.add_subcommand("demo", "Run the billing scenario, guarded beside naive, with injected faults");
  auto args = std::make_shared<DemoArgs>();
  sub->add_option("--workers", args->workers, "Worker threads per run")->capture_default_str()->check(CLI::Range(1, 256));
  sub->add_option("--subscriptions", args->subscriptions, "Subscriptions to charge")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000000));
  sub->add_option("--scale", args->scale, "Multiplies every charge time (200 ms avg, slowest 1% 8 s)")
      ->capture_default_str()
      ->check(CLI::Range(0.0001, 10.0));
  sub->add_option("--completions", args->completions,
                  "Where the guarded run keeps its completion records: postgres (the --postgres URL, else a private "
                  "server) or memory (an in-process stand-in)")
      ->capture_default_str()
      ->check(CLI::IsMember({"postgres", "memory"}));
  sub->footer(exit_status_help(
      "Starts a private redis-server unless --redis (or $JOBGUARD_REDIS_URL) is given (then the Redis restart\n"
      "fault is skipped). The guarded run keeps its completion records in PostgreSQL: the --postgres URL (or\n"
      "$JOBGUARD_POSTGRES_URL; migrated first), else a\n"
      "private server the demo starts (initdb in a temporary directory, PostgreSQL 15 from\n"
      "/usr/lib/postgresql/15/bin, a free loopback port) and stops and removes when it ends or is interrupted.\n"
      "A Redis-only build (no PostgreSQL) keeps them in the in-process stand-in (--completions memory).\n"
      "Exit status: 0 the scenario ran (its report says how each side did); 130/143 interrupted by\n"
      "SIGINT/SIGTERM (the private servers stopped and removed); 78 a PostgreSQL asked of a Redis-only build."));
  CLI::App* rootp = &root;
  out.emplace_back(sub, [rootp, &g, args] { return demo(rootp, g, *args); });
}

}  // namespace jobguard::cli
