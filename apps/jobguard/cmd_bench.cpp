// `jobguard bench`: throughput and latency of the library, next to the same
// commands sent raw over the same connections in the same run. Ratios, not
// absolute numbers, are what we compare: these machines are shared and noisy.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <functional>
#include <future>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench_ops.hpp"
#include "bench_rate.hpp"
#include "cli.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/testing/embedded_redis.hpp"
#include "jobguard/async.hpp"
#include "jobguard/lock.hpp"
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

// What one phase of --shared measured: acquire+release pairs by W workers.
struct PairStats {
  std::uint64_t ops = 0, errors = 0;
  double p50_us = 0, p99_us = 0;
  std::string first_error;
};

// W coroutine workers on `client`'s loop, each looping acquire -> release
// with `lo` on resource_of(w) for `secs` seconds.
PairStats measure_pairs(redis::Client& client, LockService& svc, int workers, double secs, const LockOptions& lo,
                        const std::function<std::string(int)>& resource_of) {
  const auto stop_at = steady_clock::now() + duration_cast<steady_clock::duration>(duration<double>(secs));
  std::vector<std::vector<float>> lat(static_cast<std::size_t>(workers));
  PairStats st;
  std::atomic<std::uint64_t> errors{0};
  std::atomic<int> running{workers};
  std::promise<void> all_done;
  std::mutex err_mu;
  for (int w = 0; w < workers; ++w) {
    asio::co_spawn(
        client.get_executor(),
        [&, w, resource = resource_of(w)]() -> asio::awaitable<void> {
          auto& mine = lat[static_cast<std::size_t>(w)];
          mine.reserve(1 << 16);
          while (steady_clock::now() < stop_at) {
            const auto t0 = steady_clock::now();
            bool ok = false;
            try {
              if (auto l = co_await async_acquire(svc, resource, lo, asio::use_awaitable))
                ok = co_await async_release(*l, asio::use_awaitable);
            } catch (const std::exception& e) {
              std::lock_guard lk(err_mu);
              if (st.first_error.empty()) st.first_error = e.what();
            }
            if (!ok) ++errors;
            else mine.push_back(std::chrono::duration<float, std::micro>(steady_clock::now() - t0).count());
          }
          if (--running == 0) all_done.set_value();
        },
        asio::detached);
  }
  all_done.get_future().wait();
  std::vector<float> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  const auto pct = [&](double p) {
    const auto i = static_cast<std::size_t>(p / 100 * static_cast<double>(all.size()));
    return all.empty() ? 0.0 : static_cast<double>(all[std::min(all.size() - 1, i)]);
  };
  st.ops = all.size();
  st.errors = errors.load();
  st.p50_us = pct(50);
  st.p99_us = pct(99);
  return st;
}

