// Maps libpqxx exceptions onto the one jobguard error story. Private to src/guard.
#pragma once

#include <chrono>
#include <exception>
#include <string_view>

namespace jobguard::guard::detail {

// Call from inside a catch block: rethrows the in-flight exception as a
// jobguard::Error. `doing` says what we were doing ("begin idempotency key
// \"k\""), so the one-line message names where it failed.
[[noreturn]] void rethrow_pg(std::string_view doing, std::chrono::milliseconds statement_timeout);

}  // namespace jobguard::guard::detail
