#include "billing/demo.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/post.hpp>
#include <fmt/format.h>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "jobguard/testing/embedded_redis.hpp"
#include "jobguard/error.hpp"
#include "jobguard/guard/completion.hpp"
#include "jobguard/job/lock_class.hpp"
#include "jobguard/job/runner.hpp"
#include "jobguard/job/stream_source.hpp"
#include "jobguard/job/worker.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::job {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::duration_cast;
using std::chrono::microseconds;
using std::chrono::milliseconds;

constexpr const char* kPeriod = "2026-11";

// The stand-in payment API. Charges are counted per subscription (the ground
// truth for double charges); a request carrying an idempotency key already
// seen returns the first result and charges nothing, as Stripe-like APIs do.
// The ledger keeps a per-subscription high-water fencing token: a write with
// a lower token comes from a superseded holder and is refused.
// Threads: every member is safe from any thread.
class BillingProvider {
 public:
  explicit BillingProvider(int n) : subs_(static_cast<std::size_t>(n)) {}

  // True when the charge was performed, false when it was an idempotent replay.
  bool charge(int sub, const std::string* idem_key) {
    std::lock_guard lk(mu_);
    if (idem_key) {
      auto [it, fresh] = keys_.emplace(*idem_key, sub);
      if (!fresh) {
        ++replays_;
        return false;
      }
    }
    ++subs_[static_cast<std::size_t>(sub)].charges;
    ++charges_;
    return true;
  }

  // `fence` empty: an unfenced write, always accepted.
  bool write_ledger(int sub, std::optional<std::int64_t> fence) {
    std::lock_guard lk(mu_);
    auto& s = subs_[static_cast<std::size_t>(sub)];
    if (fence) {
      if (*fence < s.high_fence) {
        ++stale_rejected_;
        return false;
      }
      s.high_fence = *fence;
    }
    // A second write for a subscription whose ledger entry already exists,
    // from another attempt: the naive run cannot tell it is stale.
    if (s.ledger && !fence) ++stale_accepted_;
    s.ledger = true;
    return true;
  }

  void fill(BillingRunResult& r) const {
    std::lock_guard lk(mu_);
    for (const auto& s : subs_) {
      if (s.charges > 1) r.double_charges += s.charges - 1;
      if (s.charges == 0 || !s.ledger) ++r.missing;
    }
    r.charges = charges_;
    r.idempotent_replays = replays_;
    r.stale_writes_rejected = stale_rejected_;
    r.stale_writes_accepted = stale_accepted_;
  }

 private:
  struct Sub {
    int charges = 0;
    bool ledger = false;
    std::int64_t high_fence = 0;
  };
  mutable std::mutex mu_;
  std::vector<Sub> subs_;
  std::unordered_map<std::string, int> keys_;
  std::int64_t charges_ = 0, replays_ = 0, stale_rejected_ = 0, stale_accepted_ = 0;
};

// Completion records for the guarded run. It stands in for PgCompletionStore
// (durable, survives the Redis restart): the demo must not need PostgreSQL,
// and a Redis-backed store would be wiped by the very restart it injects.
class MemoryCompletionStore final : public guard::CompletionStore {
 public:
  guard::RecordOutcome record(std::string_view job_kind, std::string_view entity, std::string_view run_id,
                              std::string_view completed_by, std::string_view result) override {
    std::lock_guard lk(mu_);
    std::string k = key(job_kind, entity, run_id);
    auto it = recs_.find(k);
    if (it != recs_.end()) return {false, it->second};
    guard::CompletionRecord rec{std::string(job_kind), std::string(entity),      std::string(run_id),
                                std::chrono::system_clock::now(), std::string(completed_by), std::string(result)};
    recs_.emplace(k, rec);
    return {true, rec};
  }
  std::optional<guard::CompletionRecord> find(std::string_view job_kind, std::string_view entity,
                                              std::string_view run_id) override {
    std::lock_guard lk(mu_);
    auto it = recs_.find(key(job_kind, entity, run_id));
    if (it == recs_.end()) return std::nullopt;
    return it->second;
  }
  std::size_t size() const {
    std::lock_guard lk(mu_);
    return recs_.size();
  }