// --shared: read pairs (acquire+release of a reader) of ONE read-write lock
// by W workers, against mutex pairs by the same W workers on a mutex each
// (uncontended, so both measure the pair's own cost), in alternating rounds
// on one connection; the ratio is the median of the rounds' ratios.
int run_shared(const Globals& g, const BenchArgs& a, const redis::ConnectionOptions& opts) {
  redis::Client client(opts);
  auto svc = LockService::create(client);
  const std::string resource = a.resource == "bench:contention" ? "bench:rwlock" : a.resource;
  KeyBuilder::validate_resource(resource);
  LockOptions mutex;
  mutex.ttl = seconds(30);
  mutex.lock_class = "bench-mutex";
  LockOptions read = mutex;
  read.mode = LockMode::shared;
  read.wait = seconds(10);
  read.lock_class = "bench-shared";
  const double secs = a.seconds / a.rounds;
  nlohmann::json rounds = nlohmann::json::array();
  std::vector<double> ratios;
  PairStats rtot, mtot;
  std::string first_error;
  for (int r = 0; r < a.rounds; ++r) {
    const auto rs = measure_pairs(client, *svc, a.workers, secs, read, [&](int) { return resource; });
    const auto ms = measure_pairs(client, *svc, a.workers, secs, mutex,
                                  [&](int w) { return fmt::format("{}:mutex:{}", resource, w); });
    for (const auto* s : {&rs, &ms})
      if (first_error.empty()) first_error = s->first_error;
    rtot.ops += rs.ops;
    rtot.errors += rs.errors;
    mtot.ops += ms.ops;
    mtot.errors += ms.errors;
    const double ratio = ms.ops ? static_cast<double>(rs.ops) / static_cast<double>(ms.ops) : 0.0;
    ratios.push_back(ratio);
    rounds.push_back({{"read_pairs_per_s", static_cast<double>(rs.ops) / secs},
                      {"read_p50_us", rs.p50_us},
                      {"read_p99_us", rs.p99_us},
                      {"mutex_pairs_per_s", static_cast<double>(ms.ops) / secs},
                      {"mutex_p50_us", ms.p50_us},
                      {"mutex_p99_us", ms.p99_us},
                      {"ratio", ratio}});
  }
  std::sort(ratios.begin(), ratios.end());
  const double median = ratios[ratios.size() / 2];
  const double total = secs * a.rounds;
  nlohmann::json j{{"redis", redis::to_display_url(opts)},
                   {"shared", {{"workers", a.workers}, {"seconds", a.seconds}, {"rounds", rounds},
                               {"read_pairs_per_s", static_cast<double>(rtot.ops) / total},
                               {"mutex_pairs_per_s", static_cast<double>(mtot.ops) / total},
                               {"ratio", median}, {"errors", rtot.errors + mtot.errors}}}};
  if (!first_error.empty()) std::cerr << "jobguard bench: first error: " << first_error << "\n";
  if (g.json) {
    std::cout << j.dump() << "\n";
  } else {
    const auto& s = j["shared"];
    std::cout << fmt::format("jobguard bench --shared: {} workers, {:.1f} s, {}: read pairs {:.0f}/s, mutex pairs "
                             "{:.0f}/s, ratio {:.2f} (median of {} rounds)   errors {}\n",
                             a.workers, a.seconds, redis::to_display_url(opts), s["read_pairs_per_s"].get<double>(),
                             s["mutex_pairs_per_s"].get<double>(), median, a.rounds, rtot.errors + mtot.errors);
  }
  return exit_code::ok;
}

