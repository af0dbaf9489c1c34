// `jobguard locks`: list live locks, show one, force-release one held by a
// dead host (advancing its fence, with an audit record), list the audit.
// A thin layer over jobguard/admin.hpp.
#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli.hpp"
#include "jobguard/admin.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "jobguard/job/catalog.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::cli {
namespace {

constexpr const char* kLocksHelp = R"(Live locks: who holds what, for how much longer; force release.

  jobguard locks ls [--prefix P] [--class C --catalog FILE] [--limit N] [--scan-count 1000]
  jobguard locks show KEY
  jobguard locks release KEY --reason TEXT [--holder OWNER]
  jobguard locks audit [--count 100]

KEY is the resource ("invoice:48291") or its Redis key ("jobguard:lock:{invoice:48291}").
ls walks the keyspace with SCAN (never KEYS): one round trip per --scan-count
keys the server examines, matching or not. Columns: the resource, the holder
(host/pid/job from its token), age (time since the resource's last fence was
issued: the holder's age when the holder is fenced, "-" otherwise), TTL left,
the fence, and fair-mode waiters. --class keeps the locks whose resource
matches class C's key pattern in the lock catalog FILE (lock keys do not
record their class).

release deletes the lock whoever holds it, advances the resource's fence past
every fence issued, wakes waiters and appends an audit record (who, when, why,
the holder removed, the new fence) to the stream <prefix>:audit — in one
script. It does not stop the old holder: only a downstream that checks fences
refuses its late writes (docs/operations.md). --holder OWNER releases only if
the holder is still OWNER (as ls printed it).

Exit status: 0 ok (release: released, or the lock was already free); 64 usage;
69 Redis unavailable; 75 release --holder: the lock is held by someone else.)";

struct LocksArgs {
  std::string key_prefix = "jobguard";
  // ls
  std::string prefix, cls, catalog;
  std::size_t limit = 0, scan_count = 1000;
  // show / release
  std::string key, reason, holder;
  // audit
  std::size_t count = 100;
};

std::unique_ptr<redis::Client> connect_locks(const Globals& g) {
  auto conn = redis::parse_url(g.redis_url);
  if (conn.client_name.empty()) conn.client_name = "jobguard-locks";
  auto client = std::make_unique<redis::Client>(conn);
  try {
    client->exec(redis::Command{"PING"}, redis::CallOptions{conn.connect_timeout});
  } catch (const Error& e) {
    throw Error(errc::redis_unavailable,
                fmt::format("cannot reach Redis at {}: {}", redis::to_display_url(conn), e.what()));
  }
  return client;
}

// "invoice:1" or "jobguard:lock:{invoice:1}" -> "invoice:1".
std::string resource_arg(const KeyBuilder& keys, const std::string& key) {
  if (auto r = keys.resource_of(key)) return *r;
  KeyBuilder::validate_resource(key);
  return key;
}

std::string ms_text(std::chrono::milliseconds d) {
  if (d.count() < 0) return "none";
  return format_duration(d);
}

nlohmann::ordered_json info_json(const LockInfo& i, const job::Catalog* catalog) {
  nlohmann::ordered_json j;
  j["resource"] = i.resource;
  j["key"] = i.key;
  j["held"] = i.held;
  j["holder"] = i.holder;
  j["ttl_left_ms"] = i.ttl_left.count();
  j["fence"] = i.fence ? nlohmann::ordered_json(*i.fence) : nlohmann::ordered_json();
  j["fence_age_ms"] = i.fence_age ? nlohmann::ordered_json(i.fence_age->count()) : nlohmann::ordered_json();
  j["waiters"] = i.waiters;
  if (catalog) {
    const auto* c = catalog->match(i.resource);
    j["class"] = c ? nlohmann::ordered_json(c->lock_class.name) : nlohmann::ordered_json();
  }
  return j;
}

// The age column: the fence's age, unless the catalog says the class is not
// fenced (then the fence is some earlier holder's, not this one's).
std::string age_text(const LockInfo& i, const job::CatalogClass* c) {
  if (!i.fence_age || (c && !c->lock_class.fenced)) return "-";
  return format_duration(*i.fence_age);
}