 private:
  static std::string key(std::string_view a, std::string_view b, std::string_view c) {
    return std::string(a) + '\n' + std::string(b) + '\n' + std::string(c);
  }
  mutable std::mutex mu_;
  std::map<std::string, guard::CompletionRecord> recs_;
};

// The naive run keeps no completion records: a redelivered chunk runs again.
class NoRecords final : public guard::CompletionStore {
 public:
  guard::RecordOutcome record(std::string_view job_kind, std::string_view entity, std::string_view run_id,
                              std::string_view completed_by, std::string_view result) override {
    return {true, {std::string(job_kind), std::string(entity), std::string(run_id), std::chrono::system_clock::now(),
                   std::string(completed_by), std::string(result)}};
  }
  std::optional<guard::CompletionRecord> find(std::string_view, std::string_view, std::string_view) override {
    return std::nullopt;
  }
};

// Charge times: 1% of subscriptions take `slow`; the rest spread around a
// mean chosen so that the overall mean is 200 ms (before scaling).
struct Workload {
  std::vector<microseconds> cost;
  microseconds total{0};
  microseconds slow{0};
  Workload(int n, double scale) : cost(static_cast<std::size_t>(n)) {
    const double slow_ms = 8000 * scale;
    const double fast_mean_ms = (200.0 - 0.01 * 8000.0) / 0.99 * scale;
    slow = microseconds(static_cast<std::int64_t>(slow_ms * 1000));
    std::uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < n; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      double u = static_cast<double>(x % 10000) / 10000.0;  // [0, 1)
      microseconds c = (x >> 20) % 100 == 0 ? slow
                                            : microseconds(static_cast<std::int64_t>(fast_mean_ms * (0.5 + u) * 1000));
      cost[static_cast<std::size_t>(i)] = c;
      total += c;
    }
  }
};

struct Faults {
  int kill_chunk = -1;   // the worker abandons this chunk after charging it all
  int pause_chunk = -1;  // the worker freezes between a charge and its ledger write
  int pause_at = 0;      // ... at this subscription offset inside the chunk
  milliseconds pause{0};
};

struct RunConfig {
  bool guarded = false;
  std::string prefix;  // keys of this run
  std::string run_id;  // completion records and idempotency keys of this run
  std::string lock_class;
  milliseconds ttl{0};
  milliseconds min_left{0};
  milliseconds hard_timeout{0};
  milliseconds acquire_wait{0};
  StreamOptions stream;
};

// One configuration's run: its workers, its producer state and its provider.
class Run {
 public:
  Run(RunConfig cfg, const BillingDemoOptions& opts, const Workload& work, const Faults& faults,
      redis::ConnectionOptions conn, guard::CompletionStore* completions)
      : cfg_(std::move(cfg)),
        opts_(opts),
        work_(work),
        faults_(faults),
        conn_(std::move(conn)),
        provider_(opts.subscriptions),
        chunks_((opts.subscriptions + opts.chunk - 1) / opts.chunk),
        completions_(completions) {
    admin_ = std::make_unique<redis::Client>(conn_);
    producer_ = std::make_unique<StreamSource>(*admin_, cfg_.stream);
  }

  int chunks() const { return chunks_; }
  double done_fraction() const { return static_cast<double>(done_.load()) / chunks_; }
  bool finished() const { return done_.load() >= chunks_; }

  // Creates the group and adds every chunk not known to be done. At the start
  // that is all of them; after Redis lost the stream it is the guarded run's
  // chunks without a completion record, or the naive run's chunks it has not
  // seen acknowledged.
  void enqueue_missing() {
    producer_->ensure_group();
    for (int c = 0; c < chunks_; ++c) {
      if (is_done(c)) continue;
      producer_->add({{"chunk", std::to_string(c)}, {"period", kPeriod}});
    }
  }

