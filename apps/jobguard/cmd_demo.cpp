// `jobguard demo`: the billing scenario of BRIEF §3, guarded beside naive,
// on an embedded redis-server unless --redis is given.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli.hpp"
#include "jobguard/testing/embedded_redis.hpp"
#include "billing/demo.hpp"

namespace jobguard::cli {
namespace {

struct DemoArgs {
  int workers = 8;
  int subscriptions = 120000;
  double scale = 0.01;
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

void print_table(const job::BillingDemoResult& res, bool postgres) {
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
                     postgres ? "PostgreSQL" : "an in-process stand-in for PostgreSQL (give --postgres URL for the real one)");
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

int demo(CLI::App* root, const Globals& g, const DemoArgs& a) {
  job::BillingDemoOptions o;
  o.workers = a.workers;
  o.subscriptions = a.subscriptions;
  o.scale = a.scale;
  // The durable completion records of the guarded run.
  if (root->get_option("--postgres")->count() > 0) o.postgres_url = g.postgres_url;
  std::optional<EmbeddedRedis> embedded;
  if (root->get_option("--redis")->count() > 0) {
    o.redis_url = g.redis_url;
  } else {
    embedded.emplace();
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
    nlohmann::json j{{"subscriptions", res.subscriptions},
                     {"workers", res.workers},
                     {"chunk", res.chunk},
                     {"scale", res.scale},
                     {"redis_restarted", res.redis_restarted},
                     {"completion_store", o.postgres_url.empty() ? "memory" : "postgres"},
                     {"guarded", run_json(res.guarded)},
                     {"naive", run_json(res.naive)},
                     {"metrics",
                      {{"acquisitions", res.acquisitions},
                       {"contention", res.contention},
                       {"p99_hold_s", res.p99_hold_s},
                       {"leases_lost", res.leases_lost},
                       {"renewals", res.renewals},
                       {"redis_errors", res.redis_errors}}}};
    std::fputs((j.dump(2) + "\n").c_str(), stdout);
  } else {
    print_table(res, !o.postgres_url.empty());
  }
  return exit_code::ok;
}

void add(CLI::App& root, Globals& g, Commands& out) {
  auto* sub = root.add_subcommand("demo", "Run the billing scenario, guarded beside naive, with injected faults");
  auto args = std::make_shared<DemoArgs>();
  sub->add_option("--workers", args->workers, "Worker threads per run")->capture_default_str()->check(CLI::Range(1, 256));
  sub->add_option("--subscriptions", args->subscriptions, "Subscriptions to charge")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000000));
  sub->add_option("--scale", args->scale, "Multiplies every charge time (200 ms avg, slowest 1% 8 s)")
      ->capture_default_str()
      ->check(CLI::Range(0.0001, 10.0));
  sub->footer(exit_status_help(
      "Starts a private redis-server unless --redis is given (then the Redis restart fault is skipped).\n"
      "With --postgres URL the guarded run keeps its completion records in PostgreSQL (migrated first).\n"
      "Exit status: 0 the scenario ran (its report says how each side did)."));
  CLI::App* rootp = &root;
  out.emplace_back(sub, [rootp, &g, args] { return demo(rootp, g, *args); });
}

}  // namespace

void add_demo(CLI::App& root, Globals& g, Commands& out) { add(root, g, out); }
}  // namespace jobguard::cli
