#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "jobguard/job/catalog.hpp"
#include "jobguard/observe/json.hpp"
#include "jobguard/text.hpp"
#include "dashboard_internal.hpp"

namespace jobguard::ops::dash {

using observe::plan_window;
using observe::WindowPlan;

namespace {

using Json = nlohmann::ordered_json;


std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }


}  // namespace

Params::Params(std::string_view text, std::vector<std::string_view> allowed) {
  auto parsed = http::parse_form(text);
  if (!parsed) throw ApiError(400, "malformed %-escape in the parameters");
  for (auto& [k, v] : *parsed) {
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) {
      std::string names;
      for (auto a : allowed) names += (names.empty() ? "" : ", ") + std::string(a);
      throw ApiError(400, fmt::format("unknown parameter \"{}\"; this endpoint takes: {}", shown(k),
                                      names.empty() ? "none" : names));
    }
    if (has(k)) throw ApiError(400, fmt::format("parameter \"{}\" given twice", shown(k)));
    values_.emplace_back(std::move(k), std::move(v));
  }
}

bool Params::has(std::string_view name) const {
  return std::any_of(values_.begin(), values_.end(), [&](const auto& kv) { return kv.first == name; });
}

std::string Params::get(std::string_view name, std::string fallback) const {
  for (const auto& [k, v] : values_)
    if (k == name) return v;
  return fallback;
}

std::size_t Params::count(std::string_view name, std::size_t fallback, std::size_t min, std::size_t max) const {
  if (!has(name)) return fallback;
  const std::string v = get(name);
  std::size_t n = 0;
  const bool digits = !v.empty() && v.size() <= 9 && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (digits) n = std::stoul(v);
  if (!digits || n < min || n > max)
    throw ApiError(400, fmt::format("parameter \"{}\" must be a whole number in {}..{}, not \"{}\"", name, min, max,
                                    shown(v)));
  return n;
}

std::string Params::required(std::string_view name) const {
  std::string v = get(name);
  if (v.empty()) throw ApiError(400, fmt::format("parameter \"{}\" is required", name));
  return v;
}

bool token_matches(std::string_view presented, std::string_view secret) noexcept {
  // Every byte of the secret is compared, whatever `presented` holds; the
  // length difference joins the same accumulator instead of returning early.
  unsigned char diff = presented.size() == secret.size() ? 0 : 1;
  for (std::size_t i = 0; i < secret.size(); ++i) {
    const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= static_cast<unsigned char>(p ^ static_cast<unsigned char>(secret[i]));
  }
  return diff == 0 && !secret.empty();
}

