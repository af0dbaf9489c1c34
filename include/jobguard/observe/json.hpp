// The same numbers as /metrics, as JSON for `--json` outputs and GET
// /metrics.json. Separate from exposition.hpp so only the
// code that wants nlohmann::json pulls it in.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "jobguard/observe/fleet.hpp"
#include "jobguard/observe/metrics.hpp"

namespace jobguard::observe {

// {"count": n, "sum_seconds": s, "p50_seconds": x|null, "p99_seconds": x|null,
//  "buckets": [{"le": 0.0001, "count": cumulative}, ..., {"le": "+Inf", ...}]}
nlohmann::json to_json(const HistogramSnapshot& h);

// {"acquisitions_total": n, ..., "wait_seconds": {histogram}, "hold_seconds": {...}}
nlohmann::json to_json(const LockClassSnapshot& c);

// {"lock_classes": {"billing": {...}, ...}}
nlohmann::json to_json(const std::vector<LockClassSnapshot>& classes);
nlohmann::json to_json(const Registry& registry);

// One class of the fleet's numbers over a window, as `jobguard stats --json`
// and the dashboard's /api/classes show it: {"class", the four numbers
// ("acquisitions_per_second", "contention_ratio", "hold_p50_seconds",
// "hold_p99_seconds", "expired_per_minute"; null where undefined),
// "hold_avg_seconds", then every count}.
nlohmann::ordered_json to_json(const FleetClassStats& c);

}  // namespace jobguard::observe
