#include "jobguard/duration.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <limits>

#include "jobguard/error.hpp"

namespace jobguard {

std::chrono::microseconds parse_duration(std::string_view text, std::string_view what) {
  auto fail = [&](std::string_view why) -> Error {
    return Error(errc::invalid_argument,
                 fmt::format("invalid duration \"{}\"{}{}: {}", text, what.empty() ? "" : " for ",
                             what, why));
  };
  if (text.empty()) throw fail("empty");
  std::int64_t total_us = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] < '0' || text[i] > '9') throw fail(fmt::format("expected a number at offset {}", i));
    std::int64_t n = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      if (n > (std::numeric_limits<std::int64_t>::max() - 9) / 10) throw fail("too large");
      n = n * 10 + (text[i] - '0');
      ++i;
    }
    std::size_t u = i;
    while (i < text.size() && (text[i] < '0' || text[i] > '9')) ++i;
    const std::string_view unit = text.substr(u, i - u);
    std::int64_t scale = 0;
    if (unit == "us" || unit == "µs") scale = 1;
    else if (unit == "ms") scale = 1000;
    else if (unit == "s") scale = 1000 * 1000;
    else if (unit == "m") scale = 60LL * 1000 * 1000;
    else if (unit == "h") scale = 3600LL * 1000 * 1000;
    else if (unit.empty()) throw fail("missing unit (use us, ms, s, m or h)");
    else throw fail(fmt::format("unknown unit \"{}\" (use us, ms, s, m or h)", unit));
    if (n > std::numeric_limits<std::int64_t>::max() / scale - total_us) throw fail("too large");
    total_us += n * scale;
  }
  return std::chrono::microseconds(total_us);
}

std::string format_duration(std::chrono::nanoseconds d) {
  const auto ns = d.count();
  if (ns % 1'000'000'000 == 0 && ns != 0) return fmt::format("{}s", ns / 1'000'000'000);
  if (ns >= 1'000'000'000 || ns <= -1'000'000'000) return fmt::format("{:.3g}s", static_cast<double>(ns) / 1e9);
  if (ns % 1'000'000 == 0 && ns != 0) return fmt::format("{}ms", ns / 1'000'000);
  if (ns >= 1'000'000 || ns <= -1'000'000) return fmt::format("{:.3g}ms", static_cast<double>(ns) / 1e6);
  if (ns % 1000 == 0) return fmt::format("{}us", ns / 1000);
  return fmt::format("{}ns", ns);
}

}  // namespace jobguard
