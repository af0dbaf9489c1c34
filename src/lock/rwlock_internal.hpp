// The read-write lock's scripts, for the waiter (waiter_shell.cpp) and the service.
#pragma once

namespace jobguard {
namespace redis {
class Script;
}
namespace detail {
const redis::Script& rw_acquire_script();
const redis::Script& rw_release_script();
}  // namespace detail
}  // namespace jobguard
