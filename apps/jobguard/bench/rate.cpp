// `jobguard bench --jobs M --rate N/PERIOD` (rate.hpp): the stream
// worker's rate limits (job/limits.hpp), their cost and their pace.
#include "rate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <boost/asio/awaitable.hpp>
#include <cmath>
#include <ctime>
#include <functional>
#include <future>
#include <mutex>

#include "harness.hpp"
#include "jobguard/error.hpp"
#include "jobguard/guard/completion.hpp"
#include "jobguard/guard/idempotency.hpp"
#include "jobguard/job/runner.hpp"
#include "jobguard/job/stream_source.hpp"
#include "jobguard/job/worker.hpp"
#include "jobguard/lease.hpp"

namespace asio = boost::asio;
using namespace std::chrono;

namespace jobguard::bench {
namespace {

std::int64_t now_us() { return duration_cast<microseconds>(steady_clock::now().time_since_epoch()).count(); }
// This process's CPU seconds, every thread (clock() reads the process CPU clock).
double cpu_s() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

using ValueOf = std::function<std::string(int)>;

// What every drain shares: one client, one lease scheduler, the stores a
// moderate class writes to (as `jobguard bench --jobs` sets them up).
struct Bench {
  Bench(redis::Client& c, std::string t)
      : client(c),
        tag(std::move(t)),
        leases(LeaseScheduler::create(LockService::create(c, KeyBuilder("bench:" + tag)))),
        done(c, {.prefix = "bench:" + tag + ":done:", .retention = minutes(10)}),
        idem(c, {.retention = minutes(10), .prefix = "bench:" + tag + ":idem:"}),
        nodes(c.primaries()) {}
  redis::Client& client;
  std::string tag;
  std::shared_ptr<LeaseScheduler> leases;
  guard::RedisCompletionStore done;
  guard::RedisIdempotencyStore idem;
  std::vector<std::string> nodes;  // every primary of a cluster: the server CPU is theirs
};

// One drain of a stream: its time, CPU and every effect's start.
struct Drain {
  int jobs = 0;
  double secs = 0, server_s = 0, client_s = 0;
  std::int64_t errors = 0;
  std::vector<std::int64_t> starts_us;  // this host's monotonic clock
  job::WorkerStats stats{};
};

asio::awaitable<std::string> nothing() { co_return std::string(); }

// `count` jobs on a fresh stream, pipelined 500 at a time: job i has id i
// and, when `field` is set, `field` = value_of(i).
void enqueue(redis::Client& c, const std::string& stream, int count, const std::string& field, const ValueOf& value_of) {
  c.exec(redis::Command{"XGROUP", "CREATE", stream, "bench", "0", "MKSTREAM"});
  for (int done = 0; done < count;) {
    std::vector<std::future<redis::Reply>> batch;
    for (int i = 0; i < 500 && done < count; ++i, ++done) {
      std::vector<std::string> cmd{"XADD", stream, "*", "id", std::to_string(done)};
      if (!field.empty()) cmd.insert(cmd.end(), {field, value_of(done)});
      batch.push_back(c.exec_future(redis::Command(cmd)));
    }
    for (auto& f : batch) f.get();
  }
}

// `jobs` guarded no-op jobs (moderate class: lock + idempotency key +
// completion record) through one StreamWorker under `rates`. Each phase
// has a class of its own, so a budget keyed by class starts fresh.
Drain drain(Bench& b, const std::string& phase, int concurrency, int jobs, std::vector<job::RateLimit> rates,
            const std::string& field = {}, const ValueOf& value_of = {}) {
  const job::LockClass cls{.name = fmt::format("bench-rate-{}-{}-{}", phase, concurrency, b.tag),
                           .key_pattern = "bench-rate:{id}",
                           .consequence = job::Consequence::moderate,
                           .ttl = seconds(30),
                           .owner = "jobguard bench",
                           .protects = "a no-op"};
  job::GuardedRunner runner(b.leases, cls, {.completions = &b.done, .idempotency = &b.idem});
  const job::StreamOptions so{.stream = fmt::format("bench:{}:rate:{}:{}", b.tag, phase, concurrency), .group = "bench"};
  enqueue(b.client, so.stream, jobs, field, value_of);
  Drain d;
  d.jobs = jobs;
  d.starts_us.reserve(static_cast<std::size_t>(jobs));
  std::mutex mu;
  job::AsyncJobEffect effect = [&d, &mu](job::WorkItem&) {
    {
      std::lock_guard lk(mu);
      d.starts_us.push_back(now_us());
    }
    return nothing();
  };
  job::WorkerOptions wo{.concurrency = concurrency, .max_jobs = jobs};
  wo.rates = std::move(rates);
  wo.on_job = [&d](const job::JobReport& r) {
    if (r.decision.action != job::Action::ack) ++d.errors;
  };
  job::StreamWorker worker(b.client, so, runner, effect, wo);
  const double s0 = server_cpu_seconds(b.client, b.nodes), c0 = cpu_s();
  const auto t0 = steady_clock::now();
  worker.run();
  d.secs = duration<double>(steady_clock::now() - t0).count();
  d.client_s = cpu_s() - c0;
  d.server_s = server_cpu_seconds(b.client, b.nodes) - s0;
  d.stats = worker.stats();
  b.client.exec(redis::Command{"DEL", so.stream});
  return d;
}

nlohmann::json figures(const Drain& d) {
  return {{"jobs", d.jobs},
          {"seconds", d.secs},
          {"jobs_per_s", d.jobs / d.secs},
          {"server_cpu_pct", 100 * d.server_s / d.secs},
          {"server_us_per_job", d.server_s * 1e6 / d.jobs},
          {"client_us_per_job", d.client_s * 1e6 / d.jobs},
          {"rate_limited", d.stats.rate_limited},
          {"rate_wait_ms", d.stats.rate_wait_ms},
          {"errors", d.errors}};
}

// The most of the sorted times `t` in any half-open window of `w`.
std::size_t most_within(const std::vector<std::int64_t>& t, std::int64_t w) {
  std::size_t most = 0;
  for (std::size_t i = 0, j = 0; i < t.size(); ++i) {
    while (t[i] - t[j] >= w) ++j;
    most = std::max(most, i - j + 1);
  }
  return most;
}

// How the starts kept to the limit: their rate from the first to the last
// (k whole periods), and the most in any one period and in any tenth of
// one (what a downstream that counts over a shorter window sees).
nlohmann::json pace(std::vector<std::int64_t> t, const job::RateLimit& lim) {
  std::sort(t.begin(), t.end());
  const auto per_us = duration_cast<microseconds>(lim.per).count();
  const double limit_per_s = static_cast<double>(lim.count) * 1e6 / static_cast<double>(per_us);
  const double span_s = t.size() > 1 ? static_cast<double>(t.back() - t.front()) / 1e6 : 0;
  const double achieved = span_s > 0 ? static_cast<double>(t.size() - 1) / span_s : 0;
  const auto peak = most_within(t, per_us), tenth = most_within(t, std::max<std::int64_t>(1, per_us / 10));
  return {{"limit_count", lim.count},
          {"limit_period_ms", lim.per.count()},
          {"limit_per_s", limit_per_s},
          {"starts", t.size()},
          {"span_s", span_s},
          {"achieved_per_s", achieved},
          {"achieved_over_limit", achieved / limit_per_s},
          {"peak_in_period", peak},
          {"peak_over_limit", static_cast<double>(peak) / static_cast<double>(lim.count)},
          {"peak_in_tenth_period", tenth},
          {"peak_tenth_over_limit", static_cast<double>(tenth) * 10 / static_cast<double>(lim.count)}};
}

double jobs_per_s(const Drain& d) { return d.jobs / d.secs; }

// Two drains of one kind as one (the starts are not kept).
void add(Drain& sum, const Drain& d) {
  sum.jobs += d.jobs;
  sum.secs += d.secs;
  sum.server_s += d.server_s;
  sum.client_s += d.client_s;
  sum.errors += d.errors;
  sum.stats.rate_limited += d.stats.rate_limited;
  sum.stats.rate_wait_ms += d.stats.rate_wait_ms;
}

}  // namespace

nlohmann::json run_rate(const redis::ConnectionOptions& opts, const RateConfig& cfg) {
  const auto per_ms = static_cast<double>(cfg.limit.per.count());
  const auto periods = std::max<std::int64_t>(1, std::llround(cfg.window_s * 1000 / per_ms));
  const std::int64_t pace_jobs = cfg.limit.count * periods + 1;
  if (pace_jobs > 10000000)
    throw Error(errc::invalid_argument,
                fmt::format("--rate: {} jobs over the window's {} periods: more than 10,000,000", pace_jobs, periods));
  redis::Client client(opts);
  if (!client.wait_connected(opts.connect_timeout))
    throw Error(errc::redis_unavailable, fmt::format("cannot connect to {}", redis::to_display_url(opts)));
  Bench b(client, std::to_string(now_us() % 1000000007));

  // Far above any rate this worker reaches: every start passes at once, so
  // the difference from the unlimited run is the limiter's own work.
  const job::RateLimit high{.count = 1000000, .per = seconds(1)};
  const job::RateLimit high_keyed{.field = "k", .count = 1000000, .per = seconds(1)};
  const ValueOf key_of = [&b](int i) { return fmt::format("{}-{}", b.tag, i % 16); };
  nlohmann::json overhead = nlohmann::json::array();
  for (int c : cfg.concurrency) {
    // Unlimited, one budget, a budget per key; then the other way round:
    // a drift of the host's load over the run weighs on each alike.
    std::array<Drain, 3> sum;
    int step = 0;
    for (int k : {0, 1, 2, 2, 1, 0}) {
      const auto phase = fmt::format("{}{}", std::array{"none", "one", "keyed"}[static_cast<std::size_t>(k)], step++);
      add(sum[static_cast<std::size_t>(k)], k == 0   ? drain(b, phase, c, cfg.jobs, {})
                                            : k == 1 ? drain(b, phase, c, cfg.jobs, {high})
                                                     : drain(b, phase, c, cfg.jobs, {high_keyed}, "k", key_of));
    }
    const auto& [none, one, keyed] = sum;
    overhead.push_back({{"concurrency", c},
                        {"unlimited", figures(none)},
                        {"limited", figures(one)},
                        {"limited_per_key", figures(keyed)},
                        {"limited_over_unlimited", jobs_per_s(one) / jobs_per_s(none)},
                        {"per_key_over_unlimited", jobs_per_s(keyed) / jobs_per_s(none)},
                        {"limited_server_us_over_unlimited", one.server_s / none.server_s},
                        {"per_key_server_us_over_unlimited", keyed.server_s / none.server_s}});
  }
  // Every job of the pace run carries the limit's field with one value: a
  // keyed limit and a class-wide one each make one budget here.
  const int c = cfg.concurrency.back();
  const std::string value = "pace-" + b.tag;
  const auto p = drain(b, "pace", c, static_cast<int>(pace_jobs), {cfg.limit}, cfg.limit.field,
                       [&value](int) { return value; });
  nlohmann::json accuracy = pace(p.starts_us, cfg.limit);
  accuracy["concurrency"] = c;
  accuracy["run"] = figures(p);
  return {{"jobs", cfg.jobs}, {"overhead", overhead}, {"accuracy", accuracy}};
}

std::string rate_text(const nlohmann::json& j) {
  std::string out = fmt::format(
      "jobguard bench --jobs {} --rate: guarded StreamWorker (moderate class), no-op effect\n", j["jobs"].get<int>());
  for (const auto& o : j["overhead"]) {
    const auto jps = [&](const char* k) { return o[k]["jobs_per_s"].get<double>(); };
    out += fmt::format("  concurrency {:>4}: unlimited {:>8.0f} jobs/s, 1000000/s limit {:>8.0f} ({:.3f}x), "
                       "per key (16 keys) {:>8.0f} ({:.3f}x)\n",
                       o["concurrency"].get<int>(), jps("unlimited"), jps("limited"),
                       o["limited_over_unlimited"].get<double>(), jps("limited_per_key"),
                       o["per_key_over_unlimited"].get<double>());
  }
  const auto& a = j["accuracy"];
  out += fmt::format("  pace, {}/{} ms at concurrency {}: {} starts at {:.1f}/s ({:.3f}x the limit); most in one "
                     "period {} ({:.3f}x), in a tenth {} ({:.2f}x); server CPU {:.1f}% of a core\n",
                     a["limit_count"].get<std::int64_t>(), a["limit_period_ms"].get<std::int64_t>(),
                     a["concurrency"].get<int>(), a["starts"].get<std::size_t>(), a["achieved_per_s"].get<double>(),
                     a["achieved_over_limit"].get<double>(), a["peak_in_period"].get<std::size_t>(),
                     a["peak_over_limit"].get<double>(), a["peak_in_tenth_period"].get<std::size_t>(),
                     a["peak_tenth_over_limit"].get<double>(), a["run"]["server_cpu_pct"].get<double>());
  return out;
}

}  // namespace jobguard::bench
