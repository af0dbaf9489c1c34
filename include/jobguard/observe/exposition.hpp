// Renders lock metrics as Prometheus text exposition format 0.0.4, the body
// of GET /metrics. Pure functions of a snapshot: no I/O, callable from any
// thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "jobguard/observe/metrics.hpp"

namespace jobguard::observe {

// Content-Type of the text produced here.
inline constexpr std::string_view kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

// Every metric family, with HELP and TYPE lines even when no class has been
// used yet, so a scraper sees the full schema from the first scrape. Classes
// appear in name order; a family's samples are contiguous, as the format
// requires. Also emits jobguard_build_info{version="..."} 1.
std::string to_prometheus(const std::vector<LockClassSnapshot>& classes);
std::string to_prometheus(const Registry& registry);

// Label value escaping of the text format: backslash, double quote and line
// feed become \\, \" and \n.
std::string escape_label_value(std::string_view v);
// HELP text escaping: backslash and line feed only.
std::string escape_help(std::string_view v);
// A family's "# HELP" (escaped) and "# TYPE" lines, appended to `out`.
void append_family_header(std::string& out, std::string_view name, std::string_view help, std::string_view type);
// A sample value as the format wants it: shortest round-trip decimal, +Inf,
// -Inf, NaN.
std::string format_value(double v);

}  // namespace jobguard::observe
