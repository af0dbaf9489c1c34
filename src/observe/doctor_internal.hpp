// What the doctor's Redis checks (doctor.cpp) and its PostgreSQL checks
// (doctor_pg.cpp, only in a build with PostgreSQL) share. Both are compiled
// into jobguard::job (see CMakeLists.txt), so this is included by its path
// beside them, not through a part's private include directory.
#pragma once

#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

#include "jobguard/observe/doctor.hpp"

namespace jobguard::observe {
namespace {

inline CheckResult ok(std::string name, std::string detail) {
  return {std::move(name), CheckStatus::ok, std::move(detail), {}};
}
inline CheckResult warn(std::string name, std::string detail, std::string advice) {
  return {std::move(name), CheckStatus::warn, std::move(detail), std::move(advice)};
}
inline CheckResult fail(std::string name, std::string detail, std::string advice) {
  return {std::move(name), CheckStatus::fail, std::move(detail), std::move(advice)};
}

inline std::int64_t to_i64(std::string_view s, std::int64_t dflt = 0) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() ? v : dflt;
}

inline std::string ms_text(double ms) {
  return ms < 10 ? fmt::format("{:.2f} ms", ms) : fmt::format("{:.0f} ms", ms);
}

}  // namespace
}  // namespace jobguard::observe
