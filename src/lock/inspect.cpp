// LockService::inspect: who holds a resource and for how much longer.
#include <fmt/format.h>

#include <charconv>
#include <future>

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "lock/inspect_internal.hpp"

namespace jobguard {
namespace lock_scripts {
extern const std::string_view inspect;
}  // namespace lock_scripts

namespace detail {

const redis::Script& inspect_script() {
  static const redis::Script s{std::string(lock_scripts::inspect)};
  return s;
}

std::optional<std::int64_t> reply_int(const redis::Reply& r) {
  if (r.is_integer()) return r.integer;
  if (!r.is_string()) return std::nullopt;
  try {
    std::size_t pos = 0;
    const auto v = std::stoll(r.str, &pos);
    if (pos != r.str.size()) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

namespace {
std::optional<std::int64_t> to_int(const std::string& s) {
  std::int64_t v = 0;
  const auto* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc() || p != end) return std::nullopt;
  return v;
}
}  // namespace

LockInfo decode_inspect(std::string resource, std::string key, const redis::Reply& r) {
  if (!r.is_array() || r.elements.size() != 5 || !r.elements[4].is_integer())
    throw Error(errc::protocol_error, fmt::format("inspect {}: unexpected reply {}", key, redis::to_debug_string(r)));
  LockInfo info;
  info.resource = std::move(resource);
  info.key = std::move(key);
  const auto& e = r.elements;
  // Lua false comes back as nil.
  if (e[0].is_string()) {
    info.held = true;
    info.holder = token_owner(e[0].str);
    info.ttl_left = std::chrono::milliseconds(e[1].integer);
  }
  const std::int64_t now_us = e[4].integer;
  info.server_time_ms = now_us / 1000;
  if (e[2].is_string()) {
    info.fence = to_int(e[2].str);
    // A fence is max(previous + 1, server clock in µs) at its grant: one that
    // reads as a time after 2001 and not after now is that grant's time.
    constexpr std::int64_t k2001_us = 978307200LL * 1000000;
    if (info.fence && *info.fence >= k2001_us && *info.fence <= now_us)
      info.fence_age = std::chrono::milliseconds((now_us - *info.fence) / 1000);
  }
  info.waiters = e[3].integer;
  return info;
}

}  // namespace detail

void LockService::async_inspect(std::string resource, std::function<void(const Error&, LockInfo)> done) {
  std::string key = keys_.lock_key(resource);
  std::vector<std::string> k{key, keys_.fence_key(resource), keys_.queue_key(resource), keys_.waiters_key(resource)};
  client_.async_eval(detail::inspect_script(), std::move(k), {},
                     [resource = std::move(resource), key, address = client_.address(),
                      done = std::move(done)](std::error_code ec, redis::Reply r) mutable {
                       // The server's words (NOPERM, WRONGTYPE) and the key
                       // it refused travel up; a bare code would lose them.
                       if (ec) return done(redis::to_error(ec, r, address, "inspect of " + key), LockInfo{});
                       LockInfo info;
                       try {
                         info = detail::decode_inspect(std::move(resource), std::move(key), r);
                       } catch (const Error& err) {
                         return done(err, LockInfo{});
                       }
                       done(Error{}, std::move(info));
                     });
}

LockInfo LockService::inspect(std::string_view resource) {
  if (client_.running_in_loop_thread())
    throw Error(errc::invalid_argument,
                fmt::format("inspect {}: blocking call on the Redis client's event-loop thread (use async_inspect)",
                            resource));
  const std::string key = keys_.lock_key(resource);
  auto r = client_.eval(detail::inspect_script(),
                        {key, keys_.fence_key(resource), keys_.queue_key(resource), keys_.waiters_key(resource)}, {});
  return detail::decode_inspect(std::string(resource), key, r);
}

}  // namespace jobguard
