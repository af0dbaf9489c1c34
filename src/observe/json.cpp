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
          {"released_not_owner_total", c.released_not_owner_total},
          {"rate_limited_total", c.rate_limited_total},
          {"rate_limit_wait_seconds_total", static_cast<double>(c.rate_limit_wait_ms_total) / 1000},
          {"concurrency_limited_total", c.concurrency_limited_total},
          {"concurrency_limit_wait_seconds_total", static_cast<double>(c.concurrency_limit_wait_ms_total) / 1000}};
}

nlohmann::json to_json(const std::vector<LockClassSnapshot>& classes) {
  nlohmann::json by_class = nlohmann::json::object();
  for (const auto& c : classes) by_class[c.lock_class] = to_json(c);
  return {{"lock_classes", std::move(by_class)}};
}

nlohmann::json to_json(const Registry& registry) { return to_json(registry.snapshot()); }

nlohmann::ordered_json to_json(const FleetClassStats& c) {
  using J = nlohmann::ordered_json;
  const auto maybe = [](std::optional<double> v) { return v ? J(*v) : J(); };
  const auto& n = c.counts;
  return J{
      {"class", c.lock_class},
      {"acquisitions_per_second", c.acquisitions_per_second()},
      {"contention_ratio", maybe(c.contention_ratio())},
      {"hold_avg_seconds", maybe(c.hold_avg_seconds())},
      {"hold_p50_seconds", maybe(c.hold_quantile_seconds(0.5))},
      {"hold_p99_seconds", maybe(c.hold_quantile_seconds(0.99))},
      {"expired_per_minute", c.expired_per_minute()},
      {"attempts", n.attempts},
      {"acquisitions", n.acquisitions},
      {"contended", n.contended},
      {"busy", n.busy},
      {"releases", n.releases},
      {"released_not_owner", n.released_not_owner},
      {"leases_lost", n.leases_lost},
      {"expired", n.expired()},
      {"hold_count", n.hold_count()},
      {"hold_sum_seconds", static_cast<double>(n.hold_sum_ns) / 1e9},
      {"renewals", n.renewals},
      {"renewal_failures", n.renewal_failures},
      {"fail_open", n.fail_open},
      {"stale_writes_rejected", n.stale_writes_rejected},
      {"redis_errors", n.redis_errors},
      {"rate_limited", n.rate_limited},
      {"rate_limit_wait_seconds", static_cast<double>(n.rate_limit_wait_ms) / 1000},
      {"concurrency_limited", n.concurrency_limited},
      {"concurrency_limit_wait_seconds", static_cast<double>(n.concurrency_limit_wait_ms) / 1000},
  };
}

}  // namespace jobguard::observe
