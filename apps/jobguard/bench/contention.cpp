// `jobguard bench --contention`: W worker threads, each with its own client,
// loop acquire (waiting) -> hold -> release on ONE resource.
#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <thread>

#include "harness.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"

namespace jobguard::bench {
namespace {

using Clock = std::chrono::steady_clock;

double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// One run: every worker's client and service, and the handoff bookkeeping
// they share.
class ContentionRun {
 public:
  ContentionRun(const redis::ConnectionOptions& opts, const ContentionConfig& cfg);
  ContentionResult run();

 private:
  void worker(std::size_t w);
  LockOptions options(Clock::time_point now) const;
  // Inside the critical section: the handoff is recorded, `lock` held for
  // --hold and released.
  void hold(std::size_t w, Lock& lock, Clock::time_point asked, Clock::time_point got);
  void fail(ContentionWorker& me, std::string_view what);

  ContentionConfig cfg_;
  // Clients before services: members go in reverse order, and a LockService
  // (and every Lock, which shares its service) refers to its Client, so the
  // services must go first, on a constructor that throws too.
  std::vector<std::unique_ptr<redis::Client>> clients_;
  std::vector<std::shared_ptr<LockService>> services_;
  ContentionResult res_;
  // Handoff bookkeeping, written only by the holder of the lock; the mutex
  // makes that visible to the next holder (and lets us count overlaps, which
  // would mean the lock failed).
  std::mutex mu_;
  int holder_ = -1, last_holder_ = -1;
  std::optional<Clock::time_point> last_release_sent_;
  Clock::time_point end_;
};

ContentionRun::ContentionRun(const redis::ConnectionOptions& opts, const ContentionConfig& cfg) : cfg_(cfg) {
  const auto n = static_cast<std::size_t>(cfg.workers);
  for (std::size_t w = 0; w < n; ++w) {
    clients_.push_back(std::make_unique<redis::Client>(opts));
    services_.push_back(LockService::create(*clients_.back()));
  }
  for (auto& c : clients_)
    if (!c->wait_connected(opts.connect_timeout * 2))
      throw Error(errc::redis_unavailable, fmt::format("cannot connect to {}", redis::to_display_url(opts)));
  // Start from a free lock and an empty fair queue (a previous run's waiters
  // could otherwise hold places at the head until their leases expire).
  const KeyBuilder& keys = services_[0]->keys();
  clients_[0]->exec(redis::Command{"DEL", keys.lock_key(cfg.resource), keys.queue_key(cfg.resource),
                                   keys.queue_expiry_key(cfg.resource)});
  res_.workers.resize(n);
}

ContentionResult ContentionRun::run() {
  const auto start = Clock::now();
  end_ = start + std::chrono::duration_cast<Clock::duration>(cfg_.seconds);
  std::vector<std::thread> threads;
  for (std::size_t w = 0; w < services_.size(); ++w) threads.emplace_back([this, w] { worker(w); });
  for (auto& t : threads) t.join();
  res_.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  return std::move(res_);
}

LockOptions ContentionRun::options(Clock::time_point now) const {
  LockOptions lo;
  lo.ttl = std::chrono::milliseconds(30000);
  lo.fair = cfg_.fair;
  lo.lock_class = "bench-contention";
  // Wait as long as the run lasts: a worker that gives up early would hide
  // exactly the starvation we are here to measure.
  lo.wait = std::max(std::chrono::milliseconds(1), std::chrono::ceil<std::chrono::milliseconds>(end_ - now));
  return lo;
}

void ContentionRun::worker(std::size_t w) {
  ContentionWorker& me = res_.workers[w];
  me.waits_us.reserve(1 << 14);
  for (;;) {
    const auto t0 = Clock::now();
    if (t0 >= end_) break;
    std::optional<Lock> lock;
    try {
      lock = services_[w]->acquire(cfg_.resource, options(t0));
    } catch (const Error& e) {
      fail(me, e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    const auto got = Clock::now();
    if (!lock) {
      me.longest_wait_us = std::max(me.longest_wait_us, us(got - t0));
      break;
    }
    if (got >= end_) {
      // Granted after the end: the wait counted lasted up to the end.
      me.longest_wait_us = std::max(me.longest_wait_us, us(end_ - t0));
      try {
        lock->release();
      } catch (const Error&) {
      }
      break;
    }
    hold(w, *lock, t0, got);
  }
}

void ContentionRun::hold(std::size_t w, Lock& lock, Clock::time_point asked, Clock::time_point got) {
  ContentionWorker& me = res_.workers[w];
  {
    std::lock_guard<std::mutex> g(mu_);
    if (holder_ != -1) ++res_.overlaps;
    holder_ = static_cast<int>(w);
    if (last_release_sent_) {
      const auto h = static_cast<float>(us(got - *last_release_sent_));
      res_.handoffs_us.push_back(h);
      if (last_holder_ == static_cast<int>(w)) ++res_.self_handoffs;
      else res_.other_handoffs_us.push_back(h);
    }
  }
  ++me.count;
  me.waits_us.push_back(static_cast<float>(us(got - asked)));
  me.longest_wait_us = std::max(me.longest_wait_us, us(got - asked));
  std::this_thread::sleep_for(cfg_.hold);
  {
    std::lock_guard<std::mutex> g(mu_);
    holder_ = -1;
    last_holder_ = static_cast<int>(w);
    // Sent, not answered: the next grant can only happen after the release
    // ran, so grant-received minus release-sent is never negative (the same
    // definition as bench/peers/contention.js).
    last_release_sent_ = Clock::now();
  }
  try {
    if (!lock.release()) fail(me, "release found the lock no longer ours");
  } catch (const Error& e) {
    fail(me, e.what());
  }
}

void ContentionRun::fail(ContentionWorker& me, std::string_view what) {
  std::lock_guard<std::mutex> g(mu_);
  ++me.errors;
  if (res_.first_error.empty()) res_.first_error = what;
}

}  // namespace

ContentionResult run_contention(const redis::ConnectionOptions& opts, const ContentionConfig& cfg) {
  ContentionRun run(opts, cfg);
  return run.run();
}

Report contention(const redis::ConnectionOptions& opts, const ContentionConfig& cfg) {
  const auto r = run_contention(opts, cfg);
  const auto j = summarize(cfg, r);
  const auto where = redis::to_display_url(opts);
  Report rep;
  if (r.overlaps) rep.warnings.push_back(fmt::format("{} overlapping critical sections: the lock failed", r.overlaps));
  if (!r.first_error.empty()) rep.warnings.push_back("first error: " + r.first_error);
  rep.json = nlohmann::json{{"redis", where}, {"contention", j}};
  rep.text = contention_text(cfg, j, where);
  return rep;
}

}  // namespace jobguard::bench
