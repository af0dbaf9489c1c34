// Durations as people write them on a command line or in a policy file:
// "250ms", "30s", "5m", "1h", "1500us", combined forms like "1m30s".
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace jobguard {

// Throws jobguard::Error(errc::invalid_argument) naming the bad text and, when
// given, the option it came from: `invalid duration "3x" for --ttl: unknown unit "x"`.
std::chrono::microseconds parse_duration(std::string_view text, std::string_view what = {});

// "1.5s", "250ms", "40us": the shortest exact-enough rendering for humans.
std::string format_duration(std::chrono::nanoseconds d);

}  // namespace jobguard
