#include "jobguard/redis/reply.hpp"

#include <fmt/format.h>

namespace jobguard::redis {

std::string_view Reply::error_prefix() const noexcept {
  if (type != Type::error) return {};
  std::string_view s = str;
  return s.substr(0, s.find(' '));
}

std::string to_debug_string(const Reply& r) {
  switch (r.type) {
    case Reply::Type::nil: return "(nil)";
    case Reply::Type::string: return fmt::format("\"{}\"", r.str);
    case Reply::Type::status: return r.str;
    case Reply::Type::error: return fmt::format("(error) {}", r.str);
    case Reply::Type::integer: return fmt::format("(integer) {}", r.integer);
    case Reply::Type::array: {
      std::string out = "[";
      for (std::size_t i = 0; i < r.elements.size(); ++i) {
        if (i) out += ", ";
        out += to_debug_string(r.elements[i]);
      }
      return out + "]";
    }
  }
  return "?";
}

}  // namespace jobguard::redis