  // Each worker is a separate "process": its own client, lock service,
  // lease scheduler and runner, so freezing one event loop (the pause fault)
  // stops only its renewals. Both runs work on job::StreamWorker; they differ
  // only in their lock class, records and effect.
  void start() {
    started_ = Clock::now();
    for (int w = 0; w < opts_.workers; ++w) {
      auto& p = procs_.emplace_back(std::make_unique<Proc>());
      p->client = std::make_unique<redis::Client>(conn_);
      p->leases = LeaseScheduler::create(LockService::create(*p->client, KeyBuilder(cfg_.prefix)));
      p->runner = std::make_unique<GuardedRunner>(p->leases, cfg_.guarded ? guarded_class() : naive_class(),
                                                  RunnerBackends{.completions = cfg_.guarded ? completions_ : &none_});
      WorkerOptions wo{.consumer = "w" + std::to_string(w), .id_field = "chunk", .run_field = "period"};
      wo.on_job = [this](const JobReport& r) { account(r); };
      JobEffect effect = [this, client = p->client.get()](WorkItem& item) {
        return cfg_.guarded ? guarded_chunk(item, *client) : naive_chunk(item);
      };
      p->worker = std::make_unique<StreamWorker>(*p->client, cfg_.stream, *p->runner, std::move(effect), wo);
    }
    for (auto& p : procs_) threads_.emplace_back([w = p->worker.get()] { w->run(); });
  }

  void stop_and_join() {
    for (auto& p : procs_) p->worker->stop();
    for (auto& t : threads_) t.join();
    threads_.clear();
    procs_.clear();
  }

  BillingRunResult result() {
    BillingRunResult r;
    provider_.fill(r);
    r.chunks_reclaimed = reclaimed_;
    r.chunks_skipped = skipped_;
    r.attempts_abandoned = abandoned_;
    r.dead_lettered = dead_;
    auto end = finished_at_.load();
    r.makespan_s = std::chrono::duration<double>((end == Clock::time_point{} ? Clock::now() : end) - started_).count();
    r.ideal_makespan_s = std::chrono::duration<double>(work_.total).count() / opts_.workers;
    return r;
  }

 private:
  // The guarded producer asks the completion records (durable: they outlive
  // the Redis restart); the naive one only knows what it saw acknowledged.
  bool is_done(int c) {
    if (cfg_.guarded) return completions_->find(cfg_.lock_class, resource(c), cfg_.run_id).has_value();
    std::lock_guard lk(mu_);
    return done_set_.count(c) > 0;
  }

  // Progress only: the completion records are the runner's.
  void mark_done(int c) {
    bool fresh;
    {
      std::lock_guard lk(mu_);
      fresh = done_set_.insert(c).second;
    }
    if (fresh && done_.fetch_add(1) + 1 == chunks_) finished_at_ = Clock::now();
  }

  static std::string resource(int c) { return "billing:chunk:" + std::to_string(c); }

  LockClass guarded_class() const {
    return LockClass{.name = cfg_.lock_class,
                     .key_pattern = "billing:chunk:{id}",
                     .consequence = Consequence::moderate,  // a charge is retryable under its idempotency key
                     .on_redis_down = RedisDownPolicy::fail_closed,
                     .ttl = cfg_.ttl,
                     .wait = cfg_.acquire_wait,
                     .long_running = true,  // the slowest chunks outlive a TTL: renew, with a hard timeout
                     .hard_timeout = cfg_.hard_timeout,
                     .fenced = true,  // the ledger checks the token
                     .min_time_left = cfg_.min_left,
                     .owner = "billing-demo",
                     .protects = "one charge per subscription per period, and its ledger entry"};
  }

  LockClass naive_class() const {
    return LockClass{.name = cfg_.lock_class,
                     .key_pattern = "billing:chunk:{id}",
                     .consequence = Consequence::low,  // a plain lock with a fixed TTL, nothing else
                     .ttl = cfg_.ttl,
                     .wait = cfg_.acquire_wait,
                     .owner = "billing-demo",
                     .protects = "nothing beyond the plain lock (the naive baseline)"};
  }

