// The dashboard's I/O half: a worker thread that does the Redis work of each
// API request and answers it, and the routes. What the answers contain is
// built by the pure code in dashboard_json.cpp.
#include "jobguard/ops/dashboard.hpp"

#include <fmt/format.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "jobguard/admin.hpp"
#include "jobguard/error.hpp"
#include "jobguard/job/catalog.hpp"
#include "jobguard/job/stream_source.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/fleet.hpp"
#include "jobguard/rwlock.hpp"
#include "jobguard/semaphore.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/text.hpp"
#include "dashboard_internal.hpp"

namespace jobguard {
namespace dashboard_assets {
extern const std::string_view index;
extern const std::string_view app;
extern const std::string_view style;
}  // namespace dashboard_assets

namespace ops {

using observe::FleetReader;
using observe::FleetReaderOptions;
using observe::parse_window;
using observe::WallClock;

namespace {

using dash::ApiError;
using dash::json_error;
using dash::json_response;
using dash::Params;

// Semaphores and read-write locks one /api/primitives answer lists at most
// (each): every one costs an inspect script, unlike a lock of /api/locks.
constexpr std::size_t kMaxPrimitives = 1000;

http::Response asset(std::string_view body, const char* type) {
  http::Response r;
  r.content_type = type;
  r.body = std::string(body);
  // The page runs nothing from elsewhere: no CDN, no inline script, no frames.
  r.headers.emplace_back("Content-Security-Policy",
                         "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'");
  r.headers.emplace_back("X-Content-Type-Options", "nosniff");
  return r;
}

}  // namespace

struct Dashboard::Impl {
  Impl(redis::Client& c, DashboardOptions o)
      : client(c), opt(std::move(o)), keys(opt.prefix), locks(LockService::create(client, keys)),
        fleet(client, FleetReaderOptions{.prefix = opt.prefix, .timeout = std::chrono::milliseconds(3000),
                                         .max_classes = 1000, .now = {}}) {
    if (opt.max_locks == 0) throw Error(errc::invalid_argument, "dashboard: max_locks must be >= 1");
    if (opt.max_queue == 0) throw Error(errc::invalid_argument, "dashboard: max_queue must be >= 1");
    for (const auto& s : opt.streams)
      streams.emplace(s, std::make_unique<job::StreamSource>(client, job::StreamOptions{.stream = s, .group = opt.group}));
    who = (opt.who.empty() ? admin::default_who() : opt.who) + " via dashboard";
    worker = std::thread([this] { run(); });
  }

