// Durations as people write them on a command line or in a policy file:
// "250ms", "30s", "5m", "1h", "1500us", combined forms like "1m30s" or
// "1h2m3s4ms".
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace jobguard {

// The longest duration any option accepts. Bounding every duration here keeps
// arithmetic on deadlines (now + timeout, TTL in ms sent to Redis) far from
// overflow: without the bound "--timeout 3000000h" would wrap to a deadline
// in the past and fire at once, and "--ttl 3000000h" set a 342-year key.
inline constexpr std::chrono::hours kMaxDuration{24 * 30};

// Throws jobguard::Error(errc::invalid_argument) naming the bad text and, when
// given, the option it came from: `invalid duration "3x" for --ttl: unknown unit "x"`.
// Units: us (or µs), ms, s, m, h; parts in any order may repeat ("1m30s").
// Refuses anything above kMaxDuration.
std::chrono::microseconds parse_duration(std::string_view text, std::string_view what = {});

// The same for settings kept in whole milliseconds (TTLs, timeouts, waits):
// also refuses a sub-millisecond part ("500us", "1500us"), which would
// otherwise be rounded away silently: "500us" would become 0 ms, which every
// option reads as "no timeout".
std::chrono::milliseconds parse_duration_ms(std::string_view text, std::string_view what = {});

// "1.5s", "250ms", "40us": the shortest exact-enough rendering for humans.
std::string format_duration(std::chrono::nanoseconds d);

}  // namespace jobguard
