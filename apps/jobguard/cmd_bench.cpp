// `jobguard bench`: throughput and latency of the library, next to the same
// commands sent raw over the same connections in the same run. Ratios, not
// absolute numbers, are what we compare: these machines are shared and noisy.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench_ops.hpp"
#include "cli.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/embedded_redis.hpp"
#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"

namespace asio = boost::asio;
using namespace std::chrono;

namespace jobguard::cli {
namespace {

struct BenchArgs {
  int workers = 64;
  double seconds = 3;
  std::string mode = "coro";
  int connections = 1;
  bool embedded = false;
  std::string only;  // "raw" or "lock"; empty = both
};

nlohmann::json summarize(const bench::Phase& p) {
  auto lat = p.latencies_us;
  std::sort(lat.begin(), lat.end());
  auto q = [&](double f) -> double {
    if (lat.empty()) return 0;
    return lat[std::min(lat.size() - 1, static_cast<std::size_t>(f * static_cast<double>(lat.size())))];
  };
  return {{"ops", p.ops},
          {"errors", p.errors},
          {"seconds", p.elapsed_s},
          {"ops_per_s", p.elapsed_s > 0 ? static_cast<double>(p.ops) / p.elapsed_s : 0.0},
          {"p50_us", q(0.50)},
          {"p99_us", q(0.99)},
          {"writes", p.writes},
          {"commands_per_write", p.writes ? static_cast<double>(p.commands) / static_cast<double>(p.writes) : 0.0}};
}

int run_bench(const Globals& g, const BenchArgs& a) {
  if (a.workers < 1 || a.workers > 100000) throw Error(errc::invalid_argument, "--workers must be 1..100000");
  if (a.seconds <= 0 || a.seconds > 3600) throw Error(errc::invalid_argument, "--seconds must be in (0, 3600]");
  std::unique_ptr<EmbeddedRedis> server;
  redis::ConnectionOptions opts;
  if (a.embedded) {
    server = std::make_unique<EmbeddedRedis>();
    server->start();
    opts.host = server->host();
    opts.port = server->port();
  } else {
    opts = redis::parse_url(g.redis_url);
  }
  opts.connections = a.connections;
  opts.command_timeout = seconds(5);

  bench::Config cfg{a.workers, duration<double>(a.seconds), a.mode == "threads"};
  bench::Runner runner(opts, cfg);
  if (!runner.connected())
    throw Error(errc::redis_unavailable, fmt::format("cannot connect to {}", redis::to_display_url(opts)));

  nlohmann::json out{{"workers", a.workers}, {"seconds", a.seconds}, {"mode", a.mode},
                     {"connections", a.connections}, {"redis", redis::to_display_url(opts)}};
  const bool want_raw = a.only.empty() || a.only == "raw";
  const bool want_lock = a.only.empty() || a.only == "lock";
  if (want_raw) {
    out["raw"] = summarize(runner.run(bench::Op::raw_set));
  }
  if (want_lock && bench::lock_ops_available()) {
    out["raw_pair"] = summarize(runner.run(bench::Op::raw_pair));
    out["lock"] = summarize(runner.run(bench::Op::lock_pair));
    const double raw = out["raw_pair"]["ops_per_s"].get<double>();
    out["ratio"] = raw > 0 ? out["lock"]["ops_per_s"].get<double>() / raw : 0.0;
  }
  if (g.json) {
    std::cout << out.dump() << "\n";
  } else {
    std::cout << fmt::format("jobguard bench: {} workers ({}), {} connection(s), {:.1f} s per phase, {}\n",
                             a.workers, a.mode, a.connections, a.seconds, redis::to_display_url(opts));
    auto line = [&](const char* name, const char* what, const nlohmann::json& j) {
      std::cout << fmt::format("  {:<9} {:<28} {:>10.0f} ops/s   p50 {:>7.0f} us   p99 {:>7.0f} us   {:>5.1f} cmds/write{}\n",
                               name, what, j["ops_per_s"].get<double>(), j["p50_us"].get<double>(),
                               j["p99_us"].get<double>(), j["commands_per_write"].get<double>(),
                               j["errors"].get<std::uint64_t>() ? fmt::format("   {} errors", j["errors"].get<std::uint64_t>()) : "");
    };
    if (out.contains("raw")) line("raw", "SET NX PX", out["raw"]);
    if (out.contains("raw_pair")) line("raw_pair", "SET NX PX + release script", out["raw_pair"]);
    if (out.contains("lock")) line("lock", "Lock acquire + release", out["lock"]);
    if (out.contains("ratio")) std::cout << fmt::format("  ratio lock/raw_pair = {:.3f}\n", out["ratio"].get<double>());
  }
  return exit_code::ok;
}

void add(CLI::App& root, Globals& g, std::vector<std::pair<CLI::App*, Action>>& out) {
  auto args = std::make_shared<BenchArgs>();
  auto* sub = root.add_subcommand("bench", "Measure acquire+release throughput against the raw commands");
  sub->add_option("--workers", args->workers, "Concurrent callers")->capture_default_str();
  sub->add_option("--seconds", args->seconds, "Seconds per phase")->capture_default_str();
  sub->add_option("--mode", args->mode, "coro: coroutines on the event loop; threads: blocking threads")
      ->check(CLI::IsMember({"coro", "threads"}))
      ->capture_default_str();
  sub->add_option("--connections", args->connections, "Multiplexed connections")->check(CLI::Range(1, 64))->capture_default_str();
  sub->add_option("--only", args->only, "Run only one half: raw or lock")->check(CLI::IsMember({"raw", "lock"}));
  sub->add_flag("--embedded", args->embedded, "Start a private redis-server instead of using --redis");
  out.emplace_back(sub, [&g, args] { return run_bench(g, *args); });
}

JOBGUARD_COMMAND(add);

}  // namespace
}  // namespace jobguard::cli
