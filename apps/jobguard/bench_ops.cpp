#include "bench_ops.hpp"

#include <fmt/format.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <future>

#include "jobguard/error.hpp"
#include "jobguard/redis/script.hpp"

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace jobguard::cli::bench {
namespace {

// The compare-and-delete every token-checking lock uses; the raw pair sends
// it by hand so the lock's overhead is all that differs between the phases.
const redis::Script& release_script() {
  static const redis::Script s(
      "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0");
  return s;
}

struct WorkerResult {
  std::uint64_t ops = 0, errors = 0;
  std::vector<float> lat;
};

}  // namespace

bool lock_ops_available() { return false; }

Runner::Runner(const redis::ConnectionOptions& opts, Config cfg) : cfg_(cfg) {
  client_ = std::make_unique<redis::Client>(ctx_, opts);
  loop_ = std::thread([this] {
    auto guard = asio::make_work_guard(ctx_);
    ctx_.run();
  });
  connected_ = client_->wait_connected(std::chrono::milliseconds(opts.connect_timeout) * 2);
  if (connected_) {
    // Load the release script so EVALSHA never takes the NOSCRIPT detour mid-run.
    client_->exec(redis::Command{"SCRIPT", "LOAD", release_script().source()});
  }
}

Runner::~Runner() {
  // The client must close on its loop before the loop stops.
  std::promise<void> closed;
  asio::post(ctx_, [this, &closed] {
    client_.reset();
    closed.set_value();
  });
  closed.get_future().wait();
  ctx_.stop();
  loop_.join();
}

Phase Runner::run(Op op) { return cfg_.threads ? run_threads(op) : run_coro(op); }

Phase Runner::run_coro(Op op) {
  const auto gen = ++generation_;
  const auto before = client_->stats();
  std::vector<WorkerResult> results(static_cast<std::size_t>(cfg_.workers));
  std::atomic<int> running{cfg_.workers};
  std::promise<void> all_done;
  const auto start = Clock::now();
  const auto stop_at = start + std::chrono::duration_cast<Clock::duration>(cfg_.seconds);
  redis::Client& client = *client_;
  for (int w = 0; w < cfg_.workers; ++w) {
    auto body = [&, w, gen]() -> asio::awaitable<void> {
      WorkerResult& r = results[static_cast<std::size_t>(w)];
      r.lat.reserve(1 << 16);
      const std::string token = fmt::format("bench-{}-{}", gen, w);
      for (std::uint64_t i = 0; Clock::now() < stop_at; ++i) {
        const std::string key = fmt::format("jobguard:lock:{{bench:{}:{}:{}}}", gen, w, i);
        const auto t0 = Clock::now();
        try {
          redis::Command set{"SET", key, token, "NX", "PX", "30000"};
          co_await redis::async_exec(client, std::move(set), asio::use_awaitable);
          if (op == Op::raw_pair) {
            redis::Command del{"EVALSHA", release_script().sha1(), "1", key, token};
            co_await redis::async_exec(client, std::move(del), asio::use_awaitable);
          }
          ++r.ops;
        } catch (const Error&) {
          ++r.errors;
        }
        r.lat.push_back(std::chrono::duration<float, std::micro>(Clock::now() - t0).count());
      }
      if (--running == 0) all_done.set_value();
    };
    asio::co_spawn(ctx_, body, asio::detached);
  }
  all_done.get_future().wait();
  Phase p;
  p.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  const auto after = client_->stats();
  p.commands = after.commands - before.commands;
  p.writes = after.writes - before.writes;
  for (auto& r : results) {
    p.ops += r.ops;
    p.errors += r.errors;
    p.latencies_us.insert(p.latencies_us.end(), r.lat.begin(), r.lat.end());
  }
  return p;
}

Phase Runner::run_threads(Op op) {
  const auto gen = ++generation_;
  const auto before = client_->stats();
  std::vector<WorkerResult> results(static_cast<std::size_t>(cfg_.workers));
  const auto start = Clock::now();
  const auto stop_at = start + std::chrono::duration_cast<Clock::duration>(cfg_.seconds);
  std::vector<std::thread> threads;
  for (int w = 0; w < cfg_.workers; ++w) {
    threads.emplace_back([&, w] {
      WorkerResult& r = results[static_cast<std::size_t>(w)];
      const std::string token = fmt::format("bench-{}-{}", gen, w);
      for (std::uint64_t i = 0; Clock::now() < stop_at; ++i) {
        const std::string key = fmt::format("jobguard:lock:{{bench:{}:{}:{}}}", gen, w, i);
        const auto t0 = Clock::now();
        try {
          client_->exec(redis::Command{"SET", key, token, "NX", "PX", "30000"});
          if (op == Op::raw_pair)
            client_->exec(redis::Command{"EVALSHA", release_script().sha1(), "1", key, token});
          ++r.ops;
        } catch (const Error&) {
          ++r.errors;
        }
        r.lat.push_back(std::chrono::duration<float, std::micro>(Clock::now() - t0).count());
      }
    });
  }
  for (auto& t : threads) t.join();
  Phase p;
  p.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  const auto after = client_->stats();
  p.commands = after.commands - before.commands;
  p.writes = after.writes - before.writes;
  for (auto& r : results) {
    p.ops += r.ops;
    p.errors += r.errors;
    p.latencies_us.insert(p.latencies_us.end(), r.lat.begin(), r.lat.end());
  }
  return p;
}

}  // namespace jobguard::cli::bench
