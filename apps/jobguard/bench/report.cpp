// What `jobguard bench` prints: the phases and the contention run as JSON,
// and the contention run as text.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "harness.hpp"

namespace jobguard::bench {

nlohmann::json summarize(const Phase& p) {
  auto lat = p.latencies_us;
  std::sort(lat.begin(), lat.end());
  auto q = [&](double f) -> double {
    if (lat.empty()) return 0;
    return lat[std::min(lat.size() - 1, static_cast<std::size_t>(f * static_cast<double>(lat.size())))];
  };
  return {{"ops", p.ops},
          {"errors", p.errors},
          {"seconds", p.elapsed_s},
          {"ops_per_s", p.elapsed_s > 0 ? static_cast<double>(p.ops) / p.elapsed_s : 0.0},
          {"p50_us", q(0.50)},
          {"p99_us", q(0.99)},
          {"writes", p.writes},
          {"commands_per_write", p.writes ? static_cast<double>(p.commands) / static_cast<double>(p.writes) : 0.0}};
}

double quantile(std::vector<float> v, double f) {
  if (v.empty()) return 0;
  const auto i = std::min(v.size() - 1, static_cast<std::size_t>(f * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

namespace {
double round_to(double v, int digits) {
  const double m = std::pow(10.0, digits);
  return std::round(v * m) / m;
}
}  // namespace

// Same quantities as bench/peers/contention.js, so the two can sit side by side.
nlohmann::json summarize(const ContentionConfig& c, const ContentionResult& r) {
  std::uint64_t total = 0, errors = 0;
  std::vector<float> waits;
  double longest = 0;
  for (const auto& w : r.workers) {
    total += w.count;
    errors += w.errors;
    waits.insert(waits.end(), w.waits_us.begin(), w.waits_us.end());
    longest = std::max(longest, w.longest_wait_us);
  }
  const double mean = static_cast<double>(total) / static_cast<double>(r.workers.size());
  double dev = 0;
  nlohmann::json shares = nlohmann::json::array(), counts = nlohmann::json::array(), per = nlohmann::json::array();
  for (std::size_t i = 0; i < r.workers.size(); ++i) {
    const auto& w = r.workers[i];
    const double share = total ? static_cast<double>(w.count) / static_cast<double>(total) : 0.0;
    if (mean > 0) dev = std::max(dev, std::abs(static_cast<double>(w.count) - mean) / mean);
    shares.push_back(round_to(share, 4));
    counts.push_back(w.count);
    per.push_back({{"worker", i},
                   {"count", w.count},
                   {"share", round_to(share, 4)},
                   {"wait_p50_ms", round_to(quantile(w.waits_us, 0.50) / 1000, 3)},
                   {"wait_p99_ms", round_to(quantile(w.waits_us, 0.99) / 1000, 3)},
                   {"wait_max_ms", round_to(w.longest_wait_us / 1000, 3)},
                   {"errors", w.errors}});
  }
  const double secs = c.seconds.count();
  const auto handoffs = r.handoffs_us.size();
  return {{"workers", c.workers},
          {"fair", c.fair},
          {"seconds", secs},
          {"hold_us", c.hold.count()},
          {"resource", c.resource},
          {"critical_sections", total},
          {"cs_per_s", round_to(static_cast<double>(total) / secs, 1)},
          {"shares", shares},
          {"counts", counts},
          {"max_share_deviation_pct", total ? round_to(dev * 100, 2) : 0.0},
          {"handoffs", handoffs},
          {"handoff_p50_us", round_to(quantile(r.handoffs_us, 0.50), 1)},
          {"handoff_p99_us", round_to(quantile(r.handoffs_us, 0.99), 1)},
          {"handoff_to_other_p50_us", round_to(quantile(r.other_handoffs_us, 0.50), 1)},
          {"handoff_to_other_p99_us", round_to(quantile(r.other_handoffs_us, 0.99), 1)},
          {"self_handoff_pct",
           handoffs ? round_to(100.0 * static_cast<double>(r.self_handoffs) / static_cast<double>(handoffs), 2) : 0.0},
          {"wait_p50_ms", round_to(quantile(waits, 0.50) / 1000, 3)},
          {"wait_p99_ms", round_to(quantile(waits, 0.99) / 1000, 3)},
          {"wait_max_ms", round_to(longest / 1000, 3)},
          {"per_worker", per},
          {"overlaps", r.overlaps},
          {"errors", errors}};
}

std::string contention_text(const ContentionConfig& cfg, const nlohmann::json& j, const std::string& where) {
  std::string out;
  out += fmt::format(
      "jobguard bench --contention{}: {} workers on one key ({}), hold {} us, {:.1f} s, {}\n"
      "  {:.0f} critical sections/s; handoff p50 {:.0f} us p99 {:.0f} us (to another worker p50 {:.0f} p99 {:.0f} us); "
      "back to the releaser {:.1f}%\n"
      "  wait p50 {:.3f} ms p99 {:.3f} ms max {:.3f} ms; max share deviation {:.1f}% of the mean; overlaps {}, errors {}\n",
      cfg.fair ? " --fair" : "", cfg.workers, cfg.resource, cfg.hold.count(), cfg.seconds.count(),
      where, j["cs_per_s"].get<double>(), j["handoff_p50_us"].get<double>(),
      j["handoff_p99_us"].get<double>(), j["handoff_to_other_p50_us"].get<double>(),
      j["handoff_to_other_p99_us"].get<double>(), j["self_handoff_pct"].get<double>(), j["wait_p50_ms"].get<double>(),
      j["wait_p99_ms"].get<double>(), j["wait_max_ms"].get<double>(), j["max_share_deviation_pct"].get<double>(),
      j["overlaps"].get<std::uint64_t>(), j["errors"].get<std::uint64_t>());
  for (const auto& p : j["per_worker"])
    out += fmt::format("  worker {}: {} (share {:.3f}), wait p50 {:.3f} ms p99 {:.3f} ms max {:.3f} ms\n",
                             p["worker"].get<std::size_t>(), p["count"].get<std::uint64_t>(), p["share"].get<double>(),
                             p["wait_p50_ms"].get<double>(), p["wait_p99_ms"].get<double>(),
                             p["wait_max_ms"].get<double>());
  return out;
}

}  // namespace jobguard::bench
