// The dashboard's pure half: parameters, the token check, the JSON the API
// answers (tests/cli/ops/dashboard_cli_test.cpp runs the real server).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "jobguard/job/catalog.hpp"
#include "ops/dashboard_internal.hpp"

namespace jobguard::ops::dash {
namespace {

using nlohmann::json;

int status_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return e.status;
  }
  return 0;
}

TEST(DashboardParams, UnknownRepeatedOrMalformedParametersAre400) {
  EXPECT_EQ(status_of([] { Params("limt=5", {"limit"}); }), 400);
  EXPECT_EQ(status_of([] { Params("limit=5&limit=6", {"limit"}); }), 400);
  EXPECT_EQ(status_of([] { Params("limit=%", {"limit"}); }), 400);
  const Params p("limit=25&prefix=inv%3A", {"limit", "prefix", "class"});
  EXPECT_EQ(p.get("prefix"), "inv:");
  EXPECT_EQ(p.get("class", "all"), "all");
  EXPECT_EQ(p.count("limit", 1, 1, 100), 25u);
  EXPECT_EQ(p.count("other", 7, 1, 100), 7u);
  for (const char* bad : {"limit=0", "limit=101", "limit=-1", "limit=1e3", "limit=", "limit=99999999999"}) {
    const Params q(bad, {"limit"});
    EXPECT_EQ(status_of([&] { q.count("limit", 1, 1, 100); }), 400) << bad;
  }
  EXPECT_EQ(status_of([] { Params("", {"reason"}).required("reason"); }), 400);
}

TEST(DashboardToken, MatchesOnlyTheWholeSecret) {
  EXPECT_TRUE(token_matches("0123456789abcdef", "0123456789abcdef"));
  EXPECT_FALSE(token_matches("0123456789abcdeX", "0123456789abcdef"));
  EXPECT_FALSE(token_matches("0123456789abcde", "0123456789abcdef"));
  EXPECT_FALSE(token_matches("0123456789abcdef0", "0123456789abcdef"));
  EXPECT_FALSE(token_matches("", "0123456789abcdef"));
  EXPECT_FALSE(token_matches("", "")) << "no secret configured must never match";
  // A prefix padded with NULs compares against the secret's bytes, not as equal.
  EXPECT_FALSE(token_matches(std::string("0123456789abcde\0", 16), "0123456789abcdef"));
}

TEST(DashboardToken, AuthorizeIs403WithoutASecretAnd401WithoutTheRightBearer) {
  http::Request req;
  EXPECT_EQ(status_of([&] { authorize(req, ""); }), 403);
  EXPECT_EQ(status_of([&] { authorize(req, "0123456789abcdef"); }), 401);
  req.headers.emplace_back("authorization", "Basic 0123456789abcdef");
  EXPECT_EQ(status_of([&] { authorize(req, "0123456789abcdef"); }), 401);
  req.headers[0].second = "Bearer 0123456789abcdef";
  EXPECT_EQ(status_of([&] { authorize(req, "0123456789abcdef"); }), 0);
  EXPECT_EQ(status_of([&] { authorize(req, ""); }), 403) << "a token means nothing on a read-only server";
}

TEST(DashboardJson, ErrorsAreOneLineJson) {
  const auto r = json_error(400, "bad \"x\"\nsecond line");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.content_type, "application/json");
  EXPECT_EQ(r.body.find('\n'), r.body.size() - 1);
  EXPECT_EQ(json::parse(r.body).at("error"), "bad \"x\"\nsecond line");
}

TEST(DashboardJson, LocksCarryTheListingAndTheCatalogsClasses) {
  admin::ListResult res;
  LockInfo i;
  i.resource = "invoice:1";
  i.key = "jobguard:lock:{invoice:1}";
  i.held = true;
  i.holder = "web-3/4121/charge";
  i.ttl_left = std::chrono::milliseconds(1500);
  i.fence = 42;
  i.server_time_ms = 1700000000000;
  res.locks.push_back(i);
  res.stats.scan_calls = 2;
  const auto catalog = job::Catalog::parse(R"(classes:
  - name: invoice-charge
    key: "invoice:{id}"
    owner: billing
    protects: one charge per invoice
    consequence: low
    ttl: 30s
    renewal: false
    hard_timeout: none
    fencing: false
    on_redis_down: fail-closed
    fallback: retried later
)", "test.yaml");
  const auto j = json::parse(locks_json(res, &catalog, true));
  EXPECT_EQ(j.at("count"), 1);
  EXPECT_EQ(j.at("truncated"), true);
  EXPECT_EQ(j.at("server_time_ms"), 1700000000000);
  EXPECT_EQ(j.at("scan_calls"), 2);
  EXPECT_EQ(j.at("classes").at(0).at("ttl_ms"), 30000);
  EXPECT_EQ(j.at("locks").at(0).at("class"), "invoice-charge");
  EXPECT_EQ(j.at("locks").at(0).at("holder"), "web-3/4121/charge");
  EXPECT_EQ(json::parse(locks_json(admin::ListResult{}, nullptr, false)).at("locks"), json::array());
}

