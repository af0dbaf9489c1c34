#include "jobguard/rwlock.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"
#include "lock/inspect_internal.hpp"
#include "lock/rwlock_internal.hpp"
#include "lock/scan_internal.hpp"

namespace jobguard {
namespace lock_scripts {
extern const std::string_view rw_acquire;
extern const std::string_view rw_release;
extern const std::string_view rw_inspect;
extern const std::string_view rw_force_release;
extern const std::string_view rw_leave;
}  // namespace lock_scripts

namespace detail {
const redis::Script& rw_acquire_script() {
  static const redis::Script s{std::string(lock_scripts::rw_acquire)};
  return s;
}
const redis::Script& rw_release_script() {
  static const redis::Script s{std::string(lock_scripts::rw_release)};
  return s;
}
const redis::Script& rw_leave_script() {
  static const redis::Script s{std::string(lock_scripts::rw_leave)};
  return s;
}
}  // namespace detail

namespace {
const redis::Script& rw_inspect_script() {
  static const redis::Script s{std::string(lock_scripts::rw_inspect)};
  return s;
}

}  // namespace

RwLockInfo inspect_rwlock(LockService& svc, std::string_view resource) {
  if (svc.client().running_in_loop_thread())
    throw Error(errc::invalid_argument,
                "inspect_rwlock: blocking call on the Redis client's event-loop thread would deadlock");
  const auto& k = svc.keys();
  RwLockInfo info;
  info.resource = std::string(resource);
  info.readers_key = k.rw_readers_key(resource);
  info.writer_key = k.rw_writer_key(resource);
  redis::Reply r;
  try {
    r = svc.client().eval(rw_inspect_script(),
                          {info.readers_key, info.writer_key, k.fence_key(resource), k.rw_line_expiry_key(resource),
                           k.rw_writers_line_key(resource)},
                          {});
  } catch (const Error& e) {
    throw e.with_context("inspect of " + info.readers_key);
  }
  const auto bad = [&] {
    return Error(errc::protocol_error,
                 fmt::format("inspect of {}: unexpected reply {}", info.readers_key, redis::to_debug_string(r)));
  };
  constexpr std::size_t kHead = 6;
  if (!r.is_array() || r.elements.size() < kHead) throw bad();
  const auto& e = r.elements;
  info.server_time_ms = detail::reply_int(e[0]).value_or(0);
  info.fence = detail::reply_int(e[1]);
  info.waiters = detail::reply_int(e[2]).value_or(0);
  info.waiting_writers = detail::reply_int(e[3]).value_or(0);
  if (const auto first = detail::reply_int(e[4]).value_or(-1); first >= 0)
    info.writer_waiting = std::chrono::milliseconds(std::max<std::int64_t>(0, info.server_time_ms - first));
  const auto writers = static_cast<std::size_t>(detail::reply_int(e[5]).value_or(0));
  if ((e.size() - kHead) % 2 != 0 || writers * 2 > e.size() - kHead) throw bad();
  for (std::size_t i = kHead; i + 1 < e.size(); i += 2) {
    RwHolder h;
    h.token = e[i].str;
    h.holder = token_owner(h.token);
    h.ttl_left = std::chrono::milliseconds(detail::reply_int(e[i + 1]).value_or(0) - info.server_time_ms);
    if (i < kHead + writers * 2) info.writer = std::move(h);
    else info.readers.push_back(std::move(h));
  }
  return info;
}

admin::ForceReleaseResult force_release_rw(LockService& svc, std::string_view resource,
                                           const admin::ForceReleaseOptions& opts) {
  if (opts.reason.empty())
    throw Error(errc::invalid_argument, fmt::format("force release of {}: a reason is required", resource));
  if (opts.audit_maxlen == 0) throw Error(errc::invalid_argument, "audit_maxlen must be >= 1");
  if (svc.client().running_in_loop_thread())
    throw Error(errc::invalid_argument, "blocking force_release_rw on the event-loop thread would deadlock");
  static const redis::Script script{std::string(lock_scripts::rw_force_release)};
  const auto& k = svc.keys();
  // On a cluster the record goes into the resource's own stream (one slot
  // per script), as admin::force_release does.
  const bool cluster = svc.client().options().cluster;
  const std::string what = fmt::format("force release of {}", k.rw_readers_key(resource));
  redis::Reply r;
  try {
    r = svc.client().eval(script,
                          {k.rw_readers_key(resource), k.rw_writer_key(resource), k.fence_key(resource),
                           cluster ? admin::audit_key(k, resource) : admin::audit_key(k)},
                          {opts.who.empty() ? admin::default_who() : opts.who, opts.reason, std::string(resource),
                           std::to_string(opts.audit_maxlen), k.rw_channel(resource), opts.expect_holder,
                           cluster ? "1" : ""});
  } catch (const Error& e) {
    throw e.with_context(what);
  }
  const auto bad = [&] {
    return Error(errc::protocol_error, fmt::format("{}: unexpected reply {}", what, redis::to_debug_string(r)));
  };
  if (!r.is_array() || r.elements.empty() || !r.elements[0].is_integer()) throw bad();
  admin::ForceReleaseResult out;
  const auto code = r.elements[0].integer;
  if (code == 0) return out;
  out.holder = r.elements.size() > 1 ? r.elements[1].str : "";
  if (code < 0) {
    out.outcome = admin::ForceReleaseResult::Outcome::holder_changed;
    return out;
  }
  if (r.elements.size() != 5) throw bad();
  out.outcome = admin::ForceReleaseResult::Outcome::released;
  out.ttl_left = std::chrono::milliseconds(detail::reply_int(r.elements[2]).value_or(0));
  out.new_fence = detail::reply_int(r.elements[3]).value_or(0);
  out.audit_id = r.elements[4].str;
  return out;
}

namespace admin {

std::vector<RwLockInfo> list_rwlocks(LockService& service, const ListOptions& opts) {
  if (service.client().running_in_loop_thread())
    throw Error(errc::invalid_argument, "list_rwlocks: blocking call on the Redis client's event-loop thread");
  const auto& prefix = service.keys().prefix();
  std::vector<RwLockInfo> out;
  // The readers' keys, then the writers': a resource with both is inspected once.
  ::jobguard::detail::scan_resources(service.client(), {prefix + ":rwr:{", prefix + ":rww:{"}, opts,
                                     [&](const std::string& resource) {
                                       auto info = inspect_rwlock(service, resource);
                                       if (info.writer || !info.readers.empty()) out.push_back(std::move(info));
                                       return !(opts.limit > 0 && out.size() >= opts.limit);
                                     });
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.resource < b.resource; });
  return out;
}

}  // namespace admin

}  // namespace jobguard
