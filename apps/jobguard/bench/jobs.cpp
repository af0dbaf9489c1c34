// `jobguard bench --jobs` and `--leases`: the job path and the lease
// scheduler, each beside its own baseline measured in the same run.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <condition_variable>
#include <future>
#include <cstring>
#include <mutex>
#include <thread>

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

using Clock = steady_clock;

std::int64_t now_ns() { return duration_cast<nanoseconds>(Clock::now().time_since_epoch()).count(); }

// `count` jobs (id, run, t = enqueue time on this host's monotonic clock),
// pipelined 500 at a time.
void enqueue(redis::Client& c, const std::string& stream, int count, const std::string& run) {
  for (int done = 0; done < count;) {
    std::vector<std::future<redis::Reply>> batch;
    for (int i = 0; i < 500 && done < count; ++i, ++done)
      batch.push_back(c.exec_future(redis::Command{"XADD", stream, "*", "id", std::to_string(done), "run", run, "t",
                                                   std::to_string(now_ns())}));
    for (auto& f : batch) f.get();
  }
}

// The same jobs enqueued unique (until-executed on the id): each one its
// unique lock and its entry in one script call, as `jobs add --unique` does.
// Not pipelined (add_unique blocks); the enqueue is not timed.
void enqueue_unique(redis::Client& c, const job::StreamOptions& so, int count, const std::string& run) {
  job::StreamSource src(c, so);
  const job::UniqueOptions u{.strategy = job::UniqueStrategy::until_executed};
  for (int i = 0; i < count; ++i)
    if (src.add_unique({{"id", std::to_string(i)}, {"run", run}, {"t", std::to_string(now_ns())}}, u).result !=
        job::UniqueAdd::Result::added)
      throw Error(errc::invalid_argument, fmt::format("bench --jobs --unique: job {} was refused as a duplicate", i));
}

// This process's CPU seconds, every thread (its rusage).
double cpu_seconds_self() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

// `server_s`: the server's CPU seconds during the phase (INFO cpu before and
// after): on a host where the server is the limit, its time per job is the
// steadier figure when other work on the machine moves jobs/s. `client_s`:
// this process's (its rusage, every thread): where the server is not busy
// all the phase, the client's time per job says whether it is the other limit.
nlohmann::json phase(int concurrency, int jobs, double secs, std::vector<float> lat_us, std::int64_t errors,
                     double server_s, double client_s) {
  return {{"concurrency", concurrency},
          {"server_cpu_s", server_s},
          {"server_us_per_job", jobs > 0 ? server_s * 1e6 / jobs : 0.0},
          {"client_cpu_s", client_s},
          {"client_us_per_job", jobs > 0 ? client_s * 1e6 / jobs : 0.0},
          {"jobs", jobs},
          {"seconds", secs},
          {"jobs_per_s", secs > 0 ? jobs / secs : 0.0},
          {"enqueue_to_ack_p50_ms", quantile(lat_us, 0.50) / 1000},
          {"enqueue_to_ack_p99_ms", quantile(lat_us, 0.99) / 1000},
          {"errors", errors}};
}

std::int64_t enqueued_at(const job::StreamJob& j) { return std::stoll(j.field("t")); }

// The ceiling: the same jobs read with XREADGROUP COUNT c and acknowledged
// with one XACK per job, all of a batch in flight at once — what a consumer
// without guards does (the guarded worker acknowledges each job too).
void bare(redis::Client& c, const std::string& stream, int concurrency, int jobs, std::vector<float>& lat_us) {
  int acked = 0;
  while (acked < jobs) {
    auto r = c.exec(redis::Command{"XREADGROUP", "GROUP", "bench", "bare", "COUNT", std::to_string(concurrency),
                                   "STREAMS", stream, ">"});
    if (!r.is_array() || r.elements.empty()) continue;
    const auto& entries = r.elements[0].elements[1].elements;
    std::vector<std::int64_t> sent;
    std::promise<void> all;
    auto left = std::make_shared<std::atomic<std::size_t>>(entries.size());
    for (const auto& e : entries) {
      const auto& f = e.elements[1].elements;
      for (std::size_t i = 0; i + 1 < f.size(); i += 2)
        if (f[i].str == "t") sent.push_back(std::stoll(f[i + 1].str));
      c.async_exec(redis::Command{"XACK", stream, "bench", e.elements[0].str},
                   [left, &all](std::error_code, redis::Reply) {
                     if (left->fetch_sub(1) == 1) all.set_value();
                   });
    }
    all.get_future().wait();
    const auto t = now_ns();
    for (auto s : sent) lat_us.push_back(static_cast<float>(static_cast<double>(t - s) / 1000.0));
    acked += static_cast<int>(sent.size());
  }
}

}  // namespace