// --permits N: W coroutine workers on one connection loop acquire -> release
// of one permit of ONE semaphore of N permits (wait 10 s, TTL 30 s). With
// W <= N every acquire is granted at once; with W > N they wait in line.
int run_permits(const Globals& g, const BenchArgs& a, const redis::ConnectionOptions& opts) {
  redis::Client client(opts);
  auto svc = LockService::create(client);
  const std::string resource = a.resource == "bench:contention" ? "bench:semaphore" : a.resource;
  KeyBuilder::validate_resource(resource);
  const auto stop_at = steady_clock::now() + duration_cast<steady_clock::duration>(duration<double>(a.seconds));
  std::vector<std::vector<float>> lat(static_cast<std::size_t>(a.workers));
  std::atomic<std::uint64_t> errors{0};
  std::atomic<int> running{a.workers};
  std::promise<void> all_done;
  std::mutex err_mu;
  std::string first_error;
  for (int w = 0; w < a.workers; ++w) {
    asio::co_spawn(
        client.get_executor(),
        [&, w]() -> asio::awaitable<void> {
          LockOptions lo;
          lo.permits = a.permits;
          lo.ttl = seconds(30);
          lo.wait = seconds(10);
          lo.lock_class = "bench-permits";
          auto& mine = lat[static_cast<std::size_t>(w)];
          mine.reserve(1 << 16);
          while (steady_clock::now() < stop_at) {
            const auto t0 = steady_clock::now();
            bool ok = false;
            try {
              auto permit = co_await async_acquire(*svc, resource, lo, asio::use_awaitable);
              if (permit) ok = co_await async_release(*permit, asio::use_awaitable);
            } catch (const std::exception& e) {
              std::lock_guard lk(err_mu);
              if (first_error.empty()) first_error = e.what();
            }
            if (!ok) ++errors;
            else mine.push_back(std::chrono::duration<float, std::micro>(steady_clock::now() - t0).count());
          }
          if (--running == 0) all_done.set_value();
        },
        asio::detached);
  }
  all_done.get_future().wait();
  std::vector<float> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) {
    return all.empty() ? 0.0 : static_cast<double>(all[std::min(all.size() - 1, static_cast<std::size_t>(p / 100 * static_cast<double>(all.size())))]);
  };
  nlohmann::json j{{"redis", redis::to_display_url(opts)},
                   {"permits", {{"permits", a.permits}, {"workers", a.workers}, {"seconds", a.seconds},
                                {"ops", all.size()}, {"ops_per_s", static_cast<double>(all.size()) / a.seconds},
                                {"p50_us", pct(50)}, {"p99_us", pct(99)}, {"errors", errors.load()}}}};
  if (!first_error.empty()) std::cerr << "jobguard bench: first error: " << first_error << "\n";
  if (g.json) {
    std::cout << j.dump() << "\n";
  } else {
    const auto& p = j["permits"];
    std::cout << fmt::format("jobguard bench --permits {}: {} workers, {:.1f} s, {}: {:.0f} acquire+release/s   p50 {:.0f} us"
                             "   p99 {:.0f} us   errors {}\n",
                             a.permits, a.workers, a.seconds, redis::to_display_url(opts), p["ops_per_s"].get<double>(),
                             p["p50_us"].get<double>(), p["p99_us"].get<double>(), errors.load());
  }
  return exit_code::ok;
}

int run_contention(const Globals& g, const BenchArgs& a, const redis::ConnectionOptions& opts) {
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
  const auto r = bench::run_contention(opts, cfg);
  const auto j = bench::summarize(cfg, r);
  if (r.overlaps) std::cerr << fmt::format("jobguard bench: {} overlapping critical sections: the lock failed\n", r.overlaps);
  if (!r.first_error.empty()) std::cerr << "jobguard bench: first error: " << r.first_error << "\n";
  if (g.json) {
    std::cout << nlohmann::json{{"redis", redis::to_display_url(opts)}, {"contention", j}}.dump() << "\n";
    return exit_code::ok;
  }
  std::cout << bench::contention_text(cfg, j, redis::to_display_url(opts));
  return exit_code::ok;
}

int run_jobs_or_leases(const Globals& g, const BenchArgs& a, const redis::ConnectionOptions& opts) {
  nlohmann::json j;
  std::string text;
  if (a.jobs > 0) {
    j = bench::run_jobs(opts, {.jobs = a.jobs, .concurrency = a.concurrency, .unique = a.unique});
    for (const auto& [name, runs] : {std::pair{"guarded", j["runs"]}, std::pair{"bare", j["bare_runs"]}})
      for (const auto& r : runs)
        text += fmt::format("  {:<8} concurrency {:>4}: {:>9.0f} jobs/s   enqueue->ack p50 {:>8.1f} ms p99 {:>8.1f} ms\n",
                            name, r["concurrency"].get<int>(), r["jobs_per_s"].get<double>(),
                            r["enqueue_to_ack_p50_ms"].get<double>(), r["enqueue_to_ack_p99_ms"].get<double>());
    text = fmt::format("jobguard bench --jobs {}: guarded = StreamWorker, moderate class (lock + idempotency key + "
                       "completion record{}), no-op effect; bare = XREADGROUP + XACK\n{}  guarded/bare = {:.3f}\n",
                       a.jobs, a.unique ? "; enqueued unique, until-executed" : "", text,
                       j["guarded_over_bare"].get<double>());
  } else {
    const auto hold = duration_cast<milliseconds>(duration<double>(a.seconds_given ? a.seconds : 60.0));
    j = bench::run_leases(opts, {.leases = a.leases, .hold = hold});
    text = fmt::format("jobguard bench --leases {}: TTL {} ms, held {:.1f} s: {:.0f} renewals/s, client CPU {:.2f}% of a "
                       "core, server CPU {:.2f}%, lost {}\n",
                       a.leases, j["ttl_ms"].get<std::int64_t>(), j["seconds"].get<double>(),
                       j["renewals_per_s"].get<double>(), j["client_cpu_pct"].get<double>(),
                       j["server_cpu_pct"].get<double>(), j["lost"].get<std::uint64_t>());
  }
  j["redis"] = redis::to_display_url(opts);
  std::cout << (g.json ? j.dump() + "\n" : text);
  return exit_code::ok;
}