void authorize(const http::Request& req, std::string_view secret) {
  if (secret.empty())
    throw ApiError(403, "actions are disabled: this server was started without an admin token (read-only)");
  const auto h = req.header("authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (!h || h->size() <= kBearer.size() || h->substr(0, kBearer.size()) != kBearer)
    throw ApiError(401, "this action needs the admin token: send Authorization: Bearer TOKEN");
  if (!token_matches(h->substr(kBearer.size()), secret)) throw ApiError(401, "wrong admin token");
}

http::Response json_response(int status, std::string body) {
  http::Response r;
  r.status = status;
  r.content_type = "application/json";
  r.body = std::move(body);
  r.body.push_back('\n');
  return r;
}

http::Response json_error(int status, std::string_view message) {
  return json_response(status, dump(Json{{"error", std::string(message)}}));
}

std::string locks_json(const admin::ListResult& res, CatalogPtr catalog, bool truncated) {
  admin::ClassOf class_of;
  if (catalog)
    class_of = [catalog](std::string_view resource) -> std::optional<admin::ClassTag> {
      const auto* c = catalog->match(resource);
      if (!c) return std::nullopt;
      return admin::ClassTag{c->lock_class.name, c->lock_class.fenced};
    };
  // The listing itself is what `jobguard locks ls --json` prints (one
  // format for every tool); the dashboard's fields are spliced in front of
  // it rather than re-serializing 10,000 locks.
  const std::string listing = admin::list_json(res, class_of);
  Json head;
  head["server_time_ms"] = res.locks.empty() ? Json() : Json(res.locks.front().server_time_ms);
  head["count"] = res.locks.size();
  head["truncated"] = truncated;
  head["classes"] = Json::array();
  if (catalog)
    for (const auto& c : catalog->classes())
      head["classes"].push_back(Json{{"class", c.lock_class.name},
                                     {"key_pattern", c.lock_class.key_pattern},
                                     {"ttl_ms", c.lock_class.ttl.count()},
                                     {"fenced", c.lock_class.fenced}});
  std::string out = dump(head);
  out.pop_back();  // '}'
  out += ',';
  out.append(listing, 1);  // without its '{'
  return out;
}

std::string classes_json(const FleetSeries& hour, WallClock::time_point now, std::chrono::minutes window,
                         CatalogPtr catalog) {
  const WindowPlan plan = plan_window(now, window);
  Json out;
  out["window_minutes"] = window.count();
  out["as_of_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  out["minutes"] = hour.minutes;
  out["classes"] = Json::array();
  std::vector<std::string> names;
  for (const auto& [name, _] : hour.classes) names.push_back(name);
  if (catalog)
    for (const auto& c : catalog->classes())
      if (!hour.classes.contains(c.lock_class.name)) names.push_back(c.lock_class.name);
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    FleetClassStats s{.lock_class = name, .counts = {}, .span_seconds = plan.span_seconds};
    Json series{{"acquisitions", Json::array()}, {"attempts", Json::array()}, {"contended", Json::array()},
                {"expired", Json::array()},      {"hold_p50_ms", Json::array()}, {"hold_p99_ms", Json::array()}};
    if (const auto it = hour.classes.find(name); it != hour.classes.end()) {
      for (std::size_t i = 0; i < it->second.size() && i < hour.minutes.size(); ++i) {
        const FleetCounts& m = it->second[i];
        if (std::find(plan.minutes.begin(), plan.minutes.end(), hour.minutes[i]) != plan.minutes.end()) s.counts += m;
        const FleetClassStats minute{.lock_class = name, .counts = m, .span_seconds = 60};
        const auto ms = [](std::optional<double> sec) { return sec ? Json(*sec * 1000) : Json(); };
        series["acquisitions"].push_back(m.acquisitions);
        series["attempts"].push_back(m.attempts);
        series["contended"].push_back(m.contended);
        series["expired"].push_back(m.expired());
        series["hold_p50_ms"].push_back(ms(minute.hold_quantile_seconds(0.5)));
        series["hold_p99_ms"].push_back(ms(minute.hold_quantile_seconds(0.99)));
        series["rate_limited"].push_back(m.rate_limited);
        series["concurrency_limited"].push_back(m.concurrency_limited);
      }
    }
    const auto* declared = catalog ? catalog->find(name) : nullptr;
    Json j = to_json(s);
    j["class"] = shown(name);
    j["declared_ttl_ms"] = declared ? Json(declared->lock_class.ttl.count()) : Json();
    j["series"] = std::move(series);
    out["classes"].push_back(std::move(j));
  }
  return dump(out);
}

std::string incidents_json(const std::vector<admin::AuditRecord>& audit, const std::vector<admin::Incident>& recorded,
                           const FleetSeries& hour, std::size_t limit) {
  std::vector<std::pair<std::int64_t, Json>> rows;
  for (const auto& a : audit)
    rows.emplace_back(a.at_ms, Json{{"at_ms", a.at_ms},
                                    {"kind", a.action},
                                    {"key", shown(a.resource)},
                                    {"job", shown(a.action == "force_release" ? a.holder : a.job)},
                                    {"who", shown(a.who)},
                                    {"reason", shown(a.reason)},
                                    {"id", a.id}});
  for (const auto& i : recorded)
    rows.emplace_back(i.at_ms, Json{{"at_ms", i.at_ms},
                                    {"kind", shown(i.kind)},
                                    {"key", shown(i.resource)},
                                    {"job", shown(i.job)},
                                    {"class", shown(i.lock_class)},
                                    {"detail", shown(i.detail)},
                                    {"id", i.id}});
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  if (rows.size() > limit) rows.resize(limit);
  Json out{{"incidents", Json::array()}, {"counts", Json::array()}};
  for (auto& [_, j] : rows) out["incidents"].push_back(std::move(j));
  for (const auto& [name, minutes] : hour.classes)
    for (std::size_t i = 0; i < minutes.size() && i < hour.minutes.size(); ++i) {
      const std::pair<const char*, std::uint64_t> kinds[] = {{"lease_lost", minutes[i].leases_lost},
                                                             {"stale_fence_rejected", minutes[i].stale_writes_rejected},
                                                             {"fail_open", minutes[i].fail_open}};
      for (const auto& [kind, n] : kinds)
        if (n > 0)
          out["counts"].push_back(
              Json{{"at_ms", hour.minutes[i] * 60000}, {"kind", kind}, {"class", shown(name)}, {"count", n}});
    }
  return dump(out);
}

namespace {
Json fields_object(const std::vector<std::pair<std::string, std::string>>& fields) {
  Json f = Json::object();
  for (const auto& [k, v] : fields) f[shown(k)] = shown(v);
  return f;
}

Json dead_object(const job::DeadLetter& d) {
  return Json{{"id", d.id},
              {"source_id", d.source_id},
              {"attempts", d.attempts},
              {"last_error", shown(d.last_error)},
              {"fields", fields_object(d.fields)}};
}
}  // namespace

std::string lock_state_json(const std::vector<LockStateServer>& servers, bool cluster) {
  auto at = [](std::int64_t ms) { return ms > 0 ? Json(ms) : Json(); };
  Json out{{"cluster", cluster}, {"servers", Json::array()}};
  for (const auto& s : servers) {
    const bool q = s.quarantined();
    out["servers"].push_back({{"address", s.address},
                              {"server_time_ms", s.server_time_ms},
                              {"record", s.record},
                              {"quarantined", q},
                              {"quarantine_until_ms", q ? Json(s.quarantine_until_ms) : Json()},
                              {"quarantine_left_ms", q ? Json(s.quarantine_until_ms - s.server_time_ms) : Json()},
                              {"reason", q ? Json(shown(s.reason)) : Json()},
                              {"clock_steps", s.clock_steps},
                              {"last_step_ms", s.clock_steps > 0 ? Json(s.last_step_ms) : Json()},
                              {"last_step_at_ms", s.clock_steps > 0 ? at(s.last_step_at_ms) : Json()},
                              {"maxmemory_policy", s.maxmemory_policy},
                              {"maxmemory", s.maxmemory},
                              {"evicting", s.evicting()},
                              {"evicted_keys", s.evicted_keys}});
  }
  return dump(out);
}

std::string jobs_json(const std::vector<StreamView>& streams) {
  Json out{{"streams", Json::array()}};
  for (const auto& s : streams) {
    Json j{{"stream", shown(s.stream)}, {"group", shown(s.group)},          {"dead_letter", shown(s.dead_letter)},
           {"length", s.length},        {"pending_count", s.pending_count}, {"dead_count", s.dead_count}};
    j["pending"] = Json::array();
    for (const auto& p : s.pending)
      j["pending"].push_back(Json{
          {"id", p.id}, {"consumer", shown(p.consumer)}, {"idle_ms", p.idle.count()}, {"deliveries", p.deliveries}});
    j["dead"] = Json::array();
    for (const auto& d : s.dead) j["dead"].push_back(dead_object(d));
    j["error"] = s.error.empty() ? Json() : Json(shown(s.error));
    out["streams"].push_back(std::move(j));
  }
  return dump(out);
}

std::string dead_letter_json(const std::string& stream, const job::DeadLetter& d) {
  Json j = dead_object(d);
  j["stream"] = shown(stream);
  return dump(j);
}

}  // namespace jobguard::ops::dash
