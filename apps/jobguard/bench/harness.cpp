// g++ 12 at -O2 inlines Asio's coroutine frame allocator (operator new of
// awaitable_frame_base, which recycles blocks through std::free) far enough
// to see a malloc'd-or-new'd mismatch that is not there: a known false
// positive of -Wmismatched-new-delete. Off for this file only, before any
// Asio header is read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
#include "harness.hpp"

#include <fmt/format.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <future>
#include <mutex>
#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include <boost/asio/as_tuple.hpp>
#include "jobguard/redis/script.hpp"

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace jobguard::bench {
namespace {

// The raw pair sends the lock's own release script by hand, so the library's
// overhead is all that differs between the raw_pair and lock phases.
const redis::Script& release_script() { return lock_release_script(); }

// Awaitable acquire on top of the callback API.
template <class Token>
auto acquire_op(LockService& svc, std::string resource, LockOptions opts, Token&& token) {
  return asio::async_initiate<Token, void(std::error_code, std::optional<Lock>)>(
      [&svc](auto handler, std::string r, LockOptions o) {
        auto h = std::make_shared<decltype(handler)>(std::move(handler));
        svc.async_acquire(std::move(r), std::move(o),
                          [h](const Error& e, std::optional<Lock> l) { (*h)(e.code(), std::move(l)); });
      },
      token, std::move(resource), std::move(opts));
}

template <class Token>
auto release_op(LockService& svc, const Lock& l, Token&& token) {
  return asio::async_initiate<Token, void(std::error_code, bool)>(
      [&svc, &l](auto handler) {
        auto h = std::make_shared<decltype(handler)>(std::move(handler));
        svc.async_release(l.resource(), l.token(), [h](const Error& e, bool ours) { (*h)(e.code(), ours); });
      },
      token);
}

struct WorkerResult {
  std::uint64_t ops = 0, errors = 0;
  std::vector<float> lat;
};

}  // namespace

Runner::Runner(const redis::ConnectionOptions& opts, Config cfg) : cfg_(cfg) {
  client_ = std::make_unique<redis::Client>(ctx_, opts);
  loop_ = std::thread([this] {
    auto guard = asio::make_work_guard(ctx_);
    ctx_.run();
  });
  // A throw from here on (a cluster that answers CLUSTERDOWN to the script
  // load, say) skips ~Runner: the loop thread must be stopped and joined
  // here, or its std::thread dies joinable and the process aborts.
  try {
    setup(opts);
  } catch (...) {
    shutdown();
    throw;
  }
}

void Runner::setup(const redis::ConnectionOptions& opts) {
  locks_ = LockService::create(*client_);
  connected_ = client_->wait_connected(std::chrono::milliseconds(opts.connect_timeout) * 2);
  cluster_ = opts.cluster;
  if (connected_) {
    // Load the release script so EVALSHA never takes the NOSCRIPT detour mid-run.
    client_->exec(redis::Command{"SCRIPT", "LOAD", release_script().source()});
    if (cluster_) {
      // SCRIPT LOAD went to one node. EVAL (which caches the script) on keys
      // of 256 resources reaches every primary: a shard of 3 is missed with
      // odds of 3·(2/3)^256. A key without a lock makes the script return 0.
      for (int i = 0; i < 256; ++i) {
        const std::string r = fmt::format("bench:warm:{}", i);
        client_->eval(release_script(), {keys_.lock_key(r)}, {"-", channel_for(r), "", "1"});
      }
    }
    if (cfg_.fleet) {
      observe::FleetPublisherOptions fo;
      fo.interval = std::chrono::seconds(1);
      fleet_ = std::make_unique<observe::FleetPublisher>(*client_, fo);
    }
  }
}

redis::Command Runner::raw_release(const std::string& key, const std::string& token, const std::string& resource) const {
  if (cluster_) return redis::Command{"EVALSHA", release_script().sha1(), "1", key, token, channel_for(resource), "", "1"};
  return redis::Command{"EVALSHA", release_script().sha1(), "1", key, token, channel_for(resource)};
}

Runner::~Runner() { shutdown(); }

void Runner::shutdown() {
  fleet_.reset();  // its last batch needs the client and a running loop
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

namespace {
// Adds up one phase: the workers' counts and latencies, and the client's
// command and write counters over the phase (commands per write = pipelining).
Phase collect(const std::vector<WorkerResult>& results, Clock::time_point start, const redis::ClientStats& before,
              const redis::ClientStats& after) {
  Phase p;
  p.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  p.commands = after.commands - before.commands;
  p.writes = after.writes - before.writes;
  for (auto& r : results) {
    p.ops += r.ops;
    p.errors += r.errors;
    p.latencies_us.insert(p.latencies_us.end(), r.lat.begin(), r.lat.end());
  }
  return p;
}
}  // namespace

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
      // A token of the lock's own shape and length ("host/pid/job#hex"),
      // made once per worker: the raw halves send byte-for-byte the commands
      // the lock sends, without the per-acquire work of making a token.
      const std::string token = make_token();
      for (std::uint64_t i = 0; Clock::now() < stop_at; ++i) {
        const std::string resource = fmt::format("bench:{}:{}:{}", gen, w, i);
        const auto t0 = Clock::now();
        if (op == Op::lock_pair) {
          LockOptions lo;
          lo.ttl = std::chrono::milliseconds(30000);
          auto [ec, lock] = co_await acquire_op(*locks_, resource, lo, asio::as_tuple(asio::use_awaitable));
          bool ok = !ec && lock.has_value();
          if (ok) {
            auto [rec, ours] = co_await release_op(*locks_, *lock, asio::as_tuple(asio::use_awaitable));
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
            co_await redis::async_exec(client, raw_release(key, token, resource), asio::use_awaitable);
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
  return collect(results, start, before, client_->stats());
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
      // A token of the lock's own shape and length ("host/pid/job#hex"),
      // made once per worker: the raw halves send byte-for-byte the commands
      // the lock sends, without the per-acquire work of making a token.
      const std::string token = make_token();
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
              client_->exec(raw_release(key, token, resource));
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
  return collect(results, start, before, client_->stats());
}

}  // namespace jobguard::bench