int run_ls(const Globals& g, const LocksArgs& a) {
  std::optional<job::Catalog> catalog;
  if (!a.cls.empty() && a.catalog.empty())
    throw Error(errc::invalid_argument, "--class needs --catalog FILE: lock keys do not record their class");
  if (!a.catalog.empty()) catalog = job::Catalog::load(a.catalog);
  const job::CatalogClass* want = nullptr;
  if (!a.cls.empty()) {
    want = catalog->find(a.cls);
    if (!want) catalog->get(a.cls);  // throws, naming the classes the file has
  }
  KeyBuilder keys(a.key_prefix);
  auto client = connect_locks(g);
  auto service = LockService::create(*client, keys);
  admin::ListOptions lo;
  lo.prefix = a.prefix;
  lo.limit = a.limit;
  lo.scan_count = a.scan_count;
  if (want) {
    const std::string pattern = want->lock_class.key_pattern;
    lo.filter = [pattern](std::string_view r) { return job::key_pattern_matches(pattern, r); };
  }
  const auto res = admin::list_locks(*service, lo);
  const job::Catalog* cat = catalog ? &*catalog : nullptr;
  if (g.json) {
    nlohmann::ordered_json j;
    j["locks"] = nlohmann::ordered_json::array();
    for (const auto& i : res.locks) j["locks"].push_back(info_json(i, cat));
    j["scan_calls"] = res.stats.scan_calls;
    j["keys_matched"] = res.stats.keys_matched;
    std::cout << j.dump() << "\n";
    return exit_code::ok;
  }
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"RESOURCE", "HOLDER", "AGE", "TTL_LEFT", "FENCE", "WAITERS"});
  if (cat) rows.front().push_back("CLASS");
  for (const auto& i : res.locks) {
    const auto* c = cat ? cat->match(i.resource) : nullptr;
    rows.push_back({i.resource, i.holder, age_text(i, c), ms_text(i.ttl_left), i.fence ? std::to_string(*i.fence) : "-",
                    std::to_string(i.waiters)});
    if (cat) rows.back().push_back(c ? c->lock_class.name : "-");
  }
  std::vector<std::size_t> w(rows.front().size(), 0);
  for (const auto& r : rows)
    for (std::size_t k = 0; k < r.size(); ++k) w[k] = std::max(w[k], r[k].size());
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t k = 0; k < r.size(); ++k)
      line += k + 1 == r.size() ? r[k] : fmt::format("{:<{}}  ", r[k], w[k]);
    std::cout << line << "\n";
  }
  std::cout << fmt::format("{} lock{} ({} SCAN round trip{})\n", res.locks.size(), res.locks.size() == 1 ? "" : "s",
                           res.stats.scan_calls, res.stats.scan_calls == 1 ? "" : "s");
  return exit_code::ok;
}

int run_show(const Globals& g, const LocksArgs& a) {
  KeyBuilder keys(a.key_prefix);
  const auto resource = resource_arg(keys, a.key);
  auto client = connect_locks(g);
  auto service = LockService::create(*client, keys);
  const auto i = service->inspect(resource);
  if (g.json) {
    std::cout << info_json(i, nullptr).dump() << "\n";
    return exit_code::ok;
  }
  std::cout << fmt::format("resource  {}\nkey       {}\n", i.resource, i.key);
  if (!i.held) std::cout << "holder    (none: not held)\n";
  else
    std::cout << fmt::format("holder    {}\nttl left  {}\n", i.holder, ms_text(i.ttl_left));
  std::cout << fmt::format("fence     {}\n", i.fence ? std::to_string(*i.fence) : "(none issued)");
  if (i.fence_age) std::cout << fmt::format("fence age {} (the holder's age if it is fenced)\n", format_duration(*i.fence_age));
  std::cout << fmt::format("waiters   {} (fair queue)\n", i.waiters);
  return exit_code::ok;
}

int run_release(const Globals& g, const LocksArgs& a) {
  KeyBuilder keys(a.key_prefix);
  const auto resource = resource_arg(keys, a.key);
  if (a.reason.empty()) throw Error(errc::invalid_argument, "--reason is required: it goes into the audit record");
  auto client = connect_locks(g);
  auto service = LockService::create(*client, keys);
  admin::ForceReleaseOptions fo;
  fo.reason = a.reason;
  fo.expect_holder = a.holder;
  const auto r = admin::force_release(*service, resource, fo);
  using O = admin::ForceReleaseResult::Outcome;
  if (g.json) {
    nlohmann::ordered_json j;
    j["resource"] = resource;
    j["outcome"] = r.outcome == O::released ? "released" : r.outcome == O::not_held ? "not_held" : "holder_changed";
    j["holder"] = r.holder;
    if (r.outcome == O::released) {
      j["ttl_left_ms"] = r.ttl_left.count();
      j["fence"] = r.new_fence;
      j["audit_id"] = r.audit_id;
    }
    std::cout << j.dump() << "\n";
  } else if (r.outcome == O::released) {
    std::cout << fmt::format("released {} (holder {}, {} left); fence advanced to {}; audit entry {}\n", resource,
                             r.holder, ms_text(r.ttl_left), r.new_fence, r.audit_id);
  } else if (r.outcome == O::not_held) {
    std::cout << fmt::format("{} is not held: nothing released\n", resource);
  } else {
    std::cerr << fmt::format("jobguard locks release: {} is held by {}, not {}: nothing released\n", resource, r.holder,
                             a.holder);
  }
  return r.outcome == O::holder_changed ? exit_code::busy : exit_code::ok;
}

