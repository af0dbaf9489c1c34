#include "jobguard/admin.hpp"

#include <fmt/format.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>

#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"
#include "lock/inspect_internal.hpp"
#include "lock/quarantine.hpp"
#include "lock/scan_internal.hpp"

namespace jobguard {
namespace lock_scripts {
extern const std::string_view force_release;
}  // namespace lock_scripts

namespace admin {
namespace {

const redis::Script& force_release_script() {
  static const redis::Script s{std::string(lock_scripts::force_release)};
  return s;
}


std::int64_t to_i64(std::string_view s) {
  std::int64_t v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

// Inspects every resource of one SCAN batch in one pipeline: the requests
// leave together and the server runs them back to back.
std::vector<LockInfo> inspect_batch(LockService& service, const std::vector<std::string>& resources) {
  struct Shared {
    std::mutex mu;
    std::vector<LockInfo> out;
    Error first_error;
    std::size_t left;
    std::promise<void> done;
  };
  auto sh = std::make_shared<Shared>();
  sh->left = resources.size();
  if (resources.empty()) return {};
  auto fut = sh->done.get_future();
  for (const auto& r : resources) {
    service.async_inspect(r, [sh](const Error& e, LockInfo info) {
      std::lock_guard<std::mutex> g(sh->mu);
      if (e && !sh->first_error) sh->first_error = e;
      if (!e && info.held) sh->out.push_back(std::move(info));
      if (--sh->left == 0) sh->done.set_value();
    });
  }
  // Every call has the client's deadline, so every completion runs.
  fut.wait();
  std::lock_guard<std::mutex> g(sh->mu);
  // Already names the server, the key and the server's own words.
  if (sh->first_error) throw sh->first_error.with_context("inspecting locks");
  return std::move(sh->out);
}

// Each entry of an XRANGE/XREVRANGE reply: its id, its time (the id's first
// part, unix ms) and its fields as a flat name, value, ... list.
template <class Fn>
void for_each_entry(const redis::Reply& r, Fn fn) {
  if (!r.is_array()) return;
  for (const auto& entry : r.elements) {
    if (!entry.is_array() || entry.elements.size() != 2) continue;
    const std::string& id = entry.elements[0].str;
    fn(id, to_i64(std::string_view(id).substr(0, id.find('-'))), entry.elements[1].elements);
  }
}

}  // namespace

std::string audit_key(const KeyBuilder& keys) { return keys.prefix() + ":audit"; }

std::string audit_key(const KeyBuilder& keys, std::string_view resource) {
  KeyBuilder::validate_resource(resource);
  return fmt::format("{}:audit:{{{}}}", keys.prefix(), resource);
}


std::string default_who() {
  std::string user;
  if (const char* u = std::getenv("USER"); u && *u) user = u;
  if (user.empty()) {
    if (const passwd* pw = ::getpwuid(::geteuid()); pw && pw->pw_name) user = pw->pw_name;
    else user = fmt::format("uid{}", ::geteuid());
  }
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown-host");
  return user + "@" + host;
}

ListResult list_locks(LockService& service, const ListOptions& opts) {
  if (opts.scan_count == 0) throw Error(errc::invalid_argument, "scan_count must be >= 1");
  if (service.client().running_in_loop_thread())
    throw Error(errc::invalid_argument, "list_locks: blocking call on the Redis client's event-loop thread");
  const auto& keys = service.keys();
  const std::string match = ::jobguard::detail::glob_escape(keys.prefix() + ":lock:{" + opts.prefix) + "*}";
  ListResult res;
  // On a Redis Cluster each primary is scanned in turn; the locks found are
  // inspected through the cluster client, each on its own slot's node.
  ::jobguard::detail::scan_everywhere(service.client(), match, opts.scan_count, &res.stats.scan_calls,
                  [&](const std::vector<redis::Reply>& found) {
                    std::vector<std::string> batch;
                    for (const auto& k : found) {
                      ++res.stats.keys_matched;
                      auto resource = keys.resource_of(k.str);
                      if (!resource) continue;
                      if (opts.filter && !opts.filter(*resource)) continue;
                      batch.push_back(std::move(*resource));
                    }
                    res.stats.inspected += batch.size();
                    for (auto& info : inspect_batch(service, batch)) res.locks.push_back(std::move(info));
                    return !(opts.limit > 0 && res.locks.size() >= opts.limit);
                  });
  // SCAN may return a key twice (rehashing): keep one of each.
  std::sort(res.locks.begin(), res.locks.end(),
            [](const LockInfo& a, const LockInfo& b) { return a.resource < b.resource; });
  res.locks.erase(std::unique(res.locks.begin(), res.locks.end(),
                              [](const LockInfo& a, const LockInfo& b) { return a.resource == b.resource; }),
                  res.locks.end());
  if (opts.limit > 0 && res.locks.size() > opts.limit) res.locks.resize(opts.limit);
  return res;
}

ForceReleaseResult force_release(LockService& service, std::string_view resource, const ForceReleaseOptions& opts) {
  if (opts.reason.empty())
    throw Error(errc::invalid_argument, fmt::format("force release of {}: a reason is required", resource));
  if (opts.audit_maxlen == 0) throw Error(errc::invalid_argument, "audit_maxlen must be >= 1");
  const auto& keys = service.keys();
  const std::string who = opts.who.empty() ? default_who() : opts.who;
  if (service.client().running_in_loop_thread())
    throw Error(errc::invalid_argument, "blocking force_release on the event-loop thread would deadlock");
  redis::Confirm wanted;
  wanted.replicas = service.client().options().lock_replicas;
  wanted.timeout = service.client().options().lock_replicas_timeout;
  std::promise<std::pair<redis::Reply, redis::Confirmation>> p;
  auto f = p.get_future();
  // On a Redis Cluster the audit record goes into a stream in the resource's
  // own slot: one script may touch only one slot's keys, and the record must
  // be written with the release, not after it (read_audit merges the streams).
  const bool cluster = service.client().options().cluster;
  std::vector<std::string> script_keys = {keys.lock_key(resource), keys.fence_key(resource),
                                          cluster ? audit_key(keys, resource) : audit_key(keys)};
  std::vector<std::string> args = {who, opts.reason, std::string(resource), std::to_string(opts.audit_maxlen),
                                   keys.channel(resource), opts.expect_holder,
                                   cluster ? "1" : ""};
  service.client().async_eval_confirmed(
      force_release_script(), std::move(script_keys), std::move(args), wanted,
      [&p, address = service.client().address(), what = fmt::format("force release of {}", resource)](
          std::error_code ec, redis::Reply reply, redis::Confirmation c) {
        if (ec) p.set_exception(std::make_exception_ptr(redis::to_error(ec, reply, address, what)));
        else p.set_value({std::move(reply), std::move(c)});
      });
  auto [r, conf] = f.get();
  ForceReleaseResult out;
  if (!r.is_array() || r.elements.empty() || !r.elements[0].is_integer())
    throw Error(errc::protocol_error,
                fmt::format("force release of {}: unexpected reply {}", resource, redis::to_debug_string(r)));
  const auto code = r.elements[0].integer;
  if (code == 0) return out;
  out.holder = r.elements.size() > 1 ? r.elements[1].str : "";
  if (code < 0) {
    out.outcome = ForceReleaseResult::Outcome::holder_changed;
    return out;
  }
  if (r.elements.size() != 5)
    throw Error(errc::protocol_error,
                fmt::format("force release of {}: unexpected reply {}", resource, redis::to_debug_string(r)));
  out.outcome = ForceReleaseResult::Outcome::released;
  out.ttl_left = std::chrono::milliseconds(r.elements[2].integer);
  out.new_fence = to_i64(r.elements[3].str);
  out.audit_id = r.elements[4].str;
  if (!conf.met(wanted)) out.unconfirmed = redis::describe(conf, wanted);
  return out;
}

std::vector<AuditRecord> read_audit(LockService& service, std::size_t count) {
  if (count == 0) return {};
  auto& client = service.client();
  // The one stream, and on a Redis Cluster also each resource's own
  // (force_release): the newest `count` of each, merged newest first.
  std::vector<std::string> streams = {audit_key(service.keys())};
  if (client.options().cluster)
    ::jobguard::detail::scan_everywhere(client, ::jobguard::detail::glob_escape(service.keys().prefix() + ":audit:{") + "*}", 1000, nullptr,
                    [&](const std::vector<redis::Reply>& found) {
                      for (const auto& k : found) streams.push_back(k.str);
                      return true;
                    });
  std::sort(streams.begin() + 1, streams.end());
  streams.erase(std::unique(streams.begin() + 1, streams.end()), streams.end());
  std::vector<std::future<redis::Reply>> replies;
  for (const auto& key : streams)
    replies.push_back(client.exec_future(redis::Command{"XREVRANGE", key, "+", "-", "COUNT", std::to_string(count)}));
  std::vector<AuditRecord> out;
  for (auto& fr : replies) {
    auto r = fr.get();
    for_each_entry(r, [&](const std::string& id, std::int64_t at_ms, const std::vector<redis::Reply>& f) {
      AuditRecord a;
      a.id = id;
      a.at_ms = at_ms;
      for (std::size_t i = 0; i + 1 < f.size(); i += 2) {
        const auto& name = f[i].str;
        const auto& v = f[i + 1].str;
        if (name == "resource") a.resource = v;
        else if (name == "holder") a.holder = v;
        else if (name == "who") a.who = v;
        else if (name == "reason") a.reason = v;
        else if (name == "fence") a.fence = to_i64(v);
        else if (name == "ttl_left_ms") a.ttl_left_ms = to_i64(v);
        else if (name == "action") a.action = v;
        else if (name == "job") a.job = v;
      }
      out.push_back(std::move(a));
    });
  }
  if (streams.size() > 1) {
    // Stream ids are "<ms>-<seq>": compared as numbers, not strings.
    const auto key = [](const AuditRecord& a) {
      const auto dash = a.id.find('-');
      return std::pair{a.at_ms, dash == std::string::npos ? 0 : to_i64(std::string_view(a.id).substr(dash + 1))};
    };
    std::stable_sort(out.begin(), out.end(), [&](const AuditRecord& a, const AuditRecord& b) { return key(a) > key(b); });
    if (out.size() > count) out.resize(count);
  }
  return out;
}

std::string incidents_key(const KeyBuilder& keys) { return keys.prefix() + ":incidents"; }

void record_incident(redis::Client& client, const KeyBuilder& keys, const Incident& incident) {
  const auto cut = [](const std::string& v) { return v.size() > 512 ? v.substr(0, 512) : v; };
  try {
    redis::Command cmd{"XADD", incidents_key(keys), "MAXLEN", "~", "10000", "*",
                       "kind", cut(incident.kind), "resource", cut(incident.resource), "job", cut(incident.job),
                       "class", cut(incident.lock_class), "detail", cut(incident.detail)};
    // Whoever records an incident is already handling a failure: a second
    // one (Redis unreachable, an ACL without XADD) must not add to it.
    client.async_exec(std::move(cmd), [](std::error_code, const redis::Reply&) {});
  } catch (const std::exception&) {
  }
}

std::vector<Incident> read_incidents(LockService& service, std::size_t count) {
  std::vector<Incident> out;
  if (count == 0) return out;
  auto r = service.client().exec(
      redis::Command{"XREVRANGE", incidents_key(service.keys()), "+", "-", "COUNT", std::to_string(count)});
  for_each_entry(r, [&](const std::string& id, std::int64_t at_ms, const std::vector<redis::Reply>& f) {
    Incident in;
    in.id = id;
    in.at_ms = at_ms;
    for (std::size_t i = 0; i + 1 < f.size(); i += 2) {
      const auto& name = f[i].str;
      const auto& v = f[i + 1].str;
      if (name == "kind") in.kind = v;
      else if (name == "resource") in.resource = v;
      else if (name == "job") in.job = v;
      else if (name == "class") in.lock_class = v;
      else if (name == "detail") in.detail = v;
    }
    out.push_back(std::move(in));
  });
  return out;
}

std::string append_audit(LockService& service, const AuditRecord& record, std::size_t maxlen) {
  if (record.reason.empty())
    throw Error(errc::invalid_argument, fmt::format("{} of {}: a reason is required", record.action, record.resource));
  if (maxlen == 0) throw Error(errc::invalid_argument, "audit maxlen must be >= 1");
  const std::string who = record.who.empty() ? default_who() : record.who;
  redis::Command cmd{"XADD", audit_key(service.keys()), "MAXLEN", "~", std::to_string(maxlen), "*",
                     "action", record.action, "resource", record.resource, "job", record.job,
                     "who", who, "reason", record.reason};
  return service.client().exec(std::move(cmd)).str;
}

std::string_view lock_state_key() noexcept { return detail::kLockStateKey; }

std::vector<LockStateRecord> lock_state_records(redis::Client& client) {
  if (!client.options().cluster) return {LockStateRecord{"", client.address(), detail::kLockStateKey}};
  // Every primary's own record, the one StateGate::check_cluster reads.
  std::promise<std::vector<redis::PrimaryShard>> p;
  auto f = p.get_future();
  client.async_primaries([&p](const Error& err, std::vector<redis::PrimaryShard> s) {
    if (err) p.set_exception(std::make_exception_ptr(err));
    else p.set_value(std::move(s));
  });
  std::vector<LockStateRecord> out;
  for (const auto& shard : f.get()) {
    auto key = detail::lock_state_key_for(shard);
    if (!key.empty()) out.push_back(LockStateRecord{shard.address, shard.address, std::move(key)});
  }
  if (out.empty()) throw Error(errc::protocol_error, "the cluster's slot map names no primary serving a slot");
  return out;
}

}  // namespace admin
}  // namespace jobguard

namespace jobguard::detail {
std::string glob_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}
}  // namespace jobguard::detail
