// `jobguard locks`: list live locks, show one, force-release one held by a
// dead host (advancing its fence, with an audit record), list the audit.
// A thin layer over jobguard/admin.hpp.
#include <iostream>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/semaphore.hpp"
#include "jobguard/rwlock.hpp"
#include "jobguard/admin.hpp"
#include "jobguard/error.hpp"
#include "jobguard/job/catalog.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::cli {
namespace {

constexpr const char* kLocksHelp = R"(Live locks: who holds what, for how much longer; force release.

  jobguard locks ls [--resource-prefix P] [--class C --catalog FILE] [--limit N] [--scan-count 1000]
  jobguard locks show KEY       (with the permit holders of KEY's semaphore and the
                                readers / writer of its read-write lock, if any)
  jobguard locks release KEY --reason TEXT [--holder OWNER] [--rw]
  jobguard locks release KEY --reason TEXT --permit [--slot N] [--holder OWNER]
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

ls also lists the semaphores with live permits (holders, the stored count or
"-" when each acquire brings its own, waiters). release --permit (implied by
--slot) force-releases ONE permit of KEY's semaphore the same way: the permit
in slot N (only while OWNER holds it, with --holder too), or OWNER's one
permit (--holder alone; an owner holding several must name the slot); its
slot comes free, the fence advances, the waiters are woken, the audit record
names the holder and the slot (docs/semaphore.md).

Exit status: 0 ok (release: released, or the lock was already free);
75 release --holder: the lock is held by someone else.

release --rw acts on KEY's read-write lock instead (docs/rwlock.md): it removes
the reader or writer --holder OWNER names (each holder of that owner), or
every reader and the writer without --holder, with the same fence advance,
wake-up and audit record (holder "reader OWNER"); exit 75 when OWNER holds
nothing but others do.)";

struct LocksArgs {
  std::string key_prefix = "jobguard";
  // ls
  std::string prefix, cls, catalog;
  std::size_t limit = 0, scan_count = 1000;
  // show / release
  std::string key, reason, holder;
  bool permit = false;
  std::optional<int> slot;
  bool rw = false;  // release: the read-write lock's holders
  // audit
  std::size_t count = 100;
};

std::unique_ptr<redis::Client> connect_locks(const Globals& g) { return connect_redis(g, "jobguard-locks"); }

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
  admin::ClassOf class_of;
  if (catalog)
    class_of = [&catalog](std::string_view resource) -> std::optional<admin::ClassTag> {
      const auto* c = catalog->match(resource);
      if (!c) return std::nullopt;
      return admin::ClassTag{c->lock_class.name, c->lock_class.fenced};
    };
  const auto res = admin::list_locks(*service, lo);
  const auto sems = admin::list_semaphores(*service, lo);
  if (g.json) {
    auto j = nlohmann::json::parse(admin::list_json(res, class_of));
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& s : sems)
      arr.push_back({{"resource", s.resource}, {"key", s.key}, {"holders", s.holders.size()},
                     {"stored_permits", s.stored_permits ? nlohmann::json(*s.stored_permits) : nlohmann::json()},
                     {"waiters", s.waiters}});
    j["semaphores"] = arr;
    std::cout << j.dump() << "\n";
    return exit_code::ok;
  }
  std::cout << admin::format_list(res, class_of);
  if (!sems.empty()) {
    std::cout << fmt::format("\n{:<40} {:>7} {:>7} {:>7}\n", "SEMAPHORE", "HOLDERS", "PERMITS", "WAITING");
    for (const auto& s : sems)
      std::cout << fmt::format("{:<40} {:>7} {:>7} {:>7}\n", s.resource, s.holders.size(),
                               s.stored_permits ? std::to_string(*s.stored_permits) : std::string("-"), s.waiters);
  }
  return exit_code::ok;
}

