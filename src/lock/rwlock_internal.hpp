// The read-write lock's scripts, for the coalesced calls (semaphore.cpp).
#pragma once

namespace jobguard {
namespace redis {
class Script;
}
namespace detail {
const redis::Script& rw_acquire_script();
const redis::Script& rw_release_script();
// A waiter's leave of the line: its three entries in one step (rw_leave.lua).
const redis::Script& rw_leave_script();
}  // namespace detail
}  // namespace jobguard