  ~Impl() {
    std::deque<std::function<void(bool)>> left;
    {
      std::lock_guard g(mu);
      stopping = true;
      left.swap(queue);
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
    for (auto& task : left) task(false);
  }

  // Queues `work` for the worker thread; it answers through `respond`. An
  // ApiError becomes its status, a jobguard::Error of bad input a 400, any
  // other (Redis down, a deadline) a 503 naming it.
  void submit(http::Respond respond, std::function<http::Response()> work) {
    auto task = [respond, work = std::move(work)](bool run) {
      if (!run) return respond(json_error(503, "the dashboard is shutting down"));
      try {
        respond(work());
      } catch (const ApiError& e) {
        respond(json_error(e.status, e.what()));
      } catch (const Error& e) {
        const bool bad_input = e.code() == make_error_code(errc::invalid_argument);
        respond(json_error(bad_input ? 400 : 503, escape_text(e.what(), 512)));
      } catch (const std::exception& e) {
        respond(json_error(503, escape_text(e.what(), 512)));
      }
    };
    {
      std::lock_guard g(mu);
      if (!stopping && queue.size() < opt.max_queue) {
        queue.push_back(std::move(task));
        cv.notify_one();
        return;
      }
    }
    respond(json_error(503, "the dashboard is busy: too many requests waiting for Redis"));
  }

  void run() {
    for (;;) {
      std::function<void(bool)> task;
      {
        std::unique_lock g(mu);
        cv.wait(g, [&] { return stopping || !queue.empty(); });
        if (stopping) return;
        task = std::move(queue.front());
        queue.pop_front();
      }
      task(true);
    }
  }

  // --- the endpoints (worker thread) -----------------------------------------

  http::Response config() const {
    nlohmann::ordered_json j;
    j["prefix"] = opt.prefix;
    j["actions"] = !opt.admin_token.empty();
    j["catalog"] = opt.catalog ? nlohmann::ordered_json(opt.catalog->source()) : nlohmann::ordered_json();
    j["streams"] = opt.streams;
    j["group"] = opt.group;
    return json_response(200, j.dump());
  }

  // The resources of catalog class `cls`, by its key pattern.
  std::function<bool(std::string_view)> class_filter(const std::string& cls) const {
    if (!opt.catalog) throw ApiError(400, "class filter needs a catalog: start serve with --catalog FILE");
    const auto* c = opt.catalog->find(cls);
    if (!c) throw ApiError(400, fmt::format("no lock class \"{}\" in {}", escape_text(cls, 128), opt.catalog->source()));
    return [pattern = c->lock_class.key_pattern](std::string_view r) { return job::key_pattern_matches(pattern, r); };
  }

  http::Response list(const http::Request& req) {
    const Params p(req.query, {"prefix", "class", "limit"});
    const std::string prefix = p.get("prefix"), cls = p.get("class");
    const std::size_t limit = p.count("limit", opt.max_locks, 1, opt.max_locks);
    admin::ListOptions lo;
    lo.prefix = prefix;
    lo.limit = limit + 1;  // one more says "truncated"
    if (!cls.empty()) lo.filter = class_filter(cls);
    return cached(fmt::format("locks\n{}\n{}\n{}", prefix, cls, limit), [&] {
      auto res = admin::list_locks(*locks, lo);
      const bool truncated = res.locks.size() > limit;
      if (truncated) res.locks.resize(limit);
      return dash::locks_json(res, opt.catalog.get(), truncated);
    });
  }

  // An answer reused for opt.cache for the same query: ten open pages cost
  // Redis one listing a second, not ten.
  template <class Make>
  http::Response cached(const std::string& key, Make make) {
    const auto now = std::chrono::steady_clock::now();
    if (auto it = cache.find(key); it != cache.end() && now - it->second.first < opt.cache)
      return json_response(200, it->second.second);
    std::string body = make();
    if (opt.cache.count() > 0) {
      if (cache.size() > 16) cache.clear();
      cache[key] = {now, body};
    }
    return json_response(200, std::move(body));
  }

  http::Response one_lock(const http::Request& req) {
    const Params p(req.query, {"resource"});
    const std::string resource = resource_param(p);
    const LockInfo info = locks->inspect(resource);
    auto j = nlohmann::ordered_json::parse(admin::info_json(info));
    // The fair queue in order, each waiter shown as its token's owner. An
    // entry is "<ttl> <fence> <grant channel> <token>" (acquire.lua).
    auto q = client.exec(redis::Command{"LRANGE", keys.queue_key(resource), "0", "49"});
    j["queue"] = nlohmann::ordered_json::array();
    for (const auto& e : q.elements) {
      std::string_view token = e.str;
      for (int field = 0; field < 3; ++field) {
        const auto sp = token.find(' ');
        token = sp == std::string_view::npos ? std::string_view() : token.substr(sp + 1);
      }
      j["queue"].push_back(escape_text(token_owner(token.empty() ? std::string_view(e.str) : token), 256));
    }
    if (opt.catalog)
      if (const auto* c = opt.catalog->match(resource)) {
        j["class"] = c->lock_class.name;
        j["declared_ttl_ms"] = c->lock_class.ttl.count();
      }
    return json_response(200, j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
  }

  http::Response primitives(const http::Request& req) {
    const Params p(req.query, {"prefix", "class", "limit"});
    admin::ListOptions lo;
    lo.prefix = p.get("prefix");
    const std::size_t limit = p.count("limit", kMaxPrimitives, 1, kMaxPrimitives);
    lo.limit = limit + 1;  // one more says "truncated"
    if (const std::string cls = p.get("class"); !cls.empty()) lo.filter = class_filter(cls);
    return cached(fmt::format("primitives\n{}\n{}\n{}", lo.prefix, p.get("class"), limit), [&] {
      auto sems = admin::list_semaphores(*locks, lo);
      auto rws = admin::list_rwlocks(*locks, lo);
      const bool truncated = sems.size() > limit || rws.size() > limit;
      if (sems.size() > limit) sems.resize(limit);
      if (rws.size() > limit) rws.resize(limit);
      return dash::primitives_json(sems, rws, opt.catalog.get(), truncated);
    });
  }

  http::Response lock_state(const http::Request& req) {
    const Params p(req.query, {});
    return cached("lock-state", [&] { return dash::lock_state_json(read_lock_state(client), client.options().cluster); });
  }

  http::Response classes(const http::Request& req) {
    const Params p(req.query, {"window"});
    std::chrono::minutes window{5};
    try {
      if (p.has("window")) window = parse_window(p.get("window"));
    } catch (const Error& e) {
      throw ApiError(400, e.what());
    }
    const auto series = fleet.series(std::chrono::minutes(60));
    return json_response(200, dash::classes_json(series, WallClock::now(), window, opt.catalog.get()));
  }

  http::Response incidents(const http::Request& req) {
    const Params p(req.query, {"limit"});
    const std::size_t limit = p.count("limit", 200, 1, 10000);
    const auto audit = admin::read_audit(*locks, limit);
    const auto recorded = admin::read_incidents(*locks, limit);
    const auto series = fleet.series(std::chrono::minutes(60));
    return json_response(200, dash::incidents_json(audit, recorded, series, limit));
  }

  job::StreamSource& stream_param(const Params& p) {
    const std::string name = p.required("stream");
    const auto it = streams.find(name);
    if (it == streams.end())
      throw ApiError(404, fmt::format("stream \"{}\" is not shown here; start serve with --stream {}",
                                      escape_text(name, 128), escape_text(name, 128)));
    return *it->second;
  }

  http::Response jobs(const http::Request& req) {
    const Params p(req.query, {"count"});
    const std::size_t count = p.count("count", 50, 1, 1000);
    std::vector<dash::StreamView> views;
    for (const auto& [name, src] : streams) {
      dash::StreamView v{.stream = name, .group = opt.group, .dead_letter = src->dead_letter_stream()};
      try {
        v.length = src->length(name);
        v.dead_count = src->length(src->dead_letter_stream());
        v.dead = src->dead_letters(count);
        v.pending_count = src->pending_count();
        v.pending = src->pending(count);
      } catch (const Error& e) {
        // No group yet (no worker ever started) is a state to show, not a failure.
        v.error = e.what();
      }
      views.push_back(std::move(v));
    }
    return json_response(200, dash::jobs_json(views));
  }

  http::Response dead(const http::Request& req) {
    const Params p(req.query, {"stream", "id"});
    auto& src = stream_param(p);
    const auto d = src.dead_letter_entry(p.required("id"));
    if (!d) throw ApiError(404, fmt::format("no dead letter {} in {}", escape_text(p.get("id"), 64), src.dead_letter_stream()));
    return json_response(200, dash::dead_letter_json(src.options().stream, *d));
  }

  std::string resource_param(const Params& p) const {
    try {
      return admin::parse_resource(keys, p.required("resource"));
    } catch (const Error& e) {
      throw ApiError(400, e.what());
    }
  }

  // Actions: authorized by the route before they are queued.
  http::Response release(const http::Request& req) {
    const Params p(req.body, {"resource", "reason", "holder"});
    const std::string resource = resource_param(p);
    admin::ForceReleaseOptions fo;
    fo.reason = p.required("reason");
    fo.expect_holder = p.get("holder");
    fo.who = who;
    const auto r = admin::force_release(*locks, resource, fo);
    cache.clear();  // the next listing must not show the lock just released
    const int status = r.outcome == admin::ForceReleaseResult::Outcome::holder_changed ? 409 : 200;
    return json_response(status, admin::release_json(resource, r));
  }

  http::Response retry(const http::Request& req) {
    const Params p(req.body, {"stream", "id", "reason"});
    auto& src = stream_param(p);
    const std::string id = p.required("id"), reason = p.required("reason");
    const auto new_id = src.retry_dead_letter(id);
    if (!new_id) throw ApiError(404, fmt::format("no dead letter {} in {}", escape_text(id, 64), src.dead_letter_stream()));
    admin::AuditRecord a;
    a.action = "retry_dead_letter";
    a.resource = src.options().stream;
    a.job = id + " -> " + *new_id;
    a.who = who;
    a.reason = reason;
    const std::string audit_id = admin::append_audit(*locks, a);
    nlohmann::ordered_json j{{"stream", src.options().stream}, {"dead_id", id}, {"new_id", *new_id}, {"audit_id", audit_id}};
    return json_response(200, j.dump());
  }

  redis::Client& client;
  DashboardOptions opt;
  KeyBuilder keys;
  std::shared_ptr<LockService> locks;
  FleetReader fleet;
  std::map<std::string, std::unique_ptr<job::StreamSource>, std::less<>> streams;
  std::string who;
  // Worker thread only.
  std::map<std::string, std::pair<std::chrono::steady_clock::time_point, std::string>> cache;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void(bool)>> queue;
  bool stopping = false;
  std::thread worker;  // last: started once everything above exists
};

Dashboard::Dashboard(redis::Client& client, DashboardOptions options)
    : impl_(std::make_unique<Impl>(client, std::move(options))) {}

Dashboard::~Dashboard() = default;

bool Dashboard::actions_enabled() const noexcept { return !impl_->opt.admin_token.empty(); }

std::vector<http::Route> Dashboard::routes() {
  Impl* m = impl_.get();
  std::vector<http::Route> out;
  auto page = [&out](std::string path, std::string_view body, const char* type) {
    out.push_back({std::move(path), {"GET"}, [body, type](const http::Request&, const http::Respond& respond) {
                     respond(asset(body, type));
                   }});
  };
  page("/", dashboard_assets::index, "text/html; charset=utf-8");
  page("/app.js", dashboard_assets::app, "text/javascript; charset=utf-8");
  page("/style.css", dashboard_assets::style, "text/css; charset=utf-8");
  using Member = http::Response (Impl::*)(const http::Request&);
  auto api = [&out, m](std::string path, const char* method, Member fn) {
    const bool action = std::string_view(method) == "POST";
    out.push_back({std::move(path), {method}, [m, fn, action](const http::Request& req, const http::Respond& respond) {
                     // Refused at once, on the server thread: a request without
                     // the token never queues behind Redis work or touches Redis.
                     if (action) {
                       try {
                         dash::authorize(req, m->opt.admin_token);
                       } catch (const ApiError& e) {
                         return respond(json_error(e.status, e.what()));
                       }
                     }
                     // The request lives only for this call: the worker gets a copy.
                     m->submit(respond, [m, fn, req] { return (m->*fn)(req); });
                   }});
  };
  out.push_back({"/api/config", {"GET"}, [m](const http::Request&, const http::Respond& respond) {
                   respond(m->config());
                 }});
  api("/api/locks", "GET", &Impl::list);
  api("/api/lock", "GET", &Impl::one_lock);
  api("/api/primitives", "GET", &Impl::primitives);
  api("/api/lock-state", "GET", &Impl::lock_state);
  api("/api/classes", "GET", &Impl::classes);
  api("/api/incidents", "GET", &Impl::incidents);
  api("/api/jobs", "GET", &Impl::jobs);
  api("/api/dead", "GET", &Impl::dead);
  api("/api/locks/release", "POST", &Impl::release);
  api("/api/jobs/retry", "POST", &Impl::retry);
  return out;
}

}  // namespace ops
}  // namespace jobguard