int run_audit(const Globals& g, const LocksArgs& a) {
  KeyBuilder keys(a.key_prefix);
  auto client = connect_locks(g);
  auto service = LockService::create(*client, keys);
  const auto recs = admin::read_audit(*service, a.count);
  if (g.json) {
    auto arr = nlohmann::ordered_json::array();
    for (const auto& r : recs)
      arr.push_back({{"id", r.id}, {"at_ms", r.at_ms}, {"resource", r.resource}, {"holder", r.holder},
                     {"who", r.who}, {"reason", r.reason}, {"fence", r.fence}, {"ttl_left_ms", r.ttl_left_ms}});
    std::cout << nlohmann::ordered_json{{"releases", arr}}.dump() << "\n";
    return exit_code::ok;
  }
  for (const auto& r : recs) {
    const auto secs = r.at_ms / 1000;
    std::time_t t = static_cast<std::time_t>(secs);
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    char when[32];
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    std::cout << fmt::format("{}.{:03}Z  {}  by {}  removed {} ({} ms left), fence -> {}: {}\n", when, r.at_ms % 1000,
                             r.resource, r.who, r.holder, r.ttl_left_ms, r.fence, r.reason);
  }
  if (recs.empty()) std::cout << "no force releases recorded\n";
  return exit_code::ok;
}

void add(CLI::App& root, Globals& g, std::vector<std::pair<CLI::App*, Action>>& out) {
  auto a = std::make_shared<LocksArgs>();
  auto* locks = root.add_subcommand("locks", "Live locks: ls, show, release (force), audit");
  locks->footer(kLocksHelp);
  locks->require_subcommand(1);
  locks->fallthrough();
  locks->add_option("--key-prefix", a->key_prefix, "Key prefix of the locks")->capture_default_str();

  auto* ls = locks->add_subcommand("ls", "List held locks (SCAN, never KEYS)");
  ls->fallthrough();
  ls->add_option("--prefix", a->prefix, "Only resources starting with P");
  ls->add_option("--class", a->cls, "Only locks of class C (needs --catalog)");
  ls->add_option("--catalog", a->catalog, "Lock catalog YAML (classes by key pattern)");
  ls->add_option("--limit", a->limit, "Stop after N locks (0: all)")->capture_default_str();
  ls->add_option("--scan-count", a->scan_count, "SCAN COUNT hint per round trip")
      ->check(CLI::Range(std::size_t{1}, std::size_t{100000}))
      ->capture_default_str();
  out.emplace_back(ls, [&g, a] { return run_ls(g, *a); });

  auto* show = locks->add_subcommand("show", "Holder, TTL left, fence and waiters of one lock");
  show->fallthrough();
  show->add_option("KEY", a->key, "Resource or lock key")->required();
  out.emplace_back(show, [&g, a] { return run_show(g, *a); });

  auto* rel = locks->add_subcommand("release", "Force-release a lock: advance its fence, record who/why");
  rel->fallthrough();
  rel->add_option("KEY", a->key, "Resource or lock key")->required();
  rel->add_option("--reason", a->reason, "Why (goes into the audit record)")->required();
  rel->add_option("--holder", a->holder, "Release only if this is still the holder (host/pid/job)");
  out.emplace_back(rel, [&g, a] { return run_release(g, *a); });

  auto* audit = locks->add_subcommand("audit", "Force releases, newest first");
  audit->fallthrough();
  audit->add_option("--count", a->count, "Show at most N")->capture_default_str();
  out.emplace_back(audit, [&g, a] { return run_audit(g, *a); });
}

}  // namespace

void add_locks(CLI::App& root, Globals& g, Commands& out) { add(root, g, out); }
}  // namespace jobguard::cli