nlohmann::json run_jobs(const redis::ConnectionOptions& opts, const JobsConfig& cfg) {
  redis::Client client(opts);
  if (!client.wait_connected(opts.connect_timeout))
    throw Error(errc::redis_unavailable, fmt::format("cannot connect to {}", redis::to_display_url(opts)));
  const std::string tag = std::to_string(now_ns() % 1000000007);
  auto leases = LeaseScheduler::create(LockService::create(client, KeyBuilder("bench:" + tag)));
  guard::RedisCompletionStore done(client, {.prefix = "bench:" + tag + ":done:", .retention = minutes(10)});
  guard::RedisIdempotencyStore idem(client, {.retention = minutes(10), .prefix = "bench:" + tag + ":idem:"});
  const job::LockClass cls{.name = "bench-job",
                           .key_pattern = "bench-job:{id}",
                           .consequence = job::Consequence::moderate,
                           .ttl = seconds(30),
                           .owner = "jobguard bench",
                           .protects = "a no-op"};
  job::GuardedRunner runner(leases, cls, {.completions = &done, .idempotency = &idem});
  job::AsyncJobEffect noop = [](job::WorkItem&) -> asio::awaitable<std::string> { co_return std::string(); };

  // Every primary of a cluster: the server CPU per job is the whole cluster's.
  const auto nodes = client.primaries();
  nlohmann::json guarded = nlohmann::json::array(), bare_runs = nlohmann::json::array();
  for (int c : cfg.concurrency) {
    // Guarded: the stream worker, lock + idempotency key + completion record per job.
    job::StreamOptions so{.stream = fmt::format("bench:{}:jobs:{}", tag, c), .group = "bench"};
    job::StreamSource(client, so).ensure_group();
    if (cfg.unique) enqueue_unique(client, so, cfg.jobs, "g" + std::to_string(c));
    else enqueue(client, so.stream, cfg.jobs, "g" + std::to_string(c));
    std::vector<float> lat;
    lat.reserve(static_cast<std::size_t>(cfg.jobs));
    std::int64_t errors = 0;
    job::WorkerOptions wo{.concurrency = c, .max_jobs = cfg.jobs};
    wo.on_job = [&](const job::JobReport& r) {
      if (r.decision.action != job::Action::ack) ++errors;
      lat.push_back(static_cast<float>(static_cast<double>(now_ns() - enqueued_at(*r.job)) / 1000.0));
    };
    job::StreamWorker worker(client, so, runner, noop, wo);
    const double g0 = server_cpu_seconds(client, nodes), gc0 = cpu_seconds_self();
    const auto t0 = Clock::now();
    worker.run();
    const double secs = duration<double>(Clock::now() - t0).count();
    const double gc = cpu_seconds_self() - gc0;
    guarded.push_back(phase(c, cfg.jobs, secs, std::move(lat), errors, server_cpu_seconds(client, nodes) - g0, gc));

    // Bare: the same number of jobs through XREADGROUP + XACK.
    const std::string bare_stream = fmt::format("bench:{}:bare:{}", tag, c);
    client.exec(redis::Command{"XGROUP", "CREATE", bare_stream, "bench", "0", "MKSTREAM"});
    enqueue(client, bare_stream, cfg.jobs, "b");
    std::vector<float> blat;
    blat.reserve(static_cast<std::size_t>(cfg.jobs));
    const double bs0 = server_cpu_seconds(client, nodes), bc0 = cpu_seconds_self();
    const auto b0 = Clock::now();
    bare(client, bare_stream, c, cfg.jobs, blat);
    const double bsecs = duration<double>(Clock::now() - b0).count();
    const double bc = cpu_seconds_self() - bc0;
    bare_runs.push_back(phase(c, cfg.jobs, bsecs, std::move(blat), 0, server_cpu_seconds(client, nodes) - bs0, bc));
    client.exec(redis::Command{"DEL", so.stream, bare_stream});
  }
  // The run the acceptance names: the highest concurrency's.
  nlohmann::json out{{"jobs", cfg.jobs}, {"unique", cfg.unique}, {"runs", guarded}, {"bare_runs", bare_runs}};
  out["guarded"] = guarded.back();
  out["bare"] = bare_runs.back();
  out["guarded_over_bare"] = out["guarded"]["jobs_per_s"].get<double>() / out["bare"]["jobs_per_s"].get<double>();
  return out;
}

double server_cpu_seconds(redis::Client& c, const std::vector<std::string>& nodes) {
  double total = 0;
  for (const auto& node : nodes.empty() ? std::vector<std::string>{""} : nodes) {
    const auto info = c.exec(redis::Command{"INFO", "cpu"}, {.node = node}).str;
    for (const char* field : {"used_cpu_sys:", "used_cpu_user:"}) {
      const auto at = info.find(field);
      if (at != std::string::npos) total += std::stod(info.substr(at + std::strlen(field)));
    }
  }
  return total;
}

