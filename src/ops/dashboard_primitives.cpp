// /api/primitives: the dashboard's view of the live semaphores and
// read-write locks (ops/dashboard_internal.hpp).
#include <nlohmann/json.hpp>

#include "dashboard_internal.hpp"
#include "jobguard/job/catalog.hpp"
#include "jobguard/text.hpp"

namespace jobguard::ops::dash {
namespace {

using Json = nlohmann::ordered_json;


Json optional(const std::optional<std::int64_t>& v) { return v ? Json(*v) : Json(); }

const job::CatalogClass* class_of(CatalogPtr catalog, const std::string& resource) {
  return catalog ? catalog->match(resource) : nullptr;
}

Json rw_holder(const RwHolder& h) { return Json{{"holder", shown(h.holder)}, {"ttl_left_ms", h.ttl_left.count()}}; }

Json semaphore(const SemaphoreInfo& s, CatalogPtr catalog) {
  Json holders = Json::array();
  for (const auto& h : s.holders)
    holders.push_back(Json{{"slot", h.slot}, {"holder", shown(h.holder)}, {"ttl_left_ms", h.ttl_left.count()}});
  const auto* c = class_of(catalog, s.resource);
  return Json{{"resource", shown(s.resource)},
              {"key", shown(s.key)},
              {"class", c ? Json(c->lock_class.name) : Json()},
              {"stored_permits", s.stored_permits ? Json(*s.stored_permits) : Json()},
              {"declared_permits", c && c->lock_class.permits > 0 ? Json(c->lock_class.permits) : Json()},
              {"holders", std::move(holders)},
              {"waiters", s.waiters},
              {"fence", optional(s.fence)}};
}

Json rwlock(const RwLockInfo& rw, CatalogPtr catalog) {
  Json readers = Json::array();
  for (const auto& h : rw.readers) readers.push_back(rw_holder(h));
  const auto* c = class_of(catalog, rw.resource);
  return Json{{"resource", shown(rw.resource)},
              {"class", c ? Json(c->lock_class.name) : Json()},
              {"writer", rw.writer ? rw_holder(*rw.writer) : Json()},
              {"readers", std::move(readers)},
              {"waiters", rw.waiters},
              {"waiting_writers", rw.waiting_writers},
              {"writer_waiting_ms", rw.waiting_writers > 0 ? Json(rw.writer_waiting.count()) : Json()},
              {"fence", optional(rw.fence)}};
}

}  // namespace

std::string primitives_json(const std::vector<SemaphoreInfo>& sems, const std::vector<RwLockInfo>& rws,
                            CatalogPtr catalog, bool truncated) {
  Json out;
  std::int64_t server_ms = 0;
  if (!sems.empty()) server_ms = sems.front().server_time_ms;
  else if (!rws.empty()) server_ms = rws.front().server_time_ms;
  out["server_time_ms"] = server_ms ? Json(server_ms) : Json();
  out["truncated"] = truncated;
  out["semaphores"] = Json::array();
  for (const auto& s : sems) out["semaphores"].push_back(semaphore(s, catalog));
  out["rwlocks"] = Json::array();
  for (const auto& rw : rws) out["rwlocks"].push_back(rwlock(rw, catalog));
  return out.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace jobguard::ops::dash