int run_show(const Globals& g, const LocksArgs& a) {
  KeyBuilder keys(a.key_prefix);
  const auto resource = admin::parse_resource(keys, a.key);
  auto client = connect_locks(g);
  auto service = LockService::create(*client, keys);
  const auto i = service->inspect(resource);
  // The resource's counting semaphore, when it has one (docs/semaphore.md).
  const auto sem = inspect_semaphore(*service, resource);
  const bool has_sem = !sem.holders.empty() || sem.stored_permits || sem.waiters > 0;
  // Its read-write lock, likewise (docs/rwlock.md).
  const auto rw = inspect_rwlock(*service, resource);
  const bool has_rw = rw.writer || !rw.readers.empty() || rw.waiters > 0;
  if (g.json) {
    auto j = nlohmann::json::parse(admin::info_json(i));
    if (has_sem) {
      nlohmann::json holders = nlohmann::json::array();
      for (const auto& h : sem.holders)
        holders.push_back({{"slot", h.slot}, {"holder", h.holder}, {"ttl_left_ms", h.ttl_left.count()}});
      j["permits"] = {{"key", sem.key}, {"holders", holders}, {"waiters", sem.waiters},
                      {"stored_permits", sem.stored_permits ? nlohmann::json(*sem.stored_permits) : nlohmann::json()}};
    }
    if (has_rw) {
      const auto holder = [](const RwHolder& h) {
        return nlohmann::json{{"holder", h.holder}, {"ttl_left_ms", h.ttl_left.count()}};
      };
      nlohmann::json readers = nlohmann::json::array();
      for (const auto& h : rw.readers) readers.push_back(holder(h));
      j["rwlock"] = {{"readers_key", rw.readers_key},
                     {"writer_key", rw.writer_key},
                     {"writer", rw.writer ? holder(*rw.writer) : nlohmann::json()},
                     {"readers", readers},
                     {"waiters", rw.waiters},
                     {"waiting_writers", rw.waiting_writers}};
    }
    std::cout << j.dump() << "\n";
    return exit_code::ok;
  }
  std::cout << admin::format_info(i);
  if (has_sem) {
    std::cout << fmt::format("permits: {} held in {}{}, {} waiting\n", sem.holders.size(), sem.key,
                             sem.stored_permits ? fmt::format(" (stored count {})", *sem.stored_permits) : std::string(),
                             sem.waiters);
    for (const auto& h : sem.holders)
      std::cout << fmt::format("  slot {:<4} {}  ttl {} left\n", h.slot, h.holder, format_duration(h.ttl_left));
  }
  if (has_rw) {
    std::cout << fmt::format("read-write lock: {} reader{}, {}, {} waiting ({} writer{})\n", rw.readers.size(),
                             rw.readers.size() == 1 ? "" : "s", rw.writer ? "a writer" : "no writer", rw.waiters,
                             rw.waiting_writers, rw.waiting_writers == 1 ? "" : "s");
    if (rw.writer)
      std::cout << fmt::format("  writer  {}  ttl {} left\n", rw.writer->holder, format_duration(rw.writer->ttl_left));
    for (const auto& h : rw.readers)
      std::cout << fmt::format("  reader  {}  ttl {} left\n", h.holder, format_duration(h.ttl_left));
  }
  return exit_code::ok;
}

int run_release_permit(const Globals& g, const LocksArgs& a, LockService& service, const std::string& resource) {
  admin::PermitReleaseOptions po;
  po.reason = a.reason;
  po.slot = a.slot;
  po.holder = a.holder;
  if (!po.slot && po.holder.empty())
    throw Error(errc::invalid_argument, "release --permit needs --slot N or --holder OWNER: which permit");
  const auto r = admin::force_release_permit(service, resource, po);
  using O = admin::ForceReleaseResult::Outcome;
  if (g.json) {
    auto j = nlohmann::json::parse(admin::release_json(resource, r));
    j["slot"] = r.outcome == O::released ? nlohmann::json(r.permit_slot) : nlohmann::json();
    std::cout << j.dump() << "\n";
  } else if (r.outcome == O::released) {
    std::cout << fmt::format("released the permit of {} in slot {}: holder {}, {} left; fence advanced to {}; "
                             "audit {}{}\n",
                             resource, r.permit_slot, r.holder, format_duration(r.ttl_left), r.new_fence, r.audit_id,
                             r.unconfirmed.empty() ? std::string() : "; NOT CONFIRMED: " + r.unconfirmed);
  } else if (r.outcome == O::holder_changed) {
    std::cerr << fmt::format("jobguard locks release: slot {} of {} is held by {}, not {}: left alone\n", *a.slot,
                             resource, r.holder, a.holder);
  } else {
    std::cout << fmt::format("no live permit of {} matches: nothing released\n", resource);
  }
  return r.outcome == O::holder_changed ? exit_code::busy : exit_code::ok;
}

int run_release(const Globals& g, const LocksArgs& a) {
  KeyBuilder keys(a.key_prefix);
  const auto resource = admin::parse_resource(keys, a.key);
  if (a.reason.empty()) throw Error(errc::invalid_argument, "--reason is required: it goes into the audit record");
  if (a.rw && (a.permit || a.slot))
    throw Error(errc::invalid_argument, "--rw (a read-write lock's holders) and --permit/--slot (a semaphore's permit) "
                                        "name different locks: give one");
  auto client = connect_locks(g);
  auto service = LockService::create(*client, keys);
  if (a.permit || a.slot) return run_release_permit(g, a, *service, resource);
  admin::ForceReleaseOptions fo;
  fo.reason = a.reason;
  fo.expect_holder = a.holder;
  const auto r = a.rw ? force_release_rw(*service, resource, fo) : admin::force_release(*service, resource, fo);
  const bool changed = r.outcome == admin::ForceReleaseResult::Outcome::holder_changed;
  if (g.json) std::cout << admin::release_json(resource, r) << "\n";
  else if (changed) std::cerr << "jobguard locks release: " << admin::format_release(resource, r, a.holder);
  else std::cout << admin::format_release(resource, r, a.holder);
  return changed ? exit_code::busy : exit_code::ok;
}