  // Per job, on the worker's event loop: progress and the counts the result
  // reports. The worker already acted on the message.
  void account(const JobReport& r) {
    if (r.job->reclaimed) ++reclaimed_;
    if (r.dead_lettered) ++dead_;
    if (!r.run) return;
    const Outcome o = r.run->outcome;
    if (r.decision.action == Action::ack && r.action_error.empty()) {
      if (o == Outcome::already_done) ++skipped_;
      mark_done(std::stoi(r.job->field("chunk")));
    } else if (o == Outcome::busy) {
      // A live holder still works on it: it stays pending.
    } else if (!(o == Outcome::failed && r.decision.action == Action::leave_pending)) {
      // Lost, stale, a backend down, a failed attempt, an ack Redis did not
      // take: restarted elsewhere. (A killed worker's job is left as it was.)
      ++abandoned_;
    }
    if (finished())
      for (auto& p : procs_) p->worker->stop();
  }

  std::pair<int, int> range(int c) const {
    int first = c * opts_.chunk;
    return {first, std::min(opts_.subscriptions, first + opts_.chunk)};
  }

  // Sleeps the charge's processing time against a running deadline, so
  // oversleeping one charge is made up by the next ones.
  void spend(Clock::time_point& deadline, int sub) {
    deadline = std::max(deadline, Clock::now() - milliseconds(5)) + work_.cost[static_cast<std::size_t>(sub)];
    std::this_thread::sleep_until(deadline);
  }

  bool first_time(std::atomic<bool>& flag) { return !flag.exchange(true); }

  // The guarded run is the runner's: claim (a fenced, renewing lease), the
  // effect (a charge per subscription under its idempotency key, each ledger
  // write fenced), the completion record; the demo only injects faults.
  std::string guarded_chunk(WorkItem& item, redis::Client& client) {
    JobContext& ctx = item.context();
    const int c = std::stoi(ctx.unit().id);
    const std::int64_t fence = *ctx.fence();
    auto [first, last] = range(c);
    auto deadline = Clock::now();
    for (int s = first; s < last; ++s) {
      ctx.ensure(cfg_.min_left);  // a lost lease stops before the next charge
      const std::string key = ctx.idempotency_key("sub:" + std::to_string(s));
      if (provider_.charge(s, &key)) spend(deadline, s);
      if (c == faults_.pause_chunk && s - first == faults_.pause_at && first_time(paused_)) {
        // The whole "process" stops (a GC pause, SIGSTOP, a VM migration):
        // this thread and the client's event loop, so nothing renews the
        // lease. Blocking the loop is the fault being injected.
        auto d = faults_.pause;
        boost::asio::post(client.get_executor(), [d] { std::this_thread::sleep_for(d); });
        std::this_thread::sleep_for(d);
      }
      if (!provider_.write_ledger(s, fence))
        throw Error(errc::stale_fence, fmt::format("ledger refused fence {} for subscription {}", fence, s));
    }
    if (c == faults_.kill_chunk && first_time(killed_)) killed(item);
    return std::string();
  }

  std::string naive_chunk(WorkItem& item) {
    const int c = std::stoi(item.context().unit().id);
    auto [first, last] = range(c);
    auto deadline = Clock::now();
    for (int s = first; s < last; ++s) {
      provider_.charge(s, nullptr);
      spend(deadline, s);
      if (c == faults_.pause_chunk && s - first == faults_.pause_at && first_time(paused_))
        std::this_thread::sleep_for(faults_.pause);
      provider_.write_ledger(s, std::nullopt);
    }
    if (c == faults_.kill_chunk && first_time(killed_)) killed(item);
    return std::string();
  }

  // Killed after the charges, before the completion record and the ack: no
  // record, no ack; the job comes back after XAUTOCLAIM's idle time (and a
  // guarded chunk's charges replay by their idempotency keys).
  [[noreturn]] static void killed(WorkItem& item) {
    item.leave_pending("worker killed (injected fault)");
    throw std::runtime_error("worker killed (injected fault)");
  }

