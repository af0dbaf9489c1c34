// `jobguard bench --permits` and `--shared`: acquire -> release pairs by W
// coroutine workers on one connection, of a semaphore's permit or of a
// read-write lock's reader (beside mutex pairs).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <functional>
#include <future>
#include <mutex>

#include "harness.hpp"
#include "jobguard/async.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"

namespace asio = boost::asio;
using namespace std::chrono;

namespace jobguard::bench {
namespace {

// What W workers measured: acquire+release pairs.
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
  st.ops = all.size();
  st.errors = errors.load();
  st.p50_us = quantile(all, 0.50);
  st.p99_us = quantile(all, 0.99);
  return st;
}

nlohmann::json shared_round(const PairStats& rs, const PairStats& ms, double secs, double ratio) {
  return {{"read_pairs_per_s", static_cast<double>(rs.ops) / secs},
          {"read_p50_us", rs.p50_us},
          {"read_p99_us", rs.p99_us},
          {"mutex_pairs_per_s", static_cast<double>(ms.ops) / secs},
          {"mutex_p50_us", ms.p50_us},
          {"mutex_p99_us", ms.p99_us},
          {"ratio", ratio}};
}

}  // namespace

Report permits(const redis::ConnectionOptions& opts, const PairsConfig& cfg) {
  redis::Client client(opts);
  auto svc = LockService::create(client);
  LockOptions lo;
  lo.permits = cfg.permits;
  lo.ttl = seconds(30);
  lo.wait = seconds(10);
  lo.lock_class = "bench-permits";
  const auto st = measure_pairs(client, *svc, cfg.workers, cfg.seconds, lo, [&](int) { return cfg.resource; });
  const auto where = redis::to_display_url(opts);
  Report rep;
  if (!st.first_error.empty()) rep.warnings.push_back("first error: " + st.first_error);
  const double per_s = static_cast<double>(st.ops) / cfg.seconds;
  rep.json = nlohmann::json{{"redis", where},
                            {"permits", {{"permits", cfg.permits}, {"workers", cfg.workers}, {"seconds", cfg.seconds},
                                         {"ops", st.ops}, {"ops_per_s", per_s}, {"p50_us", st.p50_us},
                                         {"p99_us", st.p99_us}, {"errors", st.errors},
                                         {"busy_poll_us", opts.busy_poll.count()}}}};
  const auto spin = opts.busy_poll.count() > 0 ? fmt::format(" (busy_poll {}us)", opts.busy_poll.count()) : "";
  rep.text = fmt::format("jobguard bench --permits {}: {} workers, {:.1f} s, {}{}: {:.0f} acquire+release/s   p50 "
                         "{:.0f} us   p99 {:.0f} us   errors {}\n",
                         cfg.permits, cfg.workers, cfg.seconds, where, spin, per_s, st.p50_us, st.p99_us, st.errors);
  return rep;
}

// Read pairs of ONE read-write lock against mutex pairs by the same W workers
// on a mutex each (uncontended, so both measure the pair's own cost), in
// alternating rounds on one connection; the ratio is the median of the
// rounds' ratios.
Report shared(const redis::ConnectionOptions& opts, const PairsConfig& cfg) {
  redis::Client client(opts);
  auto svc = LockService::create(client);
  LockOptions mutex;
  mutex.ttl = seconds(30);
  mutex.lock_class = "bench-mutex";
  LockOptions read = mutex;
  read.mode = LockMode::shared;
  read.wait = seconds(10);
  read.lock_class = "bench-shared";
  const double secs = cfg.seconds / cfg.rounds;
  nlohmann::json rounds = nlohmann::json::array();
  std::vector<double> ratios;
  PairStats rtot, mtot;
  std::string first_error;
  for (int r = 0; r < cfg.rounds; ++r) {
    const auto rs = measure_pairs(client, *svc, cfg.workers, secs, read, [&](int) { return cfg.resource; });
    const auto ms = measure_pairs(client, *svc, cfg.workers, secs, mutex,
                                  [&](int w) { return fmt::format("{}:mutex:{}", cfg.resource, w); });
    for (const auto* s : {&rs, &ms})
      if (first_error.empty()) first_error = s->first_error;
    rtot.ops += rs.ops;
    rtot.errors += rs.errors;
    mtot.ops += ms.ops;
    mtot.errors += ms.errors;
    const double ratio = ms.ops ? static_cast<double>(rs.ops) / static_cast<double>(ms.ops) : 0.0;
    ratios.push_back(ratio);
    rounds.push_back(shared_round(rs, ms, secs, ratio));
  }
  std::sort(ratios.begin(), ratios.end());
  const double median = ratios[ratios.size() / 2];
  const double total = secs * cfg.rounds;
  const auto where = redis::to_display_url(opts);
  const double read_per_s = static_cast<double>(rtot.ops) / total, mutex_per_s = static_cast<double>(mtot.ops) / total;
  Report rep;
  if (!first_error.empty()) rep.warnings.push_back("first error: " + first_error);
  rep.json = nlohmann::json{{"redis", where},
                            {"shared", {{"workers", cfg.workers}, {"seconds", cfg.seconds}, {"rounds", rounds},
                                        {"read_pairs_per_s", read_per_s}, {"mutex_pairs_per_s", mutex_per_s},
                                        {"ratio", median}, {"errors", rtot.errors + mtot.errors}}}};
  rep.text = fmt::format("jobguard bench --shared: {} workers, {:.1f} s, {}: read pairs {:.0f}/s, mutex pairs "
                         "{:.0f}/s, ratio {:.2f} (median of {} rounds)   errors {}\n",
                         cfg.workers, cfg.seconds, where, read_per_s, mutex_per_s, median, cfg.rounds,
                         rtot.errors + mtot.errors);
  return rep;
}

}  // namespace jobguard::bench