job::RateLimit parse_bench_rate(const std::string& text) {
  try {
    return job::parse_rate(text);
  } catch (const Error& e) {
    throw Error(errc::invalid_argument, fmt::format("--rate: {}", e.detail()));
  }
}

// --rate's usage errors, before anything connects.
void check_rate(const BenchArgs& a) {
  if (a.rate.empty()) return;
  if (a.jobs <= 0 || a.unique) throw Error(errc::invalid_argument, "--rate goes with --jobs M, without --unique");
  parse_bench_rate(a.rate);
}

int run_rate(const Globals& g, const BenchArgs& a, const redis::ConnectionOptions& opts) {
  auto j = bench::run_rate(opts, {.jobs = a.jobs, .concurrency = a.concurrency, .limit = parse_bench_rate(a.rate),
                                  .window_s = a.seconds_given ? a.seconds : 10.0});
  j["rate"] = a.rate;
  j["redis"] = redis::to_display_url(opts);
  std::cout << (g.json ? j.dump() + "\n" : bench::rate_text(j));
  return exit_code::ok;
}

// A server in the lost-lock-state quarantine refuses every grant for up to
// max_ttl: a benchmark would measure refusals (or, --jobs, crawl). One try
// first, and the quarantine's own one-line message (which names `server
// trust` for a server just provisioned) as the error, exit 69.
void refuse_quarantined(const redis::ConnectionOptions& opts) {
  redis::Client client(opts);
  auto locks = LockService::create(client);
  try {
    if (auto l = locks->acquire("bench:preflight", LockOptions{.ttl = seconds(5)})) l->release();
  } catch (const Error& e) {
    if (std::string_view(e.what()).find("server lost lock state") != std::string_view::npos) throw;
    // Anything else is the benchmark's to report, as it always has.
  }
}