  struct Proc {
    std::unique_ptr<redis::Client> client;
    std::shared_ptr<LeaseScheduler> leases;
    std::unique_ptr<GuardedRunner> runner;
    std::unique_ptr<StreamWorker> worker;
  };

  RunConfig cfg_;
  const BillingDemoOptions& opts_;
  const Workload& work_;
  const Faults& faults_;
  redis::ConnectionOptions conn_;
  BillingProvider provider_;
  const int chunks_;
  std::unique_ptr<redis::Client> admin_;
  std::unique_ptr<StreamSource> producer_;
  guard::CompletionStore* completions_;
  NoRecords none_;
  std::vector<std::unique_ptr<Proc>> procs_;
  std::mutex mu_;
  std::set<int> done_set_;
  std::atomic<int> done_{0};
  std::atomic<bool> killed_{false}, paused_{false};
  std::atomic<std::int64_t> reclaimed_{0}, skipped_{0}, abandoned_{0}, dead_{0};
  std::atomic<Clock::time_point> finished_at_{};
  Clock::time_point started_{};
  std::vector<std::thread> threads_;
};

observe::HistogramSnapshot minus(const observe::HistogramSnapshot& a, const observe::HistogramSnapshot& b) {
  observe::HistogramSnapshot d;
  for (std::size_t i = 0; i < d.cumulative.size(); ++i) d.cumulative[i] = a.cumulative[i] - b.cumulative[i];
  d.count = a.count - b.count;
  d.sum_seconds = a.sum_seconds - b.sum_seconds;
  return d;
}

milliseconds ms(microseconds us) { return duration_cast<milliseconds>(us); }

}  // namespace

