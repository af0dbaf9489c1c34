// The embedded Lua sources (generated from scripts/*.lua) and their Script
// objects, built once. Private to src/guard.
#pragma once

#include <string_view>

#include "jobguard/redis/script.hpp"

namespace jobguard::guard::scripts {
extern const std::string_view completion_record;
extern const std::string_view idempotency_begin;
extern const std::string_view idempotency_complete;
extern const std::string_view idempotency_abandon;
}  // namespace jobguard::guard::scripts
