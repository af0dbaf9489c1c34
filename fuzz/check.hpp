// What every harness asserts about text it got back from the library.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace jobguard::fuzz {

// A message must be one printable line: control bytes in input are escaped
// (jobguard/text.hpp), never passed through to a terminal or log.
inline void expect_one_printable_line(std::string_view msg, const char* where) {
  for (unsigned char c : msg) {
    if (c < 0x20 || c == 0x7f) {
      std::fprintf(stderr, "%s: control byte 0x%02x in message: %.*s\n", where, c, static_cast<int>(msg.size()),
                   msg.data());
      std::abort();
    }
  }
}

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "invariant broken: %s\n", what);
  std::abort();
}

}  // namespace jobguard::fuzz
