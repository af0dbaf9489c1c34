// libFuzzer harness: the Redis URL parser and the redaction/escaping helpers.
// Invariants: no crash or leak; every message is one printable line; a
// parsed password never appears in the display URL or in redact_url().
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "check.hpp"
#include "jobguard/error.hpp"
#include "jobguard/redis/options.hpp"
#include "jobguard/text.hpp"

using namespace jobguard;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::string redacted = redact_url(in);
  fuzz::expect_one_printable_line(redacted, "redact_url");
  fuzz::expect_one_printable_line(escape_text(in, 64), "escape_text");
  try {
    const auto o = redis::parse_url(in);
    const std::string shown = redis::to_display_url(o);
    fuzz::expect_one_printable_line(shown, "to_display_url");
    // A password long enough not to occur by chance in the rest must not
    // be shown. (Short ones like "a" also match the scheme or host.)
    // A password long enough not to occur by chance must not be shown,
    // unless it also occurs in what may be shown (found by this harness:
    // user "3c@h" with password "redis://3c").
    if (o.password.size() >= 8 && o.password.find_first_of("%*\\") == std::string::npos) {
      auto other = o;
      other.password = "x";
      if (redis::to_display_url(other).find(o.password) == std::string::npos &&
          shown.find(o.password) != std::string::npos)
        fuzz::fail("to_display_url shows the password");
      const auto first = in.find(o.password);
      if (first != std::string_view::npos && first == in.rfind(o.password) &&
          redacted.find(o.password) != std::string::npos)
        fuzz::fail("redact_url shows the password");
    }
    if (o.port == 0) fuzz::fail("port 0 accepted");
    if (o.password.empty()) {
      try {
        const std::string with = redis::with_password(in, "pw/with?odd@chars");
        if (redis::parse_url(with).password != "pw/with?odd@chars") fuzz::fail("with_password round trip");
      } catch (const Error& e) {
        fuzz::expect_one_printable_line(e.what(), "with_password error");
      }
    }
  } catch (const Error& e) {
    fuzz::expect_one_printable_line(e.what(), "parse_url error");
  }
  return 0;
}
