// The lock Redis's deployment, as gauges for `jobguard serve`: a watcher
// thread around watch_redis (doctor.cpp) plus the Prometheus rendering; and
// that thread's loop, detail::Refresher, which FleetExporter shares. The
// alert rules in deploy/prometheus/jobguard-alerts.yml read these families;
// docs/alerts.md is their runbook.
#include <fmt/format.h>

#include <iterator>
#include <optional>

#include "jobguard/error.hpp"
#include "ops/refresher.hpp"
#include "jobguard/ops/doctor.hpp"
#include "jobguard/observe/exposition.hpp"

namespace jobguard::ops {
namespace {

using observe::escape_label_value;
using observe::format_value;

}  // namespace

std::string redis_facts_to_prometheus(const RedisFacts& f, std::uint64_t lock_state_losses) {
  std::string out;
  auto it = std::back_inserter(out);
  // Every family's HELP and TYPE is written even while Redis is down, so the
  // schema does not flicker; a sample that needs an answer is left out then
  // (an alert must not read a made-up 0 as "not evicting").
  auto family = [&](const char* name, const char* help, const char* type, bool have, double value) {
    observe::append_family_header(out, name, help, type);
    if (have) fmt::format_to(it, "{} {}\n", name, format_value(value));
  };
  auto flag = [](bool b) { return b ? 1.0 : 0.0; };
  auto num = [](std::int64_t n) { return static_cast<double>(n); };
  family("jobguard_redis_up", "1 when the last watch of the lock Redis got an answer to PING and INFO.", "gauge", true,
         flag(f.up));
  observe::append_family_header(
      out, "jobguard_redis_check_status",
      "jobguard doctor's read-only checks of the lock Redis: 0 OK, 1 WARN, 2 FAIL (docs/operations.md).", "gauge");
  for (const auto& c : f.checks)
    fmt::format_to(it, "jobguard_redis_check_status{{check=\"{}\"}} {}\n", escape_label_value(c.name),
                   static_cast<int>(c.status));
  family("jobguard_redis_evicting",
         "1 when the lock Redis may evict keys (maxmemory set with a policy other than noeviction).", "gauge", f.up,
         flag(f.evicting));
  family("jobguard_redis_evicted_keys_total", "Keys the lock Redis has evicted (INFO evicted_keys).", "counter", f.up,
         num(f.evicted_keys));
  family("jobguard_redis_persistent", "1 when the lock Redis persists its data (AOF, or RDB save points).", "gauge",
         f.up, flag(f.persistent));
  family("jobguard_redis_replicas_connected", "Replicas connected to the lock Redis.", "gauge", f.up,
         num(f.replicas_connected));
  family("jobguard_redis_replicas_healthy",
         "Connected replicas that are online with an acknowledgement younger than the doctor's replica lag limit.",
         "gauge", f.up, num(f.replicas_healthy));
  family("jobguard_redis_replicas_required",
         "Replica acknowledgements every grant waits for (the URL's replicas=; 0: off).", "gauge", f.up,
         num(f.replicas_required));
  family("jobguard_redis_lock_state_record", "1 when the lock Redis has its lock-state record (jobguard:epoch).",
         "gauge", f.lock_state_read, flag(f.lock_state_record));
  family("jobguard_redis_quarantine_seconds",
         "Seconds until the lock Redis grants locks again after it lost lock state; 0 while it grants.", "gauge",
         f.lock_state_read, static_cast<double>(f.quarantine_left.count()) / 1000.0);
  family("jobguard_redis_clock_steps_total",
         "Forward steps of the lock Redis's clock that lock clients found (each expired held locks early and "
         "quarantined the server), from its lock-state record.",
         "counter", f.up, num(f.clock_steps));
  family("jobguard_redis_lock_state_losses_total",
         "Times this serve saw the lock-state record change epoch or vanish: the server lost lock state.", "counter",
         true, static_cast<double>(lock_state_losses));
  return out;
}

struct RedisWatcher::Impl {
  Impl(redis::Client& c, RedisWatcherOptions o) : client(c), opts(std::move(o)) {
    if (opts.refresh.count() <= 0) throw Error(errc::invalid_argument, "redis watcher: refresh must be positive");
    refresher.emplace(redis_facts_to_prometheus({}, 0), opts.refresh, opts.first_read_wait, [this] { return watch_once(); });
  }

  redis::Client& client;
  RedisWatcherOptions opts;
  // Watcher thread only: the last record seen, to count its changes.
  bool seen_record = false;
  std::string last_epoch;
  std::uint64_t losses = 0;

  std::string watch_once() {
    RedisFacts f;
    try {
      f = watch_redis(client, opts.doctor);
    } catch (const std::exception& e) {
      f.up = false;
      f.checks.push_back({"connection", CheckStatus::fail, e.what(), {}});
    }
    if (f.lock_state_read) {
      // A record that vanished or names another epoch: the server lost lock
      // state since the last watch (a new record written by the next
      // client's check counts once, with the vanishing).
      if (seen_record && (!f.lock_state_record || f.lock_state_epoch != last_epoch)) ++losses;
      seen_record = f.lock_state_record;
      last_epoch = f.lock_state_epoch;
      if (!seen_record) last_epoch.clear();
    }
    return redis_facts_to_prometheus(f, losses);
  }

  // Last, and started once the options are checked: its thread calls
  // watch_once, which uses everything above.
  std::optional<detail::Refresher> refresher;
};

RedisWatcher::RedisWatcher(redis::Client& client, RedisWatcherOptions options)
    : impl_(std::make_unique<Impl>(client, std::move(options))) {}

RedisWatcher::~RedisWatcher() = default;

std::string RedisWatcher::text() const { return impl_->refresher->text(); }

// --- detail::Refresher ------------------------------------------------------

namespace detail {

Refresher::Refresher(std::string initial, std::chrono::milliseconds refresh, std::chrono::milliseconds first_wait,
                     std::function<std::string()> render)
    : refresh_(refresh), first_wait_(first_wait), render_(std::move(render)), text_(std::move(initial)) {
  thread_ = std::thread([this] { loop(); });
}

Refresher::~Refresher() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Refresher::loop() {
  std::unique_lock<std::mutex> g(mu_);
  while (!stopping_) {
    g.unlock();
    std::string t = render_();
    g.lock();
    text_ = std::move(t);
    first_done_ = true;
    cv_.notify_all();
    cv_.wait_for(g, refresh_, [this] { return stopping_; });
  }
}

std::string Refresher::text() const {
  std::unique_lock<std::mutex> g(mu_);
  cv_.wait_for(g, first_wait_, [this] { return first_done_; });
  return text_;
}

}  // namespace detail

}  // namespace jobguard::ops
