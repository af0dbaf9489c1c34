#include "jobguard/observe/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>

namespace jobguard::observe {

std::optional<double> HistogramSnapshot::quantile(double q) const {
  if (count == 0 || std::isnan(q)) return std::nullopt;
  q = std::clamp(q, 0.0, 1.0);
  const double rank = q * static_cast<double>(count);
  std::size_t b = 0;
  while (b < cumulative.size() && static_cast<double>(cumulative[b]) < rank) ++b;
  if (b >= kSecondsBuckets.size()) return kSecondsBuckets.back();
  const double lower = b == 0 ? 0.0 : kSecondsBuckets[b - 1];
  const double upper = kSecondsBuckets[b];
  const std::uint64_t below = b == 0 ? 0 : cumulative[b - 1];
  const std::uint64_t in_bucket = cumulative[b] - below;
  if (in_bucket == 0) return upper;
  return lower + (upper - lower) * ((rank - static_cast<double>(below)) / static_cast<double>(in_bucket));
}

std::size_t Histogram::bucket_index(double seconds) noexcept {
  if (!(seconds >= 0)) seconds = 0;  // negative or NaN: a clock hiccup, count it as instant
  // Bucket i holds values <= bound i (Prometheus "le"), hence lower_bound.
  return static_cast<std::size_t>(std::lower_bound(kSecondsBuckets.begin(), kSecondsBuckets.end(), seconds) -
                                  kSecondsBuckets.begin());
}

void Histogram::observe(std::chrono::nanoseconds d) noexcept {
  const std::int64_t ns = std::max<std::int64_t>(d.count(), 0);
  buckets_[bucket_index(static_cast<double>(ns) / 1e9)].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_relaxed);
}

void Histogram::observe_seconds(double seconds) noexcept {
  if (!(seconds >= 0)) seconds = 0;
  // Cap so a bogus huge value cannot overflow the integer sum (about 31 years).
  const double ns = std::min(seconds * 1e9, 1e18);
  buckets_[bucket_index(seconds)].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<std::uint64_t>(std::llround(ns)), std::memory_order_relaxed);
}

HistogramSnapshot Histogram::snapshot() const noexcept {
  HistogramSnapshot s;
  std::uint64_t running = 0;
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  // count is derived from the buckets (not a separate atomic) so _count always
  // equals the +Inf bucket in one scrape, as Prometheus requires; only the sum
  // may be a few observations ahead or behind under concurrent writes.
  s.count = running;
  s.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  return s;
}

Registry::Registry(RegistryOptions options) : options_(options) {}
Registry::~Registry() = default;

Registry& Registry::global() {
  // Leaked on purpose: metrics may be touched from threads and static
  // destructors that run after a function-local static would be destroyed.
  static Registry* r = new Registry();
  return *r;
}

LockClassMetrics& Registry::lock_class(std::string_view name) {
  {
    std::shared_lock lock(mu_);
    if (auto it = classes_.find(name); it != classes_.end()) return *it->second;
  }
  std::unique_lock lock(mu_);
  if (auto it = classes_.find(name); it != classes_.end()) return *it->second;
  // Count real classes only: the overflow bucket itself does not use up the cap.
  const std::size_t real = classes_.size() - (classes_.count(kOverflowClass) ? 1 : 0);
  if (real >= options_.max_classes && name != kOverflowClass) {
    auto& slot = classes_[std::string(kOverflowClass)];
    if (!slot) slot = std::make_unique<LockClassMetrics>();
    return *slot;
  }
  auto& slot = classes_[std::string(name)];
  slot = std::make_unique<LockClassMetrics>();
  return *slot;
}

namespace {
LockClassSnapshot copy(const std::string& name, const LockClassMetrics& m) {
  LockClassSnapshot s;
  s.lock_class = name;
  s.acquisitions_total = m.acquisitions_total.value();
  s.busy_total = m.busy_total.value();
  s.contended_total = m.contended_total.value();
  s.wait_seconds = m.wait_seconds.snapshot();
  s.hold_seconds = m.hold_seconds.snapshot();
  s.renewals_total = m.renewals_total.value();
  s.renewal_failures_total = m.renewal_failures_total.value();
  s.leases_lost_total = m.leases_lost_total.value();
  s.fail_open_total = m.fail_open_total.value();
  s.stale_writes_rejected_total = m.stale_writes_rejected_total.value();
  s.redis_errors_total = m.redis_errors_total.value();
  s.releases_total = m.releases_total.value();
  s.released_not_owner_total = m.released_not_owner_total.value();
  s.rate_limited_total = m.rate_limited_total.value();
  s.rate_limit_wait_ms_total = m.rate_limit_wait_ms_total.value();
  s.concurrency_limited_total = m.concurrency_limited_total.value();
  s.concurrency_limit_wait_ms_total = m.concurrency_limit_wait_ms_total.value();
  return s;
}
}  // namespace

std::vector<LockClassSnapshot> Registry::snapshot() const {
  std::shared_lock lock(mu_);
  std::vector<LockClassSnapshot> out;
  out.reserve(classes_.size());
  for (const auto& [name, m] : classes_) out.push_back(copy(name, *m));
  return out;
}

std::optional<LockClassSnapshot> Registry::snapshot(std::string_view name) const {
  std::shared_lock lock(mu_);
  auto it = classes_.find(name);
  if (it == classes_.end()) return std::nullopt;
  return copy(it->first, *it->second);
}

}  // namespace jobguard::observe
