// The embedded Lua sources (generated from scripts/*.lua) and their Script
// objects, built once. Private to src/guard.
#pragma once

#include <string>
#include <string_view>

#include "jobguard/redis/script.hpp"

namespace jobguard::guard::scripts {
extern const std::string_view stored;
extern const std::string_view completion_record;
extern const std::string_view idempotency_begin;
extern const std::string_view idempotency_complete;
extern const std::string_view idempotency_abandon;

// `body` after stored.lua, the one reader and writer of the idempotency key's
// and the completion record's format: every script that touches either is
// built so (a composed script once, before its functions).
inline std::string with_stored_format(std::string_view body) { return std::string(stored) + std::string(body); }
}  // namespace jobguard::guard::scripts
