// What a completion record's identity must have, for the Redis store (guard)
// and the PostgreSQL store (pg) alike, so both refuse the same input. A
// contract between the library's parts (include/jobguard/detail/), not an
// application API.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

namespace jobguard::guard::detail {

inline std::chrono::system_clock::time_point from_ms(std::int64_t ms) {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
}

// Throws Error(invalid_argument) naming the parts when a job kind, an entity
// or a run id is empty.
void check_parts(std::string_view kind, std::string_view entity, std::string_view run_id);

}  // namespace jobguard::guard::detail
