#include "jobguard/job/lock_class.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/text.hpp"

namespace jobguard::job {

const char* to_string(Consequence c) noexcept {
  switch (c) {
    case Consequence::low: return "low";
    case Consequence::moderate: return "moderate";
    case Consequence::high: return "high";
  }
  return "?";
}

std::optional<Consequence> parse_consequence(std::string_view s) noexcept {
  if (s == "low") return Consequence::low;
  if (s == "moderate") return Consequence::moderate;
  if (s == "high") return Consequence::high;
  return std::nullopt;
}

const char* to_string(RedisDownPolicy p) noexcept {
  switch (p) {
    case RedisDownPolicy::fail_closed: return "fail-closed";
    case RedisDownPolicy::fail_open: return "fail-open";
  }
  return "?";
}

std::optional<RedisDownPolicy> parse_redis_down_policy(std::string_view s) noexcept {
  if (s == "fail-closed" || s == "fail_closed") return RedisDownPolicy::fail_closed;
  if (s == "fail-open" || s == "fail_open") return RedisDownPolicy::fail_open;
  return std::nullopt;
}

void validate_class_name(std::string_view name) {
  if (name.empty()) throw Error(errc::invalid_argument, "lock class: empty name");
  // escape_text: a name with a newline or an ESC must not split or drive the
  // one-line error it is quoted in.
  auto bad = [&](const std::string& what) {
    return Error(errc::invalid_argument, fmt::format("lock class '{}': {}", escape_text(name, 80), what));
  };
  if (name.size() > 64) throw bad("name longer than 64 characters");
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.';
    if (!ok)
      throw bad(fmt::format("name has '{}' (allowed: letters, digits, '_', '-', '.')", escape_text(std::string_view(&c, 1))));
  }
}

std::string LockClass::resource_for(std::string_view unit_id) const {
  const auto at = key_pattern.find("{id}");
  if (at == std::string::npos) return key_pattern;
  std::string r;
  r.reserve(key_pattern.size() + unit_id.size());
  r.append(key_pattern, 0, at).append(unit_id).append(key_pattern, at + 4);
  return r;
}

std::chrono::milliseconds LockClass::effective_min_time_left() const noexcept {
  return min_time_left.count() > 0 ? min_time_left : ttl / 5;
}

void LockClass::validate() const {
  auto bad = [&](const std::string& what) {
    return Error(errc::invalid_argument, fmt::format("lock class '{}': {}", name, what));
  };
  validate_class_name(name);
  if (key_pattern.empty()) throw bad("empty key_pattern");
  if (key_pattern.find("{id}") != key_pattern.rfind("{id}")) throw bad("key_pattern has \"{id}\" more than once");
  try {
    KeyBuilder::validate_resource(resource_for("x"));
  } catch (const Error& e) {
    throw bad(fmt::format("key_pattern \"{}\": {}", key_pattern, e.what()));
  }
  if (ttl < std::chrono::milliseconds(10)) throw bad(fmt::format("ttl {} ms is below 10 ms", ttl.count()));
  if (wait.count() < 0) throw bad("negative wait");
  if (min_time_left.count() < 0) throw bad("negative min_time_left");
  if (effective_min_time_left() >= ttl)
    throw bad(fmt::format("min_time_left {} ms is not below the ttl {} ms: no side effect could ever start",
                          effective_min_time_left().count(), ttl.count()));
  // The decision matrix's long-running row: a lease that renews forever
  // without a bound turns a hung job into a lock nobody can take.
  if (long_running && hard_timeout.count() <= 0)
    throw bad("long_running needs a hard_timeout (lease renewal + hard timeout)");
  if (!long_running && hard_timeout.count() > 0)
    throw bad("hard_timeout is set but long_running is not: a job that must finish within its ttl needs no lease");
  if (hard_timeout.count() < 0) throw bad("negative hard_timeout");
  if (replicas < -1 || replicas > 64) throw bad(fmt::format("replicas {} is outside -1..64", replicas));
  if (permits < 0 || permits > LockOptions::kMaxPermits)
    throw bad(fmt::format("permits {} is outside 1..{}", permits, LockOptions::kMaxPermits));
  if (permits > 0 && mode != LockMode::mutex)
    throw bad(fmt::format("permits with mode {}: a read-write lock is not a semaphore", to_string(mode)));
  // The high row's guard is a PostgreSQL advisory lock on the resource: one
  // holder, whatever Redis would admit beside it.
  if (consequence == Consequence::high && (permits > 0 || mode == LockMode::shared))
    throw bad(fmt::format("consequence high with {}: its PostgreSQL advisory lock admits one holder at a time",
                          permits > 0 ? "permits" : "mode shared"));
  if (owner.empty()) throw bad("no owner (who to call when this lock misbehaves)");
  if (protects.empty()) throw bad("no 'protects' (what a double run would damage)");
}

}  // namespace jobguard::job