TEST(DashboardJson, PrimitivesShowHoldersPerPermitReadersTheWriterAndTheirClasses) {
  SemaphoreInfo s;
  s.resource = "psp:acme";
  s.key = "jobguard:sem:{psp:acme}";
  s.stored_permits = 2;
  s.holders = {{"web-1/10/pay", 0, std::chrono::milliseconds(900)}, {"web-2/11/pay", 1, std::chrono::milliseconds(400)}};
  s.waiters = 3;
  s.fence = 7;
  s.server_time_ms = 1700000000000;
  RwLockInfo rw;
  rw.resource = "book:1";
  rw.readers = {{"t1", "web-1/12/report", std::chrono::milliseconds(800)}};
  rw.waiters = 1;
  rw.waiting_writers = 1;
  rw.writer_waiting = std::chrono::milliseconds(2500);
  RwLockInfo w;
  w.resource = "book:2";
  w.writer = RwHolder{"t2", "web-3/13/rebuild", std::chrono::milliseconds(300)};
  const auto catalog = job::Catalog::parse(R"(classes:
  - {name: psp, key: "psp:{id}", owner: o, protects: p, consequence: low, ttl: 30s, renewal: false,
     hard_timeout: none, fencing: false, on_redis_down: fail-closed, fallback: f, permits: 5}
  - {name: report, key: "book:{id}", owner: o, protects: p, consequence: low, ttl: 30s, renewal: false,
     hard_timeout: none, fencing: false, on_redis_down: fail-closed, fallback: f, mode: shared})", "test.yaml");
  const auto j = json::parse(primitives_json({s}, {rw, w}, &catalog, false));
  EXPECT_EQ(j.at("server_time_ms"), 1700000000000);
  EXPECT_EQ(j.at("truncated"), false);
  const auto& sj = j.at("semaphores").at(0);
  EXPECT_EQ(sj.at("class"), "psp");
  EXPECT_EQ(sj.at("stored_permits"), 2);
  EXPECT_EQ(sj.at("declared_permits"), 5);
  EXPECT_EQ(sj.at("holders").size(), 2u);
  EXPECT_EQ(sj.at("holders").at(1).at("slot"), 1);
  EXPECT_EQ(sj.at("holders").at(1).at("holder"), "web-2/11/pay");
  EXPECT_EQ(sj.at("waiters"), 3);
  EXPECT_EQ(sj.at("fence"), 7);
  const auto& r1 = j.at("rwlocks").at(0);
  EXPECT_EQ(r1.at("class"), "report");
  EXPECT_TRUE(r1.at("writer").is_null());
  EXPECT_EQ(r1.at("readers").at(0).at("holder"), "web-1/12/report");
  EXPECT_EQ(r1.at("writer_waiting_ms"), 2500);
  EXPECT_EQ(j.at("rwlocks").at(1).at("writer").at("holder"), "web-3/13/rebuild");
  EXPECT_TRUE(j.at("rwlocks").at(1).at("writer_waiting_ms").is_null());
  const auto none = json::parse(primitives_json({}, {}, nullptr, true));
  EXPECT_EQ(none.at("semaphores"), json::array());
  EXPECT_TRUE(none.at("server_time_ms").is_null());
  EXPECT_EQ(none.at("truncated"), true);
}

TEST(DashboardJson, LockStateSaysWhyAndUntilWhenAQuarantineRefusesGrantsAndWhichPrimaryStepped) {
  LockStateServer q{.address = "10.0.0.1:6379", .record = true, .epoch = "e1", .server_time_ms = 1700000000000,
                    .quarantine_until_ms = 1700000045000, .reason = "no lock-state record: restarted",
                    .maxmemory_policy = "noeviction"};
  LockStateServer stepped{.address = "10.0.0.2:6379", .record = true, .server_time_ms = 1700000000000,
                          .quarantine_until_ms = 1699999990000, .reason = "the server clock stepped forward",
                          .clock_steps = 2, .last_step_ms = 3001, .last_step_at_ms = 1699999930000,
                          .maxmemory_policy = "allkeys-lru", .maxmemory = 1 << 20, .evicted_keys = 12};
  const auto j = json::parse(lock_state_json({q, stepped}, true));
  EXPECT_EQ(j.at("cluster"), true);
  const auto& a = j.at("servers").at(0);
  EXPECT_EQ(a.at("address"), "10.0.0.1:6379");
  EXPECT_EQ(a.at("quarantined"), true);
  EXPECT_EQ(a.at("quarantine_until_ms"), 1700000045000);
  EXPECT_EQ(a.at("quarantine_left_ms"), 45000);
  EXPECT_EQ(a.at("reason"), "no lock-state record: restarted");
  EXPECT_EQ(a.at("clock_steps"), 0);
  EXPECT_TRUE(a.at("last_step_ms").is_null());
  EXPECT_EQ(a.at("evicting"), false);
  // A quarantine that is over is not shown, nor its reason.
  const auto& b = j.at("servers").at(1);
  EXPECT_EQ(b.at("quarantined"), false);
  EXPECT_TRUE(b.at("quarantine_until_ms").is_null());
  EXPECT_TRUE(b.at("reason").is_null());
  EXPECT_EQ(b.at("clock_steps"), 2);
  EXPECT_EQ(b.at("last_step_ms"), 3001);
  EXPECT_EQ(b.at("last_step_at_ms"), 1699999930000);
  EXPECT_EQ(b.at("maxmemory_policy"), "allkeys-lru");
  EXPECT_EQ(b.at("evicting"), true);
  EXPECT_EQ(b.at("evicted_keys"), 12);
}

