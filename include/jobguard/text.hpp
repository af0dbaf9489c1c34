// Making user-supplied text safe to put in an error message or a log line.
//
// Two hazards: a secret (a password inside a URL) printed where logs and
// terminals keep it, and control bytes in a key, URL or server reply that
// forge log lines ("\n" starts a fake entry) or drive the terminal (ESC
// sequences). Every message that quotes such text goes through these.
//
// Pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace jobguard {

// Escapes control characters so the result is one printable line: \n \r \t
// \\ stay readable, other C0 bytes, DEL, C1 code points (U+0080..U+009F)
// and bytes that are not valid UTF-8 become \xNN. Valid printable UTF-8 is
// kept. Beyond `max_bytes` of input the rest is cut and "..." appended
// (0 = no limit), so a megabyte key cannot make a megabyte message.
std::string escape_text(std::string_view text, std::size_t max_bytes = 256);

// The last line of defence for a whole message built from parts that were
// (or should have been) escaped already: control bytes and invalid UTF-8
// become \xNN as in escape_text, but backslashes are left alone so escapes
// already in the text are not doubled. The CLI passes every error line
// through it.
std::string escape_controls(std::string_view text);

// Hides the password of a connection string in any form, parsable or not,
// then escapes it as escape_text does:
//  - URLs "scheme://user:secret@host..." -> "scheme://user:***@host...";
//    "scheme://secret@host" (Redis's password-only form) -> "scheme://***@host";
//    the userinfo ends at the last '@', so a password holding '/', '?' or
//    '@' is hidden whole;
//  - "password=..." / "pass=..." parameters in a URL query or a PostgreSQL
//    key=value conninfo (quoted values too) -> "password=***".
// Text with no secret in it comes back unchanged (escaped).
std::string redact_url(std::string_view url);

}  // namespace jobguard
