// The doctor's checks of the live semaphores and read-write locks
// (ops/doctor.hpp): what an operator cannot see from the server's
// configuration — a semaphore running over its count, a writer kept waiting,
// and holders of different primitives on one resource, which do not exclude
// each other.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "jobguard/admin.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "jobguard/job/catalog.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/ops/doctor.hpp"
#include "jobguard/rwlock.hpp"
#include "jobguard/semaphore.hpp"

namespace jobguard::ops {
namespace {

// Findings shown in the detail line; the rest are counted.
constexpr std::size_t kShown = 5;

struct Findings {
  std::vector<std::string> seen;
  void add(std::string s) { seen.push_back(std::move(s)); }
  std::string text() const {
    std::string out;
    for (std::size_t i = 0; i < seen.size() && i < kShown; ++i) out += (i ? "; " : "") + seen[i];
    if (seen.size() > kShown) out += fmt::format("; and {} more", seen.size() - kShown);
    return out;
  }
};

const job::CatalogClass* class_of(const DoctorOptions& o, const std::string& resource) {
  return o.catalog ? o.catalog->match(resource) : nullptr;
}

bool lock_held(redis::Client& c, const LockService& svc, const std::string& resource) {
  return c.exec(redis::Command{"EXISTS", svc.keys().lock_key(resource)}).integer > 0;
}

std::string limit_note(std::size_t n, std::size_t limit) {
  return n >= limit ? fmt::format(" (the first {} looked at)", limit) : std::string();
}

void judge_semaphore(redis::Client& c, LockService& svc, const SemaphoreInfo& s, const DoctorOptions& o,
                     Findings& f) {
  const auto held = static_cast<int>(s.holders.size());
  if (s.stored_permits && held > *s.stored_permits)
    f.add(fmt::format("{}: {} holders of {} permits (the count was lowered under them; no permit is granted until "
                      "fewer than {} hold)",
                      s.resource, held, *s.stored_permits, *s.stored_permits));
  if (const auto* cc = class_of(o, s.resource)) {
    const auto& lc = cc->lock_class;
    if (lc.permits == 0)
      f.add(fmt::format("{}: held as a semaphore, but its class '{}' declares {}", s.resource, lc.name,
                        lc.mode == LockMode::mutex ? "a lock" : "a read-write lock"));
    else if (s.stored_permits && *s.stored_permits != lc.permits)
      f.add(fmt::format("{}: stored count {} overrides the {} permits class '{}' declares", s.resource,
                        *s.stored_permits, lc.permits, lc.name));
    else if (!s.stored_permits && held > lc.permits)
      f.add(fmt::format("{}: {} holders, above the {} permits class '{}' declares (an acquire asked for more)",
                        s.resource, held, lc.permits, lc.name));
  }
  if (lock_held(c, svc, s.resource))
    f.add(fmt::format("{}: a plain lock is held beside {} permit holders (they do not exclude each other)",
                      s.resource, held));
  const auto rw = inspect_rwlock(svc, s.resource);
  if (rw.writer || !rw.readers.empty())
    f.add(fmt::format("{}: its read-write lock is held beside {} permit holders (they do not exclude each other)",
                      s.resource, held));
}

void judge_rwlock(redis::Client& c, LockService& svc, const RwLockInfo& rw, const DoctorOptions& o, Findings& f) {
  const std::string holders =
      rw.writer ? std::string("a writer") : fmt::format("{} reader{}", rw.readers.size(), rw.readers.size() == 1 ? "" : "s");
  if (rw.waiting_writers > 0 && rw.writer_waiting >= o.writer_wait_warn)
    f.add(fmt::format("{}: a writer has waited {} behind {} (new readers queue behind it)", rw.resource,
                      format_duration(rw.writer_waiting), holders));
  if (const auto* cc = class_of(o, rw.resource); cc && cc->lock_class.mode == LockMode::mutex)
    f.add(fmt::format("{}: held as a read-write lock, but its class '{}' declares {}", rw.resource,
                      cc->lock_class.name, cc->lock_class.permits > 0 ? "a semaphore" : "a lock"));
  if (lock_held(c, svc, rw.resource))
    f.add(fmt::format("{}: a plain lock is held beside {} (they do not exclude each other)", rw.resource, holders));
  // (A semaphore beside it is the semaphores check's finding.)
}

}  // namespace

CheckResult check_semaphores(redis::Client& c, const DoctorOptions& o) {
  auto svc = LockService::create(c, KeyBuilder(o.key_prefix));
  const auto sems = admin::list_semaphores(*svc, {.limit = o.primitives_limit});
  Findings f;
  std::size_t permits = 0;
  for (const auto& s : sems) {
    permits += s.holders.size();
    judge_semaphore(c, *svc, s, o, f);
  }
  const std::string seen = fmt::format("{} semaphore{} with live permits, {} permit{} held{}", sems.size(),
                                       sems.size() == 1 ? "" : "s", permits, permits == 1 ? "" : "s",
                                       limit_note(sems.size(), o.primitives_limit));
  if (f.seen.empty()) return {"semaphores", CheckStatus::ok, seen, {}};
  return {"semaphores", CheckStatus::warn, seen + ": " + f.text(),
          "`jobguard locks show RESOURCE` lists the holders; take one resource with one kind of lock everywhere "
          "(docs/semaphore.md)"};
}

CheckResult check_rwlocks(redis::Client& c, const DoctorOptions& o) {
  auto svc = LockService::create(c, KeyBuilder(o.key_prefix));
  const auto locks = admin::list_rwlocks(*svc, {.limit = o.primitives_limit});
  Findings f;
  for (const auto& rw : locks) judge_rwlock(c, *svc, rw, o, f);
  const std::string seen = fmt::format("{} read-write lock{} held{}", locks.size(), locks.size() == 1 ? "" : "s",
                                       limit_note(locks.size(), o.primitives_limit));
  if (f.seen.empty()) return {"rwlocks", CheckStatus::ok, seen, {}};
  return {"rwlocks", CheckStatus::warn, seen + ": " + f.text(),
          "`jobguard locks show RESOURCE` lists the readers and the writer; a reader that holds for long keeps the "
          "writer (and the readers behind it) out: shorten its hold, or release it with `locks release RESOURCE "
          "--rw --holder OWNER` (docs/rwlock.md)"};
}

}  // namespace jobguard::ops
