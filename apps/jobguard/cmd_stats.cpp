// `jobguard stats [--window 1m|5m|15m|60m] [--class C]`: the fleet's four
// numbers per lock class, as every jobguard process published them to Redis
// (observe/fleet.hpp).
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli.hpp"
#include "jobguard/error.hpp"
#include "jobguard/observe/fleet.hpp"
#include "jobguard/observe/json.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/options.hpp"

namespace jobguard::cli {
namespace {

struct StatsArgs {
  std::string window = "5m";
  std::string lock_class;
  std::string prefix = "jobguard";
};

std::string ms_text(std::optional<double> seconds) {
  if (!seconds) return "-";
  const double ms = *seconds * 1000;
  return ms >= 100 ? fmt::format("{:.0f}ms", ms) : fmt::format("{:.2f}ms", ms);
}

int stats(const Globals& g, const StatsArgs& a) {
  const auto window = observe::parse_window(a.window);  // invalid_argument -> 64
  observe::FleetKeys check(a.prefix);                   // validates --key-prefix before any network call
  auto conn = redis::parse_url(g.redis_url);
  if (conn.client_name.empty()) conn.client_name = "jobguard-stats";
  redis::Client client(conn);
  observe::FleetReaderOptions ro;
  ro.prefix = a.prefix;
  observe::FleetSnapshot snap;
  try {
    snap = observe::FleetReader(client, ro).read(window);
  } catch (const Error& e) {
    // A refusal (NOPERM, WRONGTYPE) keeps its code: no later try mends it.
    if (e.next() != next_step::retry_call) throw;
    throw Error(errc::redis_unavailable,
                fmt::format("cannot read the fleet's numbers from {}: {}", redis::to_display_url(conn), e.what()));
  }
  std::erase_if(snap.classes, [&](const auto& c) { return !a.lock_class.empty() && c.lock_class != a.lock_class; });

  if (g.json) {
    nlohmann::ordered_json out;
    out["window"] = a.window;
    out["span_seconds"] = snap.span_seconds;
    out["as_of_unix"] = std::chrono::duration<double>(snap.as_of.time_since_epoch()).count();
    out["classes"] = nlohmann::ordered_json::array();
    for (const auto& c : snap.classes) out["classes"].push_back(observe::to_json(c));
    std::fputs((out.dump() + "\n").c_str(), stdout);
    return exit_code::ok;
  }

  std::string text = fmt::format("fleet lock numbers, last {} ({:.0f} s of buckets), {}\n", a.window,
                                 snap.span_seconds, redis::to_display_url(conn));
  if (snap.classes.empty()) {
    text += "no lock class published numbers in this window\n";
  } else {
    text += fmt::format("{:<24} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}\n", "CLASS", "ACQ/S", "CONTENDED",
                        "HOLD P50", "HOLD P99", "HOLD AVG", "EXPIRED/MIN");
    for (const auto& c : snap.classes) {
      const auto r = c.contention_ratio();
      text += fmt::format("{:<24} {:>10.3f} {:>10} {:>10} {:>10} {:>10} {:>12.2f}\n", c.lock_class,
                          c.acquisitions_per_second(), r ? fmt::format("{:.1f}%", *r * 100) : std::string("-"),
                          ms_text(c.hold_quantile_seconds(0.5)), ms_text(c.hold_quantile_seconds(0.99)),
                          ms_text(c.hold_avg_seconds()), c.expired_per_minute());
    }
  }
  std::fputs(text.c_str(), stdout);
  return exit_code::ok;
}

}  // namespace

void add_stats(CLI::App& root, Globals& g, Commands& out) {
  auto* sub = root.add_subcommand("stats", "Print the fleet's lock numbers per class (as published to Redis)");
  auto a = std::make_shared<StatsArgs>();
  sub->add_option("--window", a->window, "1m, 5m, 15m or 60m")->capture_default_str();
  sub->add_option("--class", a->lock_class, "Only this lock class");
  add_key_prefix(*sub, a->prefix, "Key prefix the processes use", "--prefix");
  sub->footer(exit_status_help(
      "Per class: acquisitions/s, contention (share of acquire calls that met a busy answer), hold time p50/p99/avg "
      "(from the merged histograms), expired locks per minute (leases lost + releases that found the key gone or "
      "taken). See docs/observability.md.\n"
      "Exit status: 0 ok."));
  out.emplace_back(sub, [&g, a] { return stats(g, *a); });
}

}  // namespace jobguard::cli
