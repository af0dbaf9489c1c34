// `jobguard bench` without a mode flag: the lock's acquire+release pair
// against the same commands sent raw, in alternating rounds on one Runner.
#include <fmt/format.h>

#include <algorithm>

#include "harness.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"

namespace jobguard::bench {
namespace {

nlohmann::json median_of(std::vector<nlohmann::json> v) {
  std::sort(v.begin(), v.end(), [](const nlohmann::json& x, const nlohmann::json& y) {
    return x["ops_per_s"].get<double>() < y["ops_per_s"].get<double>();
  });
  return v[v.size() / 2];
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The raw_pair and lock halves alternate, `rounds` times, the order flipping
// each round: a shared machine drifts (another job starts, the CPU clock
// changes) and one phase of each would charge the drift to whichever ran
// second. The ratio is the median of the per-round ratios (each pair ran
// back to back); raw_pair and lock are the median rounds of each.
void lock_rounds(Runner& runner, const redis::ConnectionOptions& opts, int rounds, nlohmann::json& out) {
  std::vector<nlohmann::json> pairs, locks, per_round;
  std::vector<double> ratios, per_cpu;
  // The servers' own CPU seconds per phase (INFO cpu, on every primary of a
  // cluster): ops per server CPU-second compare a cluster with one server
  // per core used, whatever shares a core on the machine.
  redis::Client meter(opts);
  const auto nodes = meter.primaries();
  out["server_nodes"] = nodes.size();
  auto phase = [&](Op op) {
    const double c0 = server_cpu_seconds(meter, nodes);
    auto j = summarize(runner.run(op));
    const double cpu = server_cpu_seconds(meter, nodes) - c0;
    j["server_cpu_s"] = cpu;
    j["ops_per_server_cpu_s"] = cpu > 0 ? j["ops"].get<double>() / cpu : 0.0;
    return j;
  };
  for (int i = 0; i < rounds; ++i) {
    nlohmann::json rp, lk;
    if (i % 2 == 0) {
      rp = phase(Op::raw_pair);
      lk = phase(Op::lock_pair);
    } else {
      lk = phase(Op::lock_pair);
      rp = phase(Op::raw_pair);
    }
    const double raw = rp["ops_per_s"].get<double>();
    const double ratio = raw > 0 ? lk["ops_per_s"].get<double>() / raw : 0.0;
    per_round.push_back({{"raw_pair_ops_per_s", rp["ops_per_s"]},
                         {"lock_ops_per_s", lk["ops_per_s"]},
                         {"ratio", ratio},
                         {"lock_ops_per_server_cpu_s", lk["ops_per_server_cpu_s"]}});
    ratios.push_back(ratio);
    per_cpu.push_back(lk["ops_per_server_cpu_s"].get<double>());
    pairs.push_back(std::move(rp));
    locks.push_back(std::move(lk));
  }
  out["raw_pair"] = median_of(pairs);
  out["lock"] = median_of(locks);
  out["ratio"] = median_of(ratios);
  out["lock_ops_per_server_cpu_s"] = median_of(per_cpu);
  out["rounds"] = per_round;
}

std::string throughput_text(const ThroughputConfig& cfg, const nlohmann::json& out, const std::string& where) {
  std::string text = fmt::format("jobguard bench: {} workers ({}), {} connection(s), {:.1f} s per phase, {} round(s), {}\n",
                                 cfg.workers, cfg.mode, cfg.connections, cfg.seconds, cfg.rounds, where);
  auto line = [&](const char* name, const char* what, const nlohmann::json& j) {
    const auto errors = j["errors"].get<std::uint64_t>();
    text += fmt::format("  {:<9} {:<28} {:>10.0f} ops/s   p50 {:>7.0f} us   p99 {:>7.0f} us   {:>5.1f} cmds/write{}\n",
                        name, what, j["ops_per_s"].get<double>(), j["p50_us"].get<double>(), j["p99_us"].get<double>(),
                        j["commands_per_write"].get<double>(), errors ? fmt::format("   {} errors", errors) : "");
  };
  if (out.contains("raw")) line("raw", "SET NX PX", out["raw"]);
  if (out.contains("raw_pair")) line("raw_pair", "SET NX PX + release script", out["raw_pair"]);
  if (out.contains("lock")) line("lock", "Lock acquire + release", out["lock"]);
  if (out.contains("ratio")) {
    std::string each;
    for (const auto& r : out["rounds"]) each += fmt::format(" {:.3f}", r["ratio"].get<double>());
    text += fmt::format("  ratio lock/raw_pair = {:.3f} (median of the rounds:{})\n", out["ratio"].get<double>(), each);
    text += fmt::format("  lock: {:.0f} ops per server CPU-second ({} server node(s); median of the rounds)\n",
                        out["lock_ops_per_server_cpu_s"].get<double>(), out["server_nodes"].get<std::size_t>());
  }
  return text;
}

}  // namespace

Report throughput(const redis::ConnectionOptions& opts, const ThroughputConfig& cfg) {
  Runner runner(opts, Config{cfg.workers, std::chrono::duration<double>(cfg.seconds), cfg.mode == "threads", cfg.fleet});
  const auto where = redis::to_display_url(opts);
  if (!runner.connected()) throw Error(errc::redis_unavailable, fmt::format("cannot connect to {}", where));
  nlohmann::json out{{"workers", cfg.workers}, {"seconds", cfg.seconds}, {"mode", cfg.mode},
                     {"connections", cfg.connections}, {"redis", where}};
  if (cfg.only.empty() || cfg.only == "lock") lock_rounds(runner, opts, cfg.rounds, out);
  // Last: its keys are left to expire (the SET is the lock's own, PX 30 s),
  // and hundreds of thousands expiring at once mid-way through the rounds
  // made the server's expiry cycle eat whichever phase ran 30 s later.
  if (cfg.only.empty() || cfg.only == "raw") out["raw"] = summarize(runner.run(Op::raw_set));
  Report rep;
  rep.text = throughput_text(cfg, out, where);
  rep.json = std::move(out);
  return rep;
}

void refuse_quarantined(const redis::ConnectionOptions& opts) {
  redis::Client client(opts);
  auto locks = LockService::create(client);
  try {
    if (auto l = locks->acquire("bench:preflight", LockOptions{.ttl = std::chrono::seconds(5)})) l->release();
  } catch (const Error& e) {
    // The quarantine's own one-line message names `server trust` for a
    // server just provisioned; anything else is the benchmark's to report.
    if (std::string_view(e.what()).find("server lost lock state") != std::string_view::npos) throw;
  }
}

}  // namespace jobguard::bench