BillingDemoResult run_billing_demo(const BillingDemoOptions& opts) {
  if (opts.redis_url.empty()) throw Error(errc::invalid_argument, "billing demo: empty Redis URL");
  if (opts.subscriptions < 1) throw Error(errc::invalid_argument, "billing demo: --subscriptions must be >= 1");
  if (opts.workers < 1 || opts.workers > 256)
    throw Error(errc::invalid_argument, "billing demo: --workers " + std::to_string(opts.workers) + " outside [1, 256]");
  if (!(opts.scale > 0 && opts.scale <= 10))
    throw Error(errc::invalid_argument, "billing demo: --scale " + std::to_string(opts.scale) + " outside (0, 10]");
  if (opts.chunk < 1) throw Error(errc::invalid_argument, "billing demo: chunk must be >= 1");

  const Workload work(opts.subscriptions, opts.scale);
  const microseconds chunk_mean(static_cast<std::int64_t>(200000 * opts.scale * opts.chunk));
  const double ideal_s = std::chrono::duration<double>(work.total).count() / opts.workers;

  // Reclaiming must wait well past a healthy chunk's duration; the guarded
  // lock outlives the slowest charge several times over between renewals.
  const milliseconds claim_idle = std::max(milliseconds(1500), ms(chunk_mean * 10));
  const milliseconds guarded_ttl = std::max(milliseconds(1000), ms(work.slow * 4));
  const milliseconds naive_ttl = std::max(milliseconds(10), milliseconds(static_cast<std::int64_t>(5000 * opts.scale)));

  const std::string tag = std::to_string(::getpid()) + "-" +
                          std::to_string(Clock::now().time_since_epoch().count() % 1000000007);
  auto stream_opts = [&](const std::string& prefix) {
    StreamOptions s;
    s.stream = prefix + ":jobs";
    s.group = "billing";
    s.block = milliseconds(100);
    s.claim_idle = claim_idle;
    s.max_attempts = 10;
    return s;
  };

  RunConfig g;
  g.guarded = true;
  g.prefix = "jgdemo-g-" + tag;
  g.run_id = std::string(kPeriod) + "/" + tag;
  g.lock_class = opts.lock_class;
  g.ttl = guarded_ttl;
  g.min_left = std::max(milliseconds(20), ms(work.slow * 2));
  g.hard_timeout = claim_idle * 3 + ms(chunk_mean * 4);
  g.acquire_wait = guarded_ttl + milliseconds(500);
  g.stream = stream_opts(g.prefix);

  RunConfig n;
  n.prefix = "jgdemo-n-" + tag;
  n.lock_class = opts.lock_class + "-naive";
  n.ttl = naive_ttl;
  n.acquire_wait = naive_ttl;
  n.stream = stream_opts(n.prefix);

  const int chunks = (opts.subscriptions + opts.chunk - 1) / opts.chunk;
  Faults faults;
  faults.kill_chunk = chunks / 5;
  faults.pause_chunk = std::min(chunks - 1, chunks / 3 + 1);
  faults.pause_at = std::min(opts.chunk, opts.subscriptions - faults.pause_chunk * opts.chunk) / 2;
  // Long enough for the job to be reclaimed, the old lock to expire, and the
  // new holder to finish the chunk before the paused worker writes.
  faults.pause = claim_idle + guarded_ttl + ms(chunk_mean * 3) + milliseconds(500);

  auto conn = redis::parse_url(opts.redis_url);
  // The demo's own locks are the only ones on its server: after the restart
  // it injects, grants wait out a quarantine of this long (docs/lock-safety.md).
  conn.lock_max_ttl = std::max(guarded_ttl, naive_ttl);
  auto& reg = observe::Registry::global();
  reg.lock_class(opts.lock_class);
  const auto before = *reg.snapshot(opts.lock_class);

  // Completion records: the caller's (PostgreSQL) when given, else an
  // in-process store standing in for it. Not Redis: a Redis-backed store
  // would be wiped by the very restart the demo injects.
  MemoryCompletionStore memory_store;
  guard::CompletionStore* store = opts.completions != nullptr ? opts.completions : &memory_store;

  Run guarded(g, opts, work, faults, conn, store);
  Run naive(n, opts, work, faults, conn, nullptr);
  guarded.enqueue_missing();
  naive.enqueue_missing();
  guarded.start();
  naive.start();

  const auto t0 = Clock::now();
  const auto restart_at = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(ideal_s * 0.5));
  const auto give_up = t0 + (opts.give_up.count() > 0
                                 ? Clock::duration(opts.give_up)
                                 : std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(ideal_s * 10 + 60)));
  bool restarted = false;
  while (!(guarded.finished() && naive.finished()) && Clock::now() < give_up) {
    std::this_thread::sleep_for(milliseconds(200));
    if (opts.progress) opts.progress(guarded.done_fraction(), naive.done_fraction());
    if (!restarted && opts.restartable && Clock::now() >= restart_at) {
      restarted = true;
      opts.restartable->restart();
      // The streams, groups, locks and fence counters are gone. Each producer
      // fills its stream again with what it does not know to be done.
      for (Run* r : {&guarded, &naive}) {
        for (int attempt = 0;; ++attempt) {
          try {
            r->enqueue_missing();
            break;
          } catch (const Error&) {
            if (attempt > 100) throw;
            std::this_thread::sleep_for(milliseconds(50));
          }
        }
      }
    }
  }
  if (opts.progress) opts.progress(guarded.done_fraction(), naive.done_fraction());
  guarded.stop_and_join();
  naive.stop_and_join();

  BillingDemoResult res;
  res.guarded = guarded.result();
  res.naive = naive.result();
  res.subscriptions = opts.subscriptions;
  res.workers = opts.workers;
  res.chunk = opts.chunk;
  res.scale = opts.scale;
  res.redis_restarted = restarted;
  const auto after = *reg.snapshot(opts.lock_class);
  res.acquisitions = after.acquisitions_total - before.acquisitions_total;
  res.contention = after.busy_total - before.busy_total;
  res.p99_hold_s = minus(after.hold_seconds, before.hold_seconds).quantile(0.99).value_or(0);
  res.leases_lost = after.leases_lost_total - before.leases_lost_total;
  res.renewals = after.renewals_total - before.renewals_total;
  res.redis_errors = after.redis_errors_total - before.redis_errors_total;
  return res;
}

}  // namespace jobguard::job
