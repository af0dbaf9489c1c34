// libFuzzer harness: the duration parser. Invariants: no crash or UB (the
// build has UBSan: a signed overflow aborts); results within
// [0, kMaxDuration]; parse_duration_ms agrees with parse_duration; errors
// are one printable line.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "check.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"

using namespace jobguard;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  std::chrono::microseconds us{-1};
  try {
    us = parse_duration(in, "--fuzz");
    if (us.count() < 0 || us > kMaxDuration) fuzz::fail("duration out of bounds");
    (void)format_duration(us);
  } catch (const Error& e) {
    fuzz::expect_one_printable_line(e.what(), "parse_duration error");
  }
  try {
    const auto ms = parse_duration_ms(in, "--fuzz");
    if (us.count() < 0) fuzz::fail("parse_duration_ms accepted what parse_duration refused");
    if (std::chrono::microseconds(ms) != us) fuzz::fail("parse_duration_ms disagrees");
  } catch (const Error& e) {
    fuzz::expect_one_printable_line(e.what(), "parse_duration_ms error");
    if (us.count() >= 0 && us.count() % 1000 == 0) fuzz::fail("parse_duration_ms refused a whole-ms value");
  }
  return 0;
}
