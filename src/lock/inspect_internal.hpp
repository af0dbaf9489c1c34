// Shared by inspect.cpp and admin.cpp: the snapshot script and its decoder.
#pragma once

#include <string>

#include "jobguard/lock.hpp"
#include "jobguard/redis/reply.hpp"
#include "jobguard/redis/script.hpp"

namespace jobguard::detail {
// KEYS: lock, fence, queue.
const redis::Script& inspect_script();
// Throws Error(protocol_error) on a reply of the wrong shape.
LockInfo decode_inspect(std::string resource, std::string key, const redis::Reply& r);
}  // namespace jobguard::detail
