// What the doctor's files share (doctor.cpp, doctor_lock_state.cpp,
// doctor_pg.cpp): the findings' constructors and INFO's text.
#pragma once

#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "jobguard/ops/doctor.hpp"

namespace jobguard::ops::checks {

using Info = std::map<std::string, std::string>;

inline CheckResult ok(std::string name, std::string detail) {
  return {std::move(name), CheckStatus::ok, std::move(detail), {}};
}
inline CheckResult warn(std::string name, std::string detail, std::string advice) {
  return {std::move(name), CheckStatus::warn, std::move(detail), std::move(advice)};
}
inline CheckResult fail(std::string name, std::string detail, std::string advice) {
  return {std::move(name), CheckStatus::fail, std::move(detail), std::move(advice)};
}

// INFO's "field:value" lines (sections and comments skipped).
Info parse_info(const std::string& text);

inline std::string get(const Info& i, const std::string& k) {
  auto it = i.find(k);
  return it == i.end() ? std::string() : it->second;
}

inline std::int64_t to_i64(std::string_view s, std::int64_t dflt = 0) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() ? v : dflt;
}

// A replica's lag in seconds from the `lag` field of INFO's slaveN line; -1
// when the field is missing or not a number (unknown: not healthy). Redis
// takes it as time(NULL) minus the cached time of the replica's last ACK, and
// time() reads the kernel's coarse clock, which can still show the previous
// second just after the cache has moved on: a replica that acknowledged a
// moment ago then reads lag=-1. That is an acknowledgement now, 0.
inline std::int64_t replica_lag(std::string_view field) {
  constexpr std::int64_t unknown = std::numeric_limits<std::int64_t>::min();
  const auto v = to_i64(field, unknown);
  if (v == unknown) return -1;
  return v < 0 ? 0 : v;
}

inline std::string ms_text(double ms) {
  return ms < 10 ? fmt::format("{:.2f} ms", ms) : fmt::format("{:.0f} ms", ms);
}

}  // namespace jobguard::ops::checks
