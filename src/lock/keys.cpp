#include <fmt/format.h>

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/text.hpp"

namespace jobguard {
namespace {

// Braces would break the Cluster hash tag; whitespace and control bytes make
// keys that cannot be typed back from a log line.
std::optional<std::string> bad_char(std::string_view s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '{' || c == '}') return fmt::format("'{}' at offset {}", static_cast<char>(c), i);
    if (c <= 0x20 || c == 0x7f) return fmt::format("byte 0x{:02x} at offset {}", c, i);
  }
  return std::nullopt;
}

}  // namespace

KeyBuilder::KeyBuilder(std::string prefix) : prefix_(std::move(prefix)) {
  if (prefix_.empty()) throw Error(errc::invalid_argument, "empty key prefix");
  if (auto b = bad_char(prefix_)) throw Error(errc::invalid_argument, fmt::format("key prefix \"{}\": invalid {}", escape_text(prefix_, 64), *b));
}

void KeyBuilder::validate_resource(std::string_view r) {
  if (r.empty()) throw Error(errc::invalid_argument, "empty lock key");
  if (r.size() > 512) throw Error(errc::invalid_argument, fmt::format("lock key is {} bytes (max 512)", r.size()));
  if (auto b = bad_char(r)) throw Error(errc::invalid_argument, fmt::format("lock key \"{}\": invalid {}", escape_text(r, 64), *b));
}

std::string KeyBuilder::key(std::string_view kind, std::string_view resource) const {
  validate_resource(resource);
  // Plain appends: this runs twice per acquire+release, and fmt's format
  // parsing showed up in profiles of the lock hot path.
  std::string k;
  k.reserve(prefix_.size() + kind.size() + resource.size() + 4);
  k.append(prefix_).append(1, ':').append(kind).append(":{", 2).append(resource).append(1, '}');
  return k;
}

std::string KeyBuilder::lock_key(std::string_view r) const { return key("lock", r); }
std::string KeyBuilder::fence_key(std::string_view r) const { return key("fence", r); }
std::string KeyBuilder::queue_key(std::string_view r) const { return key("queue", r); }
std::string KeyBuilder::queue_expiry_key(std::string_view r) const { return key("qexp", r); }
std::string KeyBuilder::waiters_key(std::string_view r) const { return key("waiters", r); }
std::string KeyBuilder::channel(std::string_view r) const { return key("released", r); }
std::string KeyBuilder::permit_holders_key(std::string_view r) const { return key("sem", r); }
std::string KeyBuilder::permit_line_key(std::string_view r) const { return key("semq", r); }
std::string KeyBuilder::permit_line_expiry_key(std::string_view r) const { return key("semqexp", r); }
std::string KeyBuilder::permit_count_key(std::string_view r) const { return key("permits", r); }
std::string KeyBuilder::permit_channel(std::string_view r) const { return key("semwake", r); }
std::string KeyBuilder::rw_readers_key(std::string_view r) const { return key("rwr", r); }
std::string KeyBuilder::rw_writer_key(std::string_view r) const { return key("rww", r); }
std::string KeyBuilder::rw_line_key(std::string_view r) const { return key("rwq", r); }
std::string KeyBuilder::rw_line_expiry_key(std::string_view r) const { return key("rwqexp", r); }
std::string KeyBuilder::rw_writers_line_key(std::string_view r) const { return key("rwqw", r); }
std::string KeyBuilder::rw_channel(std::string_view r) const { return key("rwwake", r); }

std::optional<std::string> KeyBuilder::resource_of(std::string_view k) const {
  const std::string head = prefix_ + ":lock:{";
  if (k.size() <= head.size() + 1 || k.substr(0, head.size()) != head || k.back() != '}') return std::nullopt;
  return std::string(k.substr(head.size(), k.size() - head.size() - 1));
}

}  // namespace jobguard
