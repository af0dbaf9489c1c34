// Shared by inspect.cpp, admin.cpp, trust.cpp and the semaphore's and rw
// lock's inspects: the snapshot script and its decoder, the escaping of a key
// prefix for SCAN MATCH, and the integer a script returns as either type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "jobguard/lock.hpp"
#include "jobguard/redis/reply.hpp"
#include "jobguard/redis/script.hpp"

namespace jobguard::detail {
// KEYS: lock, fence, queue.
const redis::Script& inspect_script();
// Throws Error(protocol_error) on a reply of the wrong shape.
LockInfo decode_inspect(std::string resource, std::string key, const redis::Reply& r);
// SCAN MATCH is a glob: a prefix holding '*', '?', '[', ']' or '\\' must match
// those bytes literally.
std::string glob_escape(std::string_view s);
// An integer reply, or a string holding exactly an integer (a Lua number read
// back from a key); nullopt for anything else.
std::optional<std::int64_t> reply_int(const redis::Reply& r);
}  // namespace jobguard::detail
