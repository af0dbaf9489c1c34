// What `jobguard locks` prints, as text and as JSON: kept in the library so
// the CLI stays a thin layer and every tool shows the same columns.
#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <nlohmann/json.hpp>

#include "jobguard/admin.hpp"
#include "jobguard/duration.hpp"

namespace jobguard::admin {
namespace {

using Json = nlohmann::ordered_json;

// A key with no TTL (which no jobguard client writes) reports -1 ms.
std::string ttl_text(std::chrono::milliseconds d) { return d.count() < 0 ? "none" : format_duration(d); }

template <class T>
Json or_null(const std::optional<T>& v) {
  return v ? Json(*v) : Json();
}

Json info_object(const LockInfo& i, const ClassOf& class_of) {
  Json j;
  j["resource"] = i.resource;
  j["key"] = i.key;
  j["held"] = i.held;
  j["holder"] = i.holder;
  j["ttl_left_ms"] = i.ttl_left.count();
  j["fence"] = or_null(i.fence);
  j["fence_age_ms"] = i.fence_age ? Json(i.fence_age->count()) : Json();
  j["waiters"] = i.waiters;
  if (class_of) {
    const auto c = class_of(i.resource);
    j["class"] = c ? Json(c->name) : Json();
  }
  return j;
}

// The age column: the fence's age, unless the class is known not to be fenced
// (then the fence is some earlier holder's, not this one's).
std::string age_text(const LockInfo& i, const std::optional<ClassTag>& c) {
  if (!i.fence_age || (c && !c->fenced)) return "-";
  return format_duration(*i.fence_age);
}

const char* outcome_name(ForceReleaseResult::Outcome o) {
  switch (o) {
    case ForceReleaseResult::Outcome::released: return "released";
    case ForceReleaseResult::Outcome::not_held: return "not_held";
    case ForceReleaseResult::Outcome::holder_changed: return "holder_changed";
  }
  return "?";
}

}  // namespace

std::string parse_resource(const KeyBuilder& keys, std::string_view key_or_resource) {
  if (auto r = keys.resource_of(key_or_resource)) return *r;
  KeyBuilder::validate_resource(key_or_resource);
  return std::string(key_or_resource);
}

std::string format_list(const ListResult& res, const ClassOf& class_of) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"RESOURCE", "HOLDER", "AGE", "TTL_LEFT", "FENCE", "WAITERS"});
  if (class_of) rows.front().push_back("CLASS");
  for (const auto& i : res.locks) {
    const auto c = class_of ? class_of(i.resource) : std::nullopt;
    rows.push_back({i.resource, i.holder, age_text(i, c), ttl_text(i.ttl_left),
                    i.fence ? std::to_string(*i.fence) : "-", std::to_string(i.waiters)});
    if (class_of) rows.back().push_back(c ? c->name : "-");
  }
  std::vector<std::size_t> width(rows.front().size(), 0);
  for (const auto& r : rows)
    for (std::size_t k = 0; k < r.size(); ++k) width[k] = std::max(width[k], r[k].size());
  std::string out;
  for (const auto& r : rows) {
    for (std::size_t k = 0; k < r.size(); ++k)
      out += k + 1 == r.size() ? r[k] : fmt::format("{:<{}}  ", r[k], width[k]);
    out += "\n";
  }
  const auto n = res.locks.size();
  const auto calls = res.stats.scan_calls;
  out += fmt::format("{} lock{} ({} SCAN round trip{})\n", n, n == 1 ? "" : "s", calls, calls == 1 ? "" : "s");
  return out;
}

std::string format_info(const LockInfo& i) {
  std::string out = fmt::format("resource  {}\nkey       {}\n", i.resource, i.key);
  if (!i.held) out += "holder    (none: not held)\n";
  else out += fmt::format("holder    {}\nttl left  {}\n", i.holder, ttl_text(i.ttl_left));
  out += fmt::format("fence     {}\n", i.fence ? std::to_string(*i.fence) : "(none issued)");
  if (i.fence_age)
    out += fmt::format("fence age {} (the holder's age if it is fenced)\n", format_duration(*i.fence_age));
  out += fmt::format("waiters   {} (fair queue)\n", i.waiters);
  return out;
}

std::string format_release(std::string_view resource, const ForceReleaseResult& r,
                           std::string_view expected_holder) {
  switch (r.outcome) {
    case ForceReleaseResult::Outcome::released:
      return fmt::format("released {} (holder {}, {} left); fence advanced to {}; audit entry {}\n{}", resource,
                         r.holder, ttl_text(r.ttl_left), r.new_fence, r.audit_id,
                         r.unconfirmed.empty()
                             ? std::string()
                             : fmt::format("warning: not confirmed by replicas: {}; a failover now may bring "
                                           "back the old holder's lock and fence\n",
                                           r.unconfirmed));
    case ForceReleaseResult::Outcome::not_held:
      return fmt::format("{} is not held: nothing released\n", resource);
    case ForceReleaseResult::Outcome::holder_changed:
      break;
  }
  return fmt::format("{} is held by {}, not {}: nothing released\n", resource, r.holder, expected_holder);
}

std::string format_audit(const std::vector<AuditRecord>& records) {
  if (records.empty()) return "no force releases recorded\n";
  std::string out;
  for (const auto& r : records) {
    // Entry ids are server times: shown in UTC, as the event log's timestamps.
    const std::time_t t = static_cast<std::time_t>(r.at_ms / 1000);
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    char when[32];
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    if (r.action == "force_release")
      out += fmt::format("{}.{:03}Z  {}  by {}  removed {} ({} ms left), fence -> {}: {}\n", when, r.at_ms % 1000,
                         r.resource, r.who, r.holder, r.ttl_left_ms, r.fence, r.reason);
    else
      out += fmt::format("{}.{:03}Z  {}  by {}  {} {}: {}\n", when, r.at_ms % 1000, r.resource, r.who, r.action,
                         r.job, r.reason);
  }
  return out;
}

std::string list_json(const ListResult& res, const ClassOf& class_of) {
  Json j;
  j["locks"] = Json::array();
  for (const auto& i : res.locks) j["locks"].push_back(info_object(i, class_of));
  j["scan_calls"] = res.stats.scan_calls;
  j["keys_matched"] = res.stats.keys_matched;
  return j.dump();
}

std::string info_json(const LockInfo& info) { return info_object(info, {}).dump(); }

std::string release_json(std::string_view resource, const ForceReleaseResult& r) {
  Json j;
  j["resource"] = resource;
  j["outcome"] = outcome_name(r.outcome);
  j["holder"] = r.holder;
  if (r.outcome == ForceReleaseResult::Outcome::released) {
    j["ttl_left_ms"] = r.ttl_left.count();
    j["fence"] = r.new_fence;
    j["audit_id"] = r.audit_id;
    if (!r.unconfirmed.empty()) j["unconfirmed"] = r.unconfirmed;
  }
  return j.dump();
}

std::string audit_json(const std::vector<AuditRecord>& records) {
  auto arr = Json::array();
  for (const auto& r : records)
    arr.push_back({{"id", r.id}, {"at_ms", r.at_ms}, {"action", r.action}, {"resource", r.resource},
                   {"holder", r.holder}, {"who", r.who}, {"reason", r.reason}, {"fence", r.fence},
                   {"ttl_left_ms", r.ttl_left_ms}, {"job", r.job}});
  return Json{{"releases", arr}}.dump();
}

}  // namespace jobguard::admin