nlohmann::json run_leases(const redis::ConnectionOptions& opts, const LeasesConfig& cfg) {
  redis::Client client(opts);
  if (!client.wait_connected(opts.connect_timeout))
    throw Error(errc::redis_unavailable, fmt::format("cannot connect to {}", redis::to_display_url(opts)));
  const std::string tag = std::to_string(now_ns() % 1000000007);
  auto leases = LeaseScheduler::create(LockService::create(client, KeyBuilder("bench:" + tag)));

  // Acquire them all, 2,000 in flight at a time, before measuring.
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0, failed = 0;
  std::vector<Lease> held;
  held.reserve(static_cast<std::size_t>(cfg.leases));
  LockOptions lo;
  lo.ttl = cfg.ttl;
  const auto a0 = Clock::now();
  for (int i = 0; i < cfg.leases; ++i) {
    {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return in_flight < 2000; });
      ++in_flight;
    }
    leases->service().async_acquire("lease:" + std::to_string(i), lo,
                                    [&](const Error& e, std::optional<Lock> l) {
                                      std::lock_guard lk(mu);
                                      if (e || !l) ++failed;
                                      else held.push_back(leases->adopt(std::move(*l)));
                                      --in_flight;
                                      cv.notify_one();
                                    });
  }
  {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return in_flight == 0; });
  }
  const double acquire_s = duration<double>(Clock::now() - a0).count();
  if (failed) throw Error(errc::server_error, fmt::format("bench --leases: {} of {} acquires failed", failed, cfg.leases));

  const auto before = leases->stats();
  const double cpu0 = cpu_seconds_self(), server0 = server_cpu_seconds(client);
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(cfg.hold);
  const double secs = duration<double>(Clock::now() - t0).count();
  const double cpu = cpu_seconds_self() - cpu0, server = server_cpu_seconds(client) - server0;
  const auto after = leases->stats();
  std::uint64_t lost = 0;
  for (const auto& l : held) lost += l.lost() ? 1 : 0;
  for (auto& l : held) l.release();
  return {{"leases", cfg.leases},
          {"ttl_ms", cfg.ttl.count()},
          {"seconds", secs},
          {"acquire_seconds", acquire_s},
          {"renewals", after.renewals_sent - before.renewals_sent},
          {"renewals_per_s", static_cast<double>(after.renewals_sent - before.renewals_sent) / secs},
          {"renewal_failures", after.renewal_failures - before.renewal_failures},
          {"client_cpu_pct", 100.0 * cpu / secs},
          {"server_cpu_pct", 100.0 * server / secs},
          {"lost", lost}};
}

Report jobs(const redis::ConnectionOptions& opts, const JobsConfig& cfg) {
  Report rep;
  rep.json = run_jobs(opts, cfg);
  std::string runs;
  for (const auto& [name, list] : {std::pair{"guarded", rep.json["runs"]}, std::pair{"bare", rep.json["bare_runs"]}})
    for (const auto& r : list)
      runs += fmt::format("  {:<8} concurrency {:>4}: {:>9.0f} jobs/s   enqueue->ack p50 {:>8.1f} ms p99 {:>8.1f} ms\n",
                          name, r["concurrency"].get<int>(), r["jobs_per_s"].get<double>(),
                          r["enqueue_to_ack_p50_ms"].get<double>(), r["enqueue_to_ack_p99_ms"].get<double>());
  rep.text = fmt::format("jobguard bench --jobs {}: guarded = StreamWorker, moderate class (lock + idempotency key + "
                         "completion record{}), no-op effect; bare = XREADGROUP + XACK\n{}  guarded/bare = {:.3f}\n",
                         cfg.jobs, cfg.unique ? "; enqueued unique, until-executed" : "", runs,
                         rep.json["guarded_over_bare"].get<double>());
  rep.json["redis"] = redis::to_display_url(opts);
  return rep;
}

Report leases(const redis::ConnectionOptions& opts, const LeasesConfig& cfg) {
  Report rep;
  rep.json = run_leases(opts, cfg);
  const auto& j = rep.json;
  rep.text = fmt::format("jobguard bench --leases {}: TTL {} ms, held {:.1f} s: {:.0f} renewals/s, client CPU {:.2f}% "
                         "of a core, server CPU {:.2f}%, lost {}\n",
                         cfg.leases, j["ttl_ms"].get<std::int64_t>(), j["seconds"].get<double>(),
                         j["renewals_per_s"].get<double>(), j["client_cpu_pct"].get<double>(),
                         j["server_cpu_pct"].get<double>(), j["lost"].get<std::uint64_t>());
  rep.json["redis"] = redis::to_display_url(opts);
  return rep;
}

}  // namespace jobguard::bench