TEST(DashboardJson, IncidentsMergeAuditAndRecordsNewestFirstBesideTheFleetsCounts) {
  FleetSeries hour;
  hour.minutes = {1000, 1001};
  FleetCounts lost;
  lost.leases_lost = 2;
  FleetCounts open;
  open.fail_open = 1;
  open.stale_writes_rejected = 3;
  hour.classes["billing"] = {lost, open};
  admin::AuditRecord a;
  a.at_ms = 1000 * 60000 + 30000;
  a.resource = "invoice:1";
  a.holder = "web-3/1/x";
  a.who = "ops@host via dashboard";
  a.reason = "gone";
  admin::Incident older{.id = "1-0", .at_ms = 1000 * 60000 + 10000, .kind = "lease_lost", .resource = "invoice:1",
                        .job = "web-3/1/x", .lock_class = "billing", .detail = "key gone"};
  admin::Incident newer = older;
  newer.at_ms += 40000;
  newer.kind = "fail_open";
  const auto j = json::parse(incidents_json({a}, {newer, older}, hour, 10));
  const auto& inc = j.at("incidents");
  ASSERT_EQ(inc.size(), 3u);
  EXPECT_EQ(inc[0].at("kind"), "fail_open");
  EXPECT_EQ(inc[1].at("kind"), "force_release");
  EXPECT_EQ(inc[1].at("job"), "web-3/1/x");
  EXPECT_EQ(inc[2].at("kind"), "lease_lost");
  EXPECT_EQ(inc[2].at("key"), "invoice:1");
  const auto& counts = j.at("counts");
  ASSERT_EQ(counts.size(), 3u);
  EXPECT_EQ(counts[0].at("kind"), "lease_lost");
  EXPECT_EQ(counts[0].at("count"), 2);
  EXPECT_EQ(counts[0].at("at_ms"), 1000 * 60000);
  EXPECT_EQ(json::parse(incidents_json({a}, {newer, older}, hour, 1)).at("incidents").size(), 1u);
}

TEST(DashboardJson, ClassesSumTheWindowAndKeepAPointPerMinute) {
  const auto now = WallClock::time_point(std::chrono::minutes(1010) + std::chrono::seconds(30));
  FleetSeries hour;
  for (std::int64_t m = 950; m <= 1010; ++m) hour.minutes.push_back(m);
  auto& c = hour.classes["billing"];
  c.resize(hour.minutes.size());
  c.front().acquisitions = 100;  // an hour ago: outside a 5-minute window
  c.back().acquisitions = 30;
  c.back().attempts = 40;
  c.back().contended = 10;
  c.back().rate_limited = 7;
  c.back().rate_limit_wait_ms = 3500;
  c.back().concurrency_limited = 4;
  c.back().concurrency_limit_wait_ms = 600;
  c.front().concurrency_limited = 50;  // outside the window: in the series only
  const auto j = json::parse(classes_json(hour, now, std::chrono::minutes(5), nullptr)).at("classes").at(0);
  EXPECT_EQ(j.at("rate_limited"), 7);
  EXPECT_DOUBLE_EQ(j.at("rate_limit_wait_seconds").get<double>(), 3.5);
  EXPECT_EQ(j.at("concurrency_limited"), 4);
  EXPECT_DOUBLE_EQ(j.at("concurrency_limit_wait_seconds").get<double>(), 0.6);
  EXPECT_EQ(j.at("series").at("rate_limited").back(), 7);
  EXPECT_EQ(j.at("series").at("concurrency_limited").front(), 50);
  EXPECT_EQ(j.at("acquisitions"), 30);
  EXPECT_DOUBLE_EQ(j.at("contention_ratio").get<double>(), 0.25);
  EXPECT_EQ(j.at("series").at("acquisitions").size(), hour.minutes.size());
  EXPECT_EQ(j.at("series").at("acquisitions").at(0), 100);
  EXPECT_TRUE(j.at("declared_ttl_ms").is_null());
}

}  // namespace
}  // namespace jobguard::ops::dash
