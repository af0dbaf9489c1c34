// Operating semaphores: list them, force-release one permit (jobguard/semaphore.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <future>
#include <set>

#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/semaphore.hpp"
#include "lock/inspect_internal.hpp"
#include "lock/scan_internal.hpp"

namespace jobguard {
namespace lock_scripts {
extern const std::string_view sem_force_release;
}  // namespace lock_scripts

namespace admin {
namespace {
const redis::Script& force_script() {
  static const redis::Script s{std::string(lock_scripts::sem_force_release)};
  return s;
}
}  // namespace

ForceReleaseResult force_release_permit(LockService& service, std::string_view resource,
                                        const PermitReleaseOptions& opts) {
  const std::string what = fmt::format("force release of a permit of {}", resource);
  if (opts.reason.empty()) throw Error(errc::invalid_argument, what + ": a reason is required");
  if (!opts.slot && opts.holder.empty())
    throw Error(errc::invalid_argument, what + ": name the permit by its slot or its holder");
  if (opts.slot && (*opts.slot < 0 || *opts.slot >= LockOptions::kMaxPermits))
    throw Error(errc::invalid_argument,
                fmt::format("{}: slot {} is outside 0..{}", what, *opts.slot, LockOptions::kMaxPermits - 1));
  if (opts.audit_maxlen == 0) throw Error(errc::invalid_argument, "audit_maxlen must be >= 1");
  if (service.client().running_in_loop_thread())
    throw Error(errc::invalid_argument, "blocking force_release_permit on the event-loop thread would deadlock");
  const auto& keys = service.keys();
  const bool cluster = service.client().options().cluster;
  redis::Confirm wanted;
  wanted.replicas = service.client().options().lock_replicas;
  wanted.timeout = service.client().options().lock_replicas_timeout;
  // The audit record in the resource's own slot on a cluster, as force_release.
  std::vector<std::string> script_keys = {keys.permit_holders_key(resource), keys.fence_key(resource),
                                          cluster ? audit_key(keys, resource) : audit_key(keys)};
  std::vector<std::string> args = {opts.who.empty() ? default_who() : opts.who,
                                   opts.reason,
                                   std::string(resource),
                                   std::to_string(opts.audit_maxlen),
                                   keys.permit_channel(resource),
                                   opts.slot ? std::to_string(*opts.slot) : std::string(),
                                   opts.holder,
                                   cluster ? "1" : ""};
  std::promise<std::pair<redis::Reply, redis::Confirmation>> p;
  auto f = p.get_future();
  service.client().async_eval_confirmed(
      force_script(), std::move(script_keys), std::move(args), wanted,
      [&p, address = service.client().address(), what](std::error_code ec, redis::Reply reply, redis::Confirmation c) {
        if (ec) p.set_exception(std::make_exception_ptr(redis::to_error(ec, reply, address, what)));
        else p.set_value({std::move(reply), std::move(c)});
      });
  auto [r, conf] = f.get();
  const auto bad = [&] {
    return Error(errc::protocol_error, fmt::format("{}: unexpected reply {}", what, redis::to_debug_string(r)));
  };
  if (!r.is_array() || r.elements.empty() || !r.elements[0].is_integer()) throw bad();
  ForceReleaseResult out;
  const auto code = r.elements[0].integer;
  if (code == 0) return out;
  if (code == -2)
    throw Error(errc::invalid_argument,
                fmt::format("{}: {} holds {} permits; name the slot", what, opts.holder,
                            r.elements.size() > 1 ? r.elements[1].integer : 0));
  out.holder = r.elements.size() > 1 ? r.elements[1].str : "";
  if (code < 0) {
    out.outcome = ForceReleaseResult::Outcome::holder_changed;
    return out;
  }
  if (r.elements.size() != 6) throw bad();
  out.outcome = ForceReleaseResult::Outcome::released;
  out.ttl_left = std::chrono::milliseconds(r.elements[2].integer);
  std::from_chars(r.elements[3].str.data(), r.elements[3].str.data() + r.elements[3].str.size(), out.new_fence);
  out.audit_id = r.elements[4].str;
  out.permit_slot = static_cast<int>(r.elements[5].integer);
  if (!conf.met(wanted)) out.unconfirmed = redis::describe(conf, wanted);
  return out;
}

std::vector<SemaphoreInfo> list_semaphores(LockService& service, const ListOptions& opts) {
  if (service.client().running_in_loop_thread())
    throw Error(errc::invalid_argument, "list_semaphores: blocking call on the Redis client's event-loop thread");
  std::vector<SemaphoreInfo> out;
  ::jobguard::detail::scan_resources(service.client(), {service.keys().prefix() + ":sem:{"}, opts,
                                     [&](const std::string& resource) {
                                       auto info = inspect_semaphore(service, resource);
                                       if (!info.holders.empty()) out.push_back(std::move(info));
                                       return !(opts.limit > 0 && out.size() >= opts.limit);
                                     });
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.resource < b.resource; });
  return out;
}

}  // namespace admin
}  // namespace jobguard
