// A decoded RESP2 reply, as a plain value. Replies are small and short-lived;
// callers own them outright and may move them to any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace jobguard::redis {

struct Reply {
  enum class Type : std::uint8_t { nil, string, status, error, integer, array };

  Type type = Type::nil;
  std::int64_t integer = 0;
  std::string str{};             // bulk string, status text or error text
  std::vector<Reply> elements{}; // array members

  bool is_nil() const noexcept { return type == Type::nil; }
  bool is_error() const noexcept { return type == Type::error; }
  bool is_string() const noexcept { return type == Type::string || type == Type::status; }
  bool is_integer() const noexcept { return type == Type::integer; }
  bool is_array() const noexcept { return type == Type::array; }
  bool is_ok() const noexcept { return type == Type::status && str == "OK"; }
  // First word of an error reply ("NOSCRIPT", "WRONGPASS", "ERR"...).
  std::string_view error_prefix() const noexcept;

  static Reply nil_reply() { return {}; }
  static Reply error_reply(std::string text) {
    Reply r;
    r.type = Type::error;
    r.str = std::move(text);
    return r;
  }
  static Reply status_reply(std::string text) {
    Reply r;
    r.type = Type::status;
    r.str = std::move(text);
    return r;
  }
  static Reply integer_reply(std::int64_t v) {
    Reply r;
    r.type = Type::integer;
    r.integer = v;
    return r;
  }
  static Reply string_reply(std::string v) {
    Reply r;
    r.type = Type::string;
    r.str = std::move(v);
    return r;
  }
};

// For logs and test failure messages: `"OK"`, `(integer) 3`, `(nil)`, `[...]`.
std::string to_debug_string(const Reply& r);

}  // namespace jobguard::redis
