#include "jobguard/observe/json.hpp"

namespace jobguard::observe {

namespace {
nlohmann::json opt(std::optional<double> v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }
}  // namespace

nlohmann::json to_json(const HistogramSnapshot& h) {
  nlohmann::json buckets = nlohmann::json::array();
  for (std::size_t i = 0; i < kSecondsBuckets.size(); ++i)
    buckets.push_back({{"le", kSecondsBuckets[i]}, {"count", h.cumulative[i]}});
  // JSON has no infinity; "+Inf" is the spelling Prometheus uses for the label.
  buckets.push_back({{"le", "+Inf"}, {"count", h.count}});
  return {{"count", h.count},
          {"sum_seconds", h.sum_seconds},
          {"p50_seconds", opt(h.quantile(0.5))},
          {"p99_seconds", opt(h.quantile(0.99))},
          {"buckets", std::move(buckets)}};
}

nlohmann::json to_json(const LockClassSnapshot& c) {
  return {{"acquisitions_total", c.acquisitions_total},
          {"busy_total", c.busy_total},
          {"wait_seconds", to_json(c.wait_seconds)},
          {"hold_seconds", to_json(c.hold_seconds)},
          {"renewals_total", c.renewals_total},
          {"renewal_failures_total", c.renewal_failures_total},
          {"leases_lost_total", c.leases_lost_total},
          {"fail_open_total", c.fail_open_total},
          {"stale_writes_rejected_total", c.stale_writes_rejected_total},
          {"redis_errors_total", c.redis_errors_total},
          {"releases_total", c.releases_total},
          {"released_not_owner_total", c.released_not_owner_total}};
}

nlohmann::json to_json(const std::vector<LockClassSnapshot>& classes) {
  nlohmann::json by_class = nlohmann::json::object();
  for (const auto& c : classes) by_class[c.lock_class] = to_json(c);
  return {{"lock_classes", std::move(by_class)}};
}

nlohmann::json to_json(const Registry& registry) { return to_json(registry.snapshot()); }

}  // namespace jobguard::observe
