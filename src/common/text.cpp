#include "jobguard/text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace jobguard {
namespace {

// Length of the valid UTF-8 sequence at s[i] that encodes a printable code
// point (not C1), or 0.
std::size_t utf8_printable_len(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  std::size_t len = 0;
  unsigned cp = 0;
  if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1Fu;
  else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0Fu;
  else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07u;
  else return 0;
  if (i + len > s.size()) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    if ((b(k) & 0xC0u) != 0x80u) return 0;
    cp = (cp << 6) | (b(k) & 0x3Fu);
  }
  // Overlong forms, surrogates, beyond U+10FFFF, C1 controls.
  if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF) return 0;
  if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
  if (cp >= 0x80 && cp <= 0x9F) return 0;
  return len;
}

bool ieq(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

// Masks the value of every password=/pass= parameter in `s` (in place): in a
// URL query the value runs to the next '&' or '#'; in a conninfo to the next
// blank, or to the closing quote of a quoted value.
void mask_password_params(std::string& s) {
  std::size_t pos = 0;
  while (pos < s.size()) {
    const auto eq = s.find('=', pos);
    if (eq == std::string::npos) return;
    std::size_t k = eq;
    while (k > 0 && (std::isalnum(static_cast<unsigned char>(s[k - 1])) || s[k - 1] == '_')) --k;
    // A blank before '=' is allowed in conninfo: "password = x".
    std::size_t key_end = eq;
    while (key_end > 0 && s[key_end - 1] == ' ') --key_end;
    if (key_end != eq) {
      k = key_end;
      while (k > 0 && (std::isalnum(static_cast<unsigned char>(s[k - 1])) || s[k - 1] == '_')) --k;
    }
    const std::string_view key(s.data() + k, key_end - k);
    const bool boundary = k == 0 || s[k - 1] == '?' || s[k - 1] == '&' || s[k - 1] == ' ' || s[k - 1] == '\t';
    std::size_t v = eq + 1;
    if (boundary && (ieq(key, "password") || ieq(key, "pass"))) {
      while (v < s.size() && s[v] == ' ') ++v;
      std::size_t end = v;
      if (v < s.size() && s[v] == '\'') {
        end = v + 1;
        while (end < s.size() && s[end] != '\'') end += (s[end] == '\\' && end + 1 < s.size()) ? 2 : 1;
        if (end < s.size()) ++end;
      } else {
        while (end < s.size() && s[end] != '&' && s[end] != '#' && s[end] != ' ' && s[end] != '\t') ++end;
      }
      s.replace(v, end - v, "***");
      pos = v + 3;
    } else {
      pos = eq + 1;
    }
  }
}

}  // namespace

static std::string escape_impl(std::string_view text, std::size_t max_bytes, bool backslash) {
  const bool cut = max_bytes != 0 && text.size() > max_bytes;
  if (cut) text = text.substr(0, max_bytes);
  std::string out;
  out.reserve(text.size() + 8);
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F) {
      if (c == '\\' && backslash) out += "\\\\";
      else out.push_back(static_cast<char>(c));
      ++i;
    } else if (c == '\n') {
      out += "\\n", ++i;
    } else if (c == '\r') {
      out += "\\r", ++i;
    } else if (c == '\t') {
      out += "\\t", ++i;
    } else if (const auto n = c >= 0x80 ? utf8_printable_len(text, i) : 0; n != 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    }
  }
  if (cut) out += "...";
  return out;
}

std::string escape_text(std::string_view text, std::size_t max_bytes) { return escape_impl(text, max_bytes, true); }

std::string escape_controls(std::string_view text) { return escape_impl(text, 0, false); }

std::string redact_url(std::string_view url) {
  std::string s(url);
  const auto scheme_end = s.find("://");
  if (scheme_end != std::string::npos) {
    const std::size_t start = scheme_end + 3;
    // The last '@' ends the userinfo: a raw '/', '?' or '@' inside a password
    // is then hidden whole. (An '@' in a query value over-masks, which is
    // the safe direction.)
    const auto at = s.rfind('@');
    if (at != std::string::npos && at >= start) {
      const auto colon = s.find(':', start);
      if (colon != std::string::npos && colon < at) s.replace(colon + 1, at - colon - 1, "***");
      else s.replace(start, at - start, "***");
    } else if (start < s.size() && s[start] != '[') {
      // No '@': "redis://user:secret/0" (the '@' forgotten) would parse as
      // host "user", port "secret". A port that is not all digits is hidden.
      const auto end = std::min(s.find_first_of("/?#", start), s.size());
      const auto colon = s.find(':', start);
      if (colon != std::string::npos && colon < end) {
        bool digits = true;
        for (std::size_t k = colon + 1; k < end; ++k) digits = digits && s[k] >= '0' && s[k] <= '9';
        if (!digits) s.replace(colon + 1, end - colon - 1, "***");
      }
    }
  }
  mask_password_params(s);
  return escape_text(s, 0);
}

}  // namespace jobguard
