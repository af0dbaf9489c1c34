// Shared by inspect.cpp, admin.cpp and trust.cpp: the snapshot script and its
// decoder, and the escaping of a key prefix for SCAN MATCH.
#pragma once

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
}  // namespace jobguard::detail
