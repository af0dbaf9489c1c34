// guard's Lua sources (src/guard/scripts/*.lua, embedded at build time), as
// pieces a script of a part above guard is composed from (the guarded
// runner's one-call claim and finish), so the formats of the idempotency key
// and the completion record are written once. Shared by the library's parts
// (include/jobguard/detail/, not installed), not an application API.
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
