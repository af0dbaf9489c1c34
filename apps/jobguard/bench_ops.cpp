// g++ 12 at -O2 inlines Asio's coroutine frame allocator (operator new of
// awaitable_frame_base, which recycles blocks through std::free) far enough
// to see a malloc'd-or-new'd mismatch that is not there: a known false
// positive of -Wmismatched-new-delete. Off for this file only, before any
// Asio header is read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
#include "bench_ops.hpp"

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
                          [h](const Error& e, std::optional<Lock> l) { (*h)(e.code(), std::move(l)); });
      },
      token, std::move(resource), std::move(opts));
}

template <class Token>
auto async_release(LockService& svc, const Lock& l, Token&& token) {
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

bool lock_ops_available() { return true; }

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

ContentionResult run_contention(const redis::ConnectionOptions& opts, const ContentionConfig& cfg) {
  const auto n = static_cast<std::size_t>(cfg.workers);
  // Declared before the services: a LockService refers to its Client, so the
  // services (and every Lock, which shares its service) must go first.
  std::vector<std::unique_ptr<redis::Client>> clients;
  std::vector<std::shared_ptr<LockService>> services;
  struct Teardown {
    std::vector<std::shared_ptr<LockService>>& s;
    std::vector<std::unique_ptr<redis::Client>>& c;
    ~Teardown() {
      s.clear();
      c.clear();
    }
  } teardown{services, clients};
  for (std::size_t w = 0; w < n; ++w) {
    clients.push_back(std::make_unique<redis::Client>(opts));
    services.push_back(LockService::create(*clients.back()));
  }
  for (auto& c : clients)
    if (!c->wait_connected(opts.connect_timeout * 2))
      throw Error(errc::redis_unavailable, fmt::format("cannot connect to {}", redis::to_display_url(opts)));

  // Start from a free lock and an empty fair queue (a previous run's waiters
  // could otherwise hold places at the head until their leases expire).
  const KeyBuilder& keys = services[0]->keys();
  clients[0]->exec(redis::Command{"DEL", keys.lock_key(cfg.resource), keys.queue_key(cfg.resource),
                                  keys.queue_expiry_key(cfg.resource)});

  ContentionResult res;
  res.workers.resize(n);
  // Handoff bookkeeping, written only by the holder of the lock; the mutex
  // makes that visible to the next holder (and lets us count overlaps, which
  // would mean the lock failed).
  std::mutex mu;
  int holder = -1, last_holder = -1;
  std::optional<Clock::time_point> last_release_sent;

  const auto start = Clock::now();
  const auto end = start + std::chrono::duration_cast<Clock::duration>(cfg.seconds);
  auto worker = [&](std::size_t w) {
    ContentionWorker& me = res.workers[w];
    me.waits_us.reserve(1 << 14);
    LockService& svc = *services[w];
    auto us = [](Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
    for (;;) {
      const auto t0 = Clock::now();
      if (t0 >= end) break;
      LockOptions lo;
      lo.ttl = std::chrono::milliseconds(30000);
      lo.fair = cfg.fair;
      lo.lock_class = "bench-contention";
      // Wait as long as the run lasts: a worker that gives up early would
      // hide exactly the starvation we are here to measure.
      lo.wait = std::max(std::chrono::milliseconds(1), std::chrono::ceil<std::chrono::milliseconds>(end - t0));
      std::optional<Lock> lock;
      try {
        lock = svc.acquire(cfg.resource, lo);
      } catch (const Error& e) {
        {
          std::lock_guard<std::mutex> g(mu);
          ++me.errors;
          if (res.first_error.empty()) res.first_error = e.what();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      const auto got = Clock::now();
      if (!lock) {
        me.longest_wait_us = std::max(me.longest_wait_us, us(got - t0));
        break;
      }
      if (got >= end) {
        // Granted after the end: the wait counted lasted up to the end.
        me.longest_wait_us = std::max(me.longest_wait_us, us(end - t0));
        try {
          lock->release();
        } catch (const Error&) {
        }
        break;
      }
      {
        std::lock_guard<std::mutex> g(mu);
        if (holder != -1) ++res.overlaps;
        holder = static_cast<int>(w);
        if (last_release_sent) {
          const auto h = static_cast<float>(us(got - *last_release_sent));
          res.handoffs_us.push_back(h);
          if (last_holder == static_cast<int>(w)) ++res.self_handoffs;
          else res.other_handoffs_us.push_back(h);
        }
      }
      ++me.count;
      me.waits_us.push_back(static_cast<float>(us(got - t0)));
      me.longest_wait_us = std::max(me.longest_wait_us, us(got - t0));
      std::this_thread::sleep_for(cfg.hold);
      {
        std::lock_guard<std::mutex> g(mu);
        holder = -1;
        last_holder = static_cast<int>(w);
        // Sent, not answered: the next grant can only happen after the
        // release ran, so grant-received minus release-sent is never negative
        // (the same definition as bench/peers/contention.js).
        last_release_sent = Clock::now();
      }
      try {
        if (!lock->release()) {
          std::lock_guard<std::mutex> g(mu);
          ++me.errors;
          if (res.first_error.empty()) res.first_error = "release found the lock no longer ours";
        }
      } catch (const Error& e) {
        std::lock_guard<std::mutex> g(mu);
        ++me.errors;
        if (res.first_error.empty()) res.first_error = e.what();
      }
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t w = 0; w < n; ++w) threads.emplace_back(worker, w);
  for (auto& t : threads) t.join();
  res.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  return res;
}

}  // namespace jobguard::cli::bench
