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
#include "jobguard/lock.hpp"
#include <boost/asio/as_tuple.hpp>
#include "jobguard/redis/script.hpp"

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace jobguard::cli::bench {
namespace {

// The raw pair sends the lock's own release script by hand, so the library's
// overhead is all that differs between the raw_pair and lock phases.
const redis::Script& release_script() { return lock_release_script(); }

// Awaitable acquire on top of the callback API.
template <class Token>
auto async_acquire(LockService& svc, std::string resource, LockOptions opts, Token&& token) {
  return asio::async_initiate<Token, void(std::error_code, std::optional<Lock>)>(
      [&svc](auto handler, std::string r, LockOptions o) {
        auto h = std::make_shared<decltype(handler)>(std::move(handler));
        svc.async_acquire(std::move(r), std::move(o),
                          [h](std::error_code ec, std::optional<Lock> l) { (*h)(ec, std::move(l)); });
      },
      token, std::move(resource), std::move(opts));
}

template <class Token>
auto async_release(LockService& svc, const Lock& l, Token&& token) {
  return asio::async_initiate<Token, void(std::error_code, bool)>(
      [&svc, &l](auto handler) {
        auto h = std::make_shared<decltype(handler)>(std::move(handler));
        svc.async_release(l.resource(), l.token(), [h](std::error_code ec, bool ours) { (*h)(ec, ours); });
      },
      token);
}

struct WorkerResult {
  std::uint64_t ops = 0, errors = 0;
  std::vector<float> lat;
};

}  // namespace

bool lock_ops_available() { return true; }

Runner::Runner(const redis::ConnectionOptions& opts, Config cfg) : cfg_(cfg) {
  client_ = std::make_unique<redis::Client>(ctx_, opts);
  loop_ = std::thread([this] {
    auto guard = asio::make_work_guard(ctx_);
    ctx_.run();
  });
  locks_ = LockService::create(*client_);
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
    locks_.reset();
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
        const std::string resource = fmt::format("bench:{}:{}:{}", gen, w, i);
        const auto t0 = Clock::now();
        if (op == Op::lock_pair) {
          LockOptions lo;
          lo.ttl = std::chrono::milliseconds(30000);
          auto [ec, lock] = co_await async_acquire(*locks_, resource, lo, asio::as_tuple(asio::use_awaitable));
          bool ok = !ec && lock.has_value();
          if (ok) {
            auto [rec, ours] = co_await async_release(*locks_, *lock, asio::as_tuple(asio::use_awaitable));
            lock->detach();
            ok = !rec && ours;
          }
          ++(ok ? r.ops : r.errors);
          r.lat.push_back(std::chrono::duration<float, std::micro>(Clock::now() - t0).count());
          continue;
        }
        const std::string key = keys_.lock_key(resource);
        try {
          redis::Command set{"SET", key, token, "NX", "PX", "30000"};
          co_await redis::async_exec(client, std::move(set), asio::use_awaitable);
          if (op == Op::raw_pair) {
            redis::Command del{"EVALSHA", release_script().sha1(), "1", key, token, channel_for(resource)};
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
        const std::string resource = fmt::format("bench:{}:{}:{}", gen, w, i);
        const std::string key = keys_.lock_key(resource);
        const auto t0 = Clock::now();
        try {
          if (op == Op::lock_pair) {
            LockOptions lo;
            lo.ttl = std::chrono::milliseconds(30000);
            auto l = locks_->acquire(resource, lo);
            if (l && l->release()) ++r.ops;
            else ++r.errors;
          } else {
            client_->exec(redis::Command{"SET", key, token, "NX", "PX", "30000"});
            if (op == Op::raw_pair)
              client_->exec(redis::Command{"EVALSHA", release_script().sha1(), "1", key, token, channel_for(resource)});
            ++r.ops;
          }
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