int run_audit(const Globals& g, const LocksArgs& a) {
  KeyBuilder keys(a.key_prefix);
  auto client = connect_locks(g);
  auto service = LockService::create(*client, keys);
  const auto recs = admin::read_audit(*service, a.count);
  std::cout << (g.json ? admin::audit_json(recs) + "\n" : admin::format_audit(recs));
  return exit_code::ok;
}

}  // namespace

void add_locks(CLI::App& root, Globals& g, Commands& out) {
  auto a = std::make_shared<LocksArgs>();
  auto* locks = root.add_subcommand("locks", "Live locks: ls, show, release (force), audit");
  locks->footer(exit_status_help(kLocksHelp));
  locks->require_subcommand(1);
  locks->fallthrough();
  // Before or after the subcommand's name: `locks --key-prefix P ls` as well.
  add_key_prefix(*locks, a->key_prefix, "Key prefix of the locks");

  auto* ls = locks->add_subcommand("ls", "List held locks (SCAN, never KEYS)");
  ls->fallthrough();
  ls->footer(exit_status_help("Exit status: 0 ok."));
  add_key_prefix(*ls, a->key_prefix, "Key prefix of the locks");
  ls->add_option("--resource-prefix", a->prefix, "Only resources starting with P");
  // Hidden: the old spelling, kept for scripts; it never meant the key prefix.
  ls->add_option("--prefix", a->prefix, "Only resources starting with P (old spelling of --resource-prefix)")
      ->group("");
  ls->add_option("--class", a->cls, "Only locks of class C (needs --catalog)");
  ls->add_option("--catalog", a->catalog, "Lock catalog YAML (classes by key pattern)");
  ls->add_option("--limit", a->limit, "Stop after N locks (0: all)")->capture_default_str();
  ls->add_option("--scan-count", a->scan_count, "SCAN COUNT hint per round trip")
      ->check(CLI::Range(std::size_t{1}, std::size_t{100000}))
      ->capture_default_str();
  out.emplace_back(ls, [&g, a] { return run_ls(g, *a); });

  auto* show = locks->add_subcommand("show", "Holder, TTL left, fence and waiters of one lock");
  show->fallthrough();
  show->footer(exit_status_help("Exit status: 0 ok (a free lock is shown as free)."));
  show->add_option("KEY", a->key, "Resource or lock key")->required();
  add_key_prefix(*show, a->key_prefix, "Key prefix of the locks");
  out.emplace_back(show, [&g, a] { return run_show(g, *a); });

  auto* rel = locks->add_subcommand("release", "Force-release a lock: advance its fence, record who/why");
  rel->fallthrough();
  rel->footer(exit_status_help("Exit status: 0 released, or already free; 75 --holder: held by someone else."));
  rel->add_option("KEY", a->key, "Resource or lock key")->required();
  add_key_prefix(*rel, a->key_prefix, "Key prefix of the locks");
  rel->add_option("--reason", a->reason, "Why (goes into the audit record)")->required();
  rel->add_option("--holder", a->holder, "Release only if this is still the holder (host/pid/job)");
  rel->add_flag("--permit", a->permit, "Release one permit of KEY's semaphore (by --slot and/or --holder)");
  rel->add_option("--slot", a->slot, "The permit's slot (implies --permit)")
      ->check(CLI::Range(0, LockOptions::kMaxPermits - 1));
  rel->add_flag("--rw", a->rw, "Release KEY's read-write lock: the reader/writer --holder names, or all of them");
  out.emplace_back(rel, [&g, a] { return run_release(g, *a); });

  auto* audit = locks->add_subcommand("audit", "Force releases and the dashboard's other actions, newest first");
  audit->fallthrough();
  audit->footer(exit_status_help("Exit status: 0 ok."));
  audit->add_option("--count", a->count, "Show at most N")->capture_default_str();
  add_key_prefix(*audit, a->key_prefix, "Key prefix of the locks");
  out.emplace_back(audit, [&g, a] { return run_audit(g, *a); });
}

}  // namespace jobguard::cli
