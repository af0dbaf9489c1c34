#include "jobguard/duration.hpp"

#include <fmt/format.h>

#include <cstdint>

#include "jobguard/error.hpp"
#include "jobguard/text.hpp"

namespace jobguard {
namespace {

constexpr std::int64_t kMaxUs = std::chrono::duration_cast<std::chrono::microseconds>(kMaxDuration).count();

Error bad_duration(std::string_view text, std::string_view what, std::string_view why) {
  return Error(errc::invalid_argument, fmt::format("invalid duration \"{}\"{}{}: {}", escape_text(text, 64),
                                                   what.empty() ? "" : " for ", escape_text(what, 64), why));
}

}  // namespace

std::chrono::microseconds parse_duration(std::string_view text, std::string_view what) {
  auto fail = [&](std::string_view why) { return bad_duration(text, what, why); };
  if (text.empty()) throw fail("empty");
  const std::string too_large =
      fmt::format("above the maximum of {}h ({} days)", kMaxDuration.count(), kMaxDuration.count() / 24);
  // Every partial sum is kept <= kMaxUs, so no product or sum below can
  // overflow: n <= kMaxUs before it is scaled, and n * scale is checked by
  // division first.
  std::int64_t total_us = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] < '0' || text[i] > '9') throw fail(fmt::format("expected a number at offset {}", i));
    std::int64_t n = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      n = n * 10 + (text[i] - '0');
      if (n > kMaxUs) throw fail(too_large);
      ++i;
    }
    std::size_t u = i;
    while (i < text.size() && (text[i] < '0' || text[i] > '9')) ++i;
    const std::string_view unit = text.substr(u, i - u);
    std::int64_t scale = 0;
    if (unit == "us" || unit == "\xC2\xB5s") scale = 1;
    else if (unit == "ms") scale = 1000;
    else if (unit == "s") scale = 1000 * 1000;
    else if (unit == "m") scale = 60LL * 1000 * 1000;
    else if (unit == "h") scale = 3600LL * 1000 * 1000;
    else if (unit.empty()) throw fail("missing unit (use us, ms, s, m or h)");
    else throw fail(fmt::format("unknown unit \"{}\" (use us, ms, s, m or h)", escape_text(unit, 16)));
    if (n > (kMaxUs - total_us) / scale) throw fail(too_large);
    total_us += n * scale;
  }
  return std::chrono::microseconds(total_us);
}

std::chrono::milliseconds parse_duration_ms(std::string_view text, std::string_view what) {
  const auto us = parse_duration(text, what);
  if (us.count() % 1000 != 0)
    throw bad_duration(text, what,
                       us < std::chrono::milliseconds(1)
                           ? "below the resolution of 1ms (it would round to nothing)"
                           : "has a sub-millisecond part; the resolution is 1ms");
  return std::chrono::duration_cast<std::chrono::milliseconds>(us);
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
