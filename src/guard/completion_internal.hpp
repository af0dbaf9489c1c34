// Checks shared by the Redis and PostgreSQL completion stores. Private to src/guard.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <string_view>

#include "jobguard/error.hpp"

namespace jobguard::guard::detail {

inline std::chrono::system_clock::time_point from_ms(std::int64_t ms) {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
}

inline void check_parts(std::string_view kind, std::string_view entity, std::string_view run_id) {
  if (kind.empty() || entity.empty() || run_id.empty())
    throw Error(errc::invalid_argument,
                fmt::format("completion record needs a job kind, an entity and a run id (got \"{}\", \"{}\", \"{}\")",
                            kind, entity, run_id));
}

}  // namespace jobguard::guard::detail