int run_bench(const Globals& g, const BenchArgs& a) {
  if (a.workers < 1 || a.workers > 100000) throw Error(errc::invalid_argument, "--workers must be 1..100000");
  if ((a.jobs > 0) + (a.leases > 0) + a.contention + (a.permits != 0) + a.shared > 1)
    throw Error(errc::invalid_argument,
                "--jobs, --leases, --permits, --shared and --contention are separate benchmarks: pick one");
  if (a.shared && (a.only.size() || a.mode != "coro" || a.connections != 1 || a.fair || a.hold != "1ms"))
    throw Error(errc::invalid_argument, "--shared takes none of --only, --mode, --connections, --fair, --hold");
  if (a.permits < 0 || a.permits > LockOptions::kMaxPermits)
    throw Error(errc::invalid_argument, fmt::format("--permits {}: must be 1..{}", a.permits, LockOptions::kMaxPermits));
  if (a.permits > 0 && (a.only.size() || a.mode != "coro" || a.connections != 1 || a.fair || a.hold != "1ms"))
    throw Error(errc::invalid_argument, "--permits takes none of --only, --mode, --connections, --fair, --hold");
  if (a.jobs < 0 || a.jobs > 10000000) throw Error(errc::invalid_argument, "--jobs must be 1..10000000");
  if (a.unique && a.jobs == 0) throw Error(errc::invalid_argument, "--unique goes with --jobs M");
  if (a.leases < 0 || a.leases > 10000000) throw Error(errc::invalid_argument, "--leases must be 1..10000000");
  for (int c : a.concurrency)
    if (c < 1 || c > 4096) throw Error(errc::invalid_argument, fmt::format("--concurrency {}: must be 1..4096", c));
  if (a.contention && (a.only.size() || a.mode != "coro" || a.connections != 1))
    throw Error(errc::invalid_argument, "--contention takes none of --only, --mode, --connections");
  if (!a.contention && (a.fair || a.hold != "1ms" || (a.resource != "bench:contention" && a.permits == 0 && !a.shared)))
    throw Error(errc::invalid_argument,
                "--fair and --hold need --contention; --resource needs --contention, --permits or --shared");
  if (a.seconds <= 0 || a.seconds > 3600) throw Error(errc::invalid_argument, "--seconds must be in (0, 3600]");
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
    refuse_quarantined(opts);
  }
  opts.connections = a.connections;
  opts.command_timeout = seconds(5);
  if (a.contention) return run_contention(g, a, opts);
  if (a.permits > 0) return run_permits(g, a, opts);
  if (a.shared) return run_shared(g, a, opts);
  if (!a.rate.empty()) return run_rate(g, a, opts);
  if (a.jobs > 0 || a.leases > 0) return run_jobs_or_leases(g, a, opts);

  bench::Config cfg{a.workers, duration<double>(a.seconds), a.mode == "threads", !a.no_fleet};
  bench::Runner runner(opts, cfg);
  if (!runner.connected())
    throw Error(errc::redis_unavailable, fmt::format("cannot connect to {}", redis::to_display_url(opts)));

  nlohmann::json out{{"workers", a.workers}, {"seconds", a.seconds}, {"mode", a.mode},
                     {"connections", a.connections}, {"redis", redis::to_display_url(opts)}};
  const bool want_raw = a.only.empty() || a.only == "raw";
  const bool want_lock = a.only.empty() || a.only == "lock";
  if (want_lock && bench::lock_ops_available()) {
    // The two halves alternate, `rounds` times, the order flipping each
    // round: a shared machine drifts (another job starts, the CPU clock
    // changes) and one phase of each would charge the drift to whichever ran
    // second. The ratio is the median of the per-round ratios (each pair ran
    // back to back); raw_pair and lock are the median rounds of each.
    std::vector<nlohmann::json> pairs, locks, per_round;
    std::vector<double> ratios;
    // The servers' own CPU seconds per phase (INFO cpu, on every primary of a
    // cluster): ops per server CPU-second compare a cluster with one server
    // per core used, whatever shares a core on the machine.
    redis::Client meter(opts);
    const auto nodes = meter.primaries();
    out["server_nodes"] = nodes.size();
    auto phase = [&](bench::Op op) {
      const double c0 = bench::server_cpu_seconds(meter, nodes);
      auto j = bench::summarize(runner.run(op));
      const double cpu = bench::server_cpu_seconds(meter, nodes) - c0;
      j["server_cpu_s"] = cpu;
      j["ops_per_server_cpu_s"] = cpu > 0 ? j["ops"].get<double>() / cpu : 0.0;
      return j;
    };
    for (int i = 0; i < a.rounds; ++i) {
      nlohmann::json rp, lk;
      if (i % 2 == 0) {
        rp = phase(bench::Op::raw_pair);
        lk = phase(bench::Op::lock_pair);
      } else {
        lk = phase(bench::Op::lock_pair);
        rp = phase(bench::Op::raw_pair);
      }
      const double raw = rp["ops_per_s"].get<double>();
      const double ratio = raw > 0 ? lk["ops_per_s"].get<double>() / raw : 0.0;
      per_round.push_back({{"raw_pair_ops_per_s", rp["ops_per_s"]},
                           {"lock_ops_per_s", lk["ops_per_s"]},
                           {"ratio", ratio},
                           {"lock_ops_per_server_cpu_s", lk["ops_per_server_cpu_s"]}});
      ratios.push_back(ratio);
      pairs.push_back(std::move(rp));
      locks.push_back(std::move(lk));
    }
    auto median_of = [](std::vector<nlohmann::json> v) {
      std::sort(v.begin(), v.end(), [](const nlohmann::json& x, const nlohmann::json& y) {
        return x["ops_per_s"].get<double>() < y["ops_per_s"].get<double>();
      });
      return v[v.size() / 2];
    };
    std::sort(ratios.begin(), ratios.end());
    out["raw_pair"] = median_of(pairs);
    out["lock"] = median_of(locks);
    out["ratio"] = ratios[ratios.size() / 2];
    std::vector<double> per_cpu;
    for (const auto& lk : locks) per_cpu.push_back(lk["ops_per_server_cpu_s"].get<double>());
    std::sort(per_cpu.begin(), per_cpu.end());
    out["lock_ops_per_server_cpu_s"] = per_cpu[per_cpu.size() / 2];
    out["rounds"] = per_round;
  }
  // Last: its keys are left to expire (the SET is the lock's own, PX 30 s),
  // and hundreds of thousands expiring at once mid-way through the rounds
  // made the server's expiry cycle eat whichever phase ran 30 s later.
  if (want_raw) {
    out["raw"] = bench::summarize(runner.run(bench::Op::raw_set));
  }
  if (g.json) {
    std::cout << out.dump() << "\n";
  } else {
    std::cout << fmt::format("jobguard bench: {} workers ({}), {} connection(s), {:.1f} s per phase, {} round(s), {}\n",
                             a.workers, a.mode, a.connections, a.seconds, a.rounds, redis::to_display_url(opts));
    auto line = [&](const char* name, const char* what, const nlohmann::json& j) {
      std::cout << fmt::format("  {:<9} {:<28} {:>10.0f} ops/s   p50 {:>7.0f} us   p99 {:>7.0f} us   {:>5.1f} cmds/write{}\n",
                               name, what, j["ops_per_s"].get<double>(), j["p50_us"].get<double>(),
                               j["p99_us"].get<double>(), j["commands_per_write"].get<double>(),
                               j["errors"].get<std::uint64_t>() ? fmt::format("   {} errors", j["errors"].get<std::uint64_t>()) : "");
    };
    if (out.contains("raw")) line("raw", "SET NX PX", out["raw"]);
    if (out.contains("raw_pair")) line("raw_pair", "SET NX PX + release script", out["raw_pair"]);
    if (out.contains("lock")) line("lock", "Lock acquire + release", out["lock"]);
    if (out.contains("ratio")) {
      std::string each;
      for (const auto& r : out["rounds"]) each += fmt::format(" {:.3f}", r["ratio"].get<double>());
      std::cout << fmt::format("  ratio lock/raw_pair = {:.3f} (median of the rounds:{})\n", out["ratio"].get<double>(),
                               each);
      std::cout << fmt::format("  lock: {:.0f} ops per server CPU-second ({} server node(s); median of the rounds)\n",
                               out["lock_ops_per_server_cpu_s"].get<double>(), out["server_nodes"].get<std::size_t>());
    }
  }
  return exit_code::ok;
}

void add(CLI::App& root, Globals& g, std::vector<std::pair<CLI::App*, Action>>& out) {
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
    check_rate(*args);
    return run_bench(g, *args);
  });
}

}  // namespace

void add_bench(CLI::App& root, Globals& g, Commands& out) { add(root, g, out); }
}  // namespace jobguard::cli
