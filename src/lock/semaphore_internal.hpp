// The semaphore's scripts, for the waiter (lock.cpp) and the service.
#pragma once

#include <string>

namespace jobguard {
namespace redis {
class Script;
}
namespace detail {
const redis::Script& sem_acquire_script();
const redis::Script& sem_release_script();
const redis::Script& sem_extend_script();
// The holders' zset member of a permit: "<token> <slot>".
inline std::string permit_member(const std::string& token, int slot) {
  std::string m;
  m.reserve(token.size() + 8);
  m.append(token).append(1, ' ').append(std::to_string(slot));
  return m;
}
}  // namespace detail
}  // namespace jobguard
