// `jobguard bench`: the flags, the server, and the output. The benchmarks
// themselves are the bench library's (bench/bench.hpp).
#include <fmt/format.h>

#include <functional>
#include <iostream>
#include <memory>

#include "bench.hpp"
#include "rate.hpp"
#include "cli.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "jobguard/job/limits.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/testing/embedded_redis.hpp"

using namespace std::chrono;

namespace jobguard::cli {
namespace {

struct BenchArgs {
  int workers = 64;
  double seconds = 3;
  std::string mode = "coro";
  int connections = 1;
  int rounds = 3;
  bool embedded = false;
  std::string only;  // "raw" or "lock"; empty = both
  bool contention = false;
  bool fair = false;
  std::string hold = "1ms";
  std::string resource = "bench:contention";
  bool workers_given = false, seconds_given = false;
  bool no_fleet = false;
  int jobs = 0;                      // --jobs M: the job path instead
  bool unique = false;               // --jobs --unique: guarded jobs enqueued unique
  std::string rate;                  // --jobs --rate N/PERIOD: the rate limiter's cost and pace
  std::vector<int> concurrency{1, 64};
  int leases = 0;                    // --leases N: the lease scheduler instead
  int permits = 0;                   // --permits N: one semaphore's acquire+release instead
  bool shared = false;               // --shared: read-write lock read pairs vs mutex pairs
};

// More than one benchmark, or the flags of the throughput one given to
// --shared or --permits.
void check_modes(const BenchArgs& a) {
  if ((a.jobs > 0) + (a.leases > 0) + a.contention + (a.permits != 0) + a.shared > 1)
    throw Error(errc::invalid_argument,
                "--jobs, --leases, --permits, --shared and --contention are separate benchmarks: pick one");
  const bool pair_flags = a.only.size() || a.mode != "coro" || a.connections != 1 || a.fair || a.hold != "1ms";
  if (a.shared && pair_flags)
    throw Error(errc::invalid_argument, "--shared takes none of --only, --mode, --connections, --fair, --hold");
  if (a.permits < 0 || a.permits > LockOptions::kMaxPermits)
    throw Error(errc::invalid_argument, fmt::format("--permits {}: must be 1..{}", a.permits, LockOptions::kMaxPermits));
  if (a.permits > 0 && pair_flags)
    throw Error(errc::invalid_argument, "--permits takes none of --only, --mode, --connections, --fair, --hold");
}

// Usage errors, found before any server is touched (in the order users have
// seen them reported).
void check_args(const BenchArgs& a) {
  if (a.workers < 1 || a.workers > 100000) throw Error(errc::invalid_argument, "--workers must be 1..100000");
  check_modes(a);
  if (a.jobs < 0 || a.jobs > 10000000) throw Error(errc::invalid_argument, "--jobs must be 1..10000000");
  if (a.unique && a.jobs == 0) throw Error(errc::invalid_argument, "--unique goes with --jobs M");
  if (!a.rate.empty() && (a.jobs <= 0 || a.unique))
    throw Error(errc::invalid_argument, "--rate goes with --jobs M, without --unique");
  if (a.leases < 0 || a.leases > 10000000) throw Error(errc::invalid_argument, "--leases must be 1..10000000");
  for (int c : a.concurrency)
    if (c < 1 || c > 4096) throw Error(errc::invalid_argument, fmt::format("--concurrency {}: must be 1..4096", c));
  if (a.contention && (a.only.size() || a.mode != "coro" || a.connections != 1))
    throw Error(errc::invalid_argument, "--contention takes none of --only, --mode, --connections");
  if (!a.contention && (a.fair || a.hold != "1ms" || (a.resource != "bench:contention" && a.permits == 0 && !a.shared)))
    throw Error(errc::invalid_argument,
                "--fair and --hold need --contention; --resource needs --contention, --permits or --shared");
  if (a.seconds <= 0 || a.seconds > 3600) throw Error(errc::invalid_argument, "--seconds must be in (0, 3600]");
}

bench::ContentionConfig contention_config(const BenchArgs& a) {
  bench::ContentionConfig cfg;
  cfg.workers = a.workers_given ? a.workers : 8;
  cfg.seconds = duration<double>(a.seconds_given ? a.seconds : 5.0);
  cfg.hold = parse_duration(a.hold, "--hold");
  cfg.fair = a.fair;
  cfg.resource = a.resource;
  if (cfg.workers < 2 || cfg.workers > 1024)
    throw Error(errc::invalid_argument, "--workers must be 2..1024 with --contention (one connection each)");
  if (cfg.hold > seconds(10)) throw Error(errc::invalid_argument, "--hold must be at most 10s");
  KeyBuilder::validate_resource(cfg.resource);
  return cfg;
}

// --permits and --shared: their own resource unless --resource names one.
bench::PairsConfig pairs_config(const BenchArgs& a) {
  bench::PairsConfig cfg{.workers = a.workers, .seconds = a.seconds, .rounds = a.rounds, .permits = a.permits};
  cfg.resource = a.resource != "bench:contention" ? a.resource : a.shared ? "bench:rwlock" : "bench:semaphore";
  KeyBuilder::validate_resource(cfg.resource);
  return cfg;
}

job::RateLimit parse_bench_rate(const std::string& text) {
  try {
    return job::parse_rate(text);
  } catch (const Error& e) {
    throw Error(errc::invalid_argument, fmt::format("--rate: {}", e.detail()));
  }
}

// --jobs --rate: the limiter's cost and pace (bench/rate.hpp).
bench::Report rate_report(const redis::ConnectionOptions& o, const bench::RateConfig& cfg, const std::string& rate) {
  auto j = bench::run_rate(o, cfg);
  j["rate"] = rate;
  j["redis"] = redis::to_display_url(o);
  return bench::Report{j, bench::rate_text(j), {}};
}

// The benchmark the flags ask for, its configuration checked: a usage error
// is found before the server is started or reached.
using Bench = std::function<bench::Report(const redis::ConnectionOptions&)>;
Bench plan(const BenchArgs& a) {
  using Opts = redis::ConnectionOptions;
  if (a.contention) return [cfg = contention_config(a)](const Opts& o) { return bench::contention(o, cfg); };
  if (a.permits > 0) return [cfg = pairs_config(a)](const Opts& o) { return bench::permits(o, cfg); };
  if (a.shared) return [cfg = pairs_config(a)](const Opts& o) { return bench::shared(o, cfg); };
  if (!a.rate.empty()) {
    bench::RateConfig cfg{.jobs = a.jobs, .concurrency = a.concurrency, .limit = parse_bench_rate(a.rate),
                          .window_s = a.seconds_given ? a.seconds : 10.0};
    return [cfg, rate = a.rate](const Opts& o) { return rate_report(o, cfg, rate); };
  }
  if (a.jobs > 0) {
    bench::JobsConfig cfg{.jobs = a.jobs, .concurrency = a.concurrency, .unique = a.unique};
    return [cfg](const Opts& o) { return bench::jobs(o, cfg); };
  }
  if (a.leases > 0) {
    const auto hold = duration_cast<milliseconds>(duration<double>(a.seconds_given ? a.seconds : 60.0));
    bench::LeasesConfig cfg{.leases = a.leases, .hold = hold};
    return [cfg](const Opts& o) { return bench::leases(o, cfg); };
  }
  bench::ThroughputConfig cfg{.workers = a.workers, .seconds = a.seconds, .mode = a.mode,
                              .connections = a.connections, .rounds = a.rounds, .only = a.only,
                              .fleet = !a.no_fleet};
  return [cfg](const Opts& o) { return bench::throughput(o, cfg); };
}

int run_bench(const Globals& g, const BenchArgs& a) {
  check_args(a);
  const Bench measure = plan(a);
  std::unique_ptr<EmbeddedRedis> server;
  redis::ConnectionOptions opts;
  if (a.embedded) {
    server = std::make_unique<EmbeddedRedis>();
    server->start();
    opts.host = server->host();
    opts.port = server->port();
    // A server we have just started empty: no lease can predate it, so it is
    // exempt from the data-loss quarantine (docs/lock-safety.md).
    redis::Client fresh(opts);
    trust_new_server(fresh);
  } else {
    opts = redis::parse_url(g.redis_url);
    bench::refuse_quarantined(opts);
  }
  opts.connections = a.connections;
  opts.command_timeout = seconds(5);
  const auto report = measure(opts);
  for (const auto& w : report.warnings) std::cerr << "jobguard bench: " << w << "\n";
  std::cout << (g.json ? report.json.dump() + "\n" : report.text);
  return exit_code::ok;
}

}  // namespace

void add_bench(CLI::App& root, Globals& g, Commands& out) {
  auto args = std::make_shared<BenchArgs>();
  auto* sub = root.add_subcommand("bench", "Measure acquire+release throughput against the raw commands");
  sub->footer(exit_status_help("Exit status: 0 measured."));
  auto* workers = sub->add_option("--workers", args->workers, "Concurrent callers (--contention: default 8)")->capture_default_str();
  auto* secs = sub->add_option("--seconds", args->seconds,
                               "Seconds per phase (--contention: default 5; --jobs --rate: the pace run, default 10)")
                   ->capture_default_str();
  sub->add_option("--mode", args->mode, "coro: coroutines on the event loop; threads: blocking threads")
      ->check(CLI::IsMember({"coro", "threads"}))
      ->capture_default_str();
  sub->add_option("--connections", args->connections, "Multiplexed connections")->check(CLI::Range(1, 64))->capture_default_str();
  sub->add_option("--only", args->only, "Run only one half: raw or lock")->check(CLI::IsMember({"raw", "lock"}));
  sub->add_option("--rounds", args->rounds,
                  "Alternating raw_pair/lock rounds; the ratio is the median of the rounds' ratios")
      ->capture_default_str()
      ->check(CLI::Range(1, 99));
  sub->add_flag("--no-fleet", args->no_fleet, "Do not publish the fleet numbers while measuring (to see their cost)");
  sub->add_flag("--embedded", args->embedded, "Start a private redis-server instead of using --redis");
  sub->add_flag("--contention", args->contention,
                "Instead: W workers (own connection each) loop acquire -> hold -> release on ONE key; "
                "report critical sections/s, shares, handoff latency, waits");
  sub->add_option("--hold", args->hold, "--contention: time inside the critical section")->capture_default_str();
  sub->add_flag("--fair", args->fair, "--contention: fair (FIFO) locks, a releaser cannot barge ahead of a waiter");
  sub->add_option("--resource", args->resource, "--contention: the contended resource")->capture_default_str();
  sub->add_option("--jobs", args->jobs,
                  "Instead: M guarded no-op jobs through the stream worker at each --concurrency, beside bare "
                  "XREADGROUP + XACK");
  sub->add_flag("--unique", args->unique,
                "--jobs: guarded jobs enqueued unique (until-executed on the id), their unique locks released at the ack");
  sub->add_option("--rate", args->rate,
                  "--jobs: the rate limiter instead: M jobs unlimited, under 1000000/s and under 1000000/s per key "
                  "(16 keys) at each --concurrency; then, at the last, a backlog under [FIELD=]N/PERIOD for the "
                  "whole periods in --seconds (default 10): starts/s and the most in one period");
  sub->add_option("--concurrency", args->concurrency, "--jobs: jobs in flight, one run per value")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--permits", args->permits,
                  "Instead: W workers (coroutines, one connection) loop acquire -> release of one permit of ONE "
                  "semaphore of N permits; report acquire+release/s, p50, p99")
      ->check(CLI::Range(1, LockOptions::kMaxPermits));
  sub->add_flag("--shared", args->shared,
                "Instead: W workers (coroutines, one connection) loop acquire -> release of a reader of ONE "
                "read-write lock, against acquire -> release of a mutex each, in --rounds alternating rounds; "
                "report pairs/s, p50, p99 and the ratio");
  sub->add_option("--leases", args->leases,
                  "Instead: N live leases (TTL 30 s) held for --seconds (default 60); renewals/s, CPU, lost");
  out.emplace_back(sub, [&g, args, workers, secs] {
    args->workers_given = workers->count() > 0;
    args->seconds_given = secs->count() > 0;
    return run_bench(g, *args);
  });
}

}  // namespace jobguard::cli
