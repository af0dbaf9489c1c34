// The doctor's PostgreSQL checks, in a build with PostgreSQL (a Redis-only
// build has doctor_none.cpp): the only part of the doctor that links libpq.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>

#include "jobguard/guard/postgres.hpp"
#include "jobguard/ops/doctor.hpp"
#include "doctor_internal.hpp"

namespace jobguard::ops {
namespace {
using Clock = std::chrono::steady_clock;
using checks::fail;
using checks::ms_text;
using checks::ok;
using checks::to_i64;
using checks::warn;
using std::chrono::milliseconds;
}  // namespace

std::vector<CheckResult> check_postgres(const std::string& url, const DoctorOptions& o) {
  std::vector<CheckResult> out;
  std::unique_ptr<guard::PgConnection> conn;
  try {
    guard::PgOptions po;
    po.url = url;
    po.application_name = "jobguard-doctor";
    conn = std::make_unique<guard::PgConnection>(po);
    auto v = conn->exec("SELECT current_setting('server_version')");
    out.push_back(ok("pg_connection", fmt::format("PostgreSQL {}", v.rows.at(0).at(0).value_or("?"))));
  } catch (const std::exception& e) {
    out.push_back(fail("pg_connection", e.what(), "check the URL, the network and the server"));
    return out;
  }
  auto guarded = [&](const char* name, auto fn) {
    try {
      out.push_back(fn());
    } catch (const std::exception& e) {
      out.push_back(fail(name, fmt::format("the check failed: {}", e.what()), "see the error"));
    }
  };
  guarded("pg_role", [&] {
    auto r = conn->exec("SELECT pg_is_in_recovery()");
    if (r.rows.at(0).at(0).value_or("f") == "t")
      return fail("pg_role", "this server is a standby (in recovery)",
                  "point --postgres at the primary: completion records and fenced writes need to write");
    return ok("pg_role", "primary");
  });
  guarded("pg_schema", [&] {
    auto r = conn->exec(
        "SELECT count(*) FROM information_schema.tables WHERE table_name IN "
        "('jobguard_fences','jobguard_completions','jobguard_idempotency','jobguard_schema_version')");
    const auto n = to_i64(r.rows.at(0).at(0).value_or("0"));
    if (n < 4)
      return fail("pg_schema", fmt::format("{} of the 4 jobguard tables exist", n),
                  "run `jobguard pg migrate` (the guards never create tables on first use)");
    return ok("pg_schema", "the jobguard tables exist");
  });
  guarded("pg_advisory_locks", [&] {
    const bool got = conn->try_advisory_lock("jobguard-doctor-probe");
    if (got) conn->advisory_unlock("jobguard-doctor-probe");
    return got ? ok("pg_advisory_locks", "pg_try_advisory_lock works")
               : warn("pg_advisory_locks", "the probe advisory lock was busy (another doctor running?)", "run again");
  });
  guarded("pg_latency", [&] {
    std::vector<double> ms;
    for (int i = 0; i < o.pings; ++i) {
      const auto t0 = Clock::now();
      conn->exec("SELECT 1");
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const auto detail = fmt::format("SELECT 1 median {}, max {}", ms_text(ms[ms.size() / 2]), ms_text(ms.back()));
    if (ms[ms.size() / 2] >= static_cast<double>(o.latency_warn.count()))
      return warn("pg_latency", detail, "every completion record and fenced write pays this round trip");
    return ok("pg_latency", detail);
  });
  guarded("pg_clock", [&] {
    std::function<std::chrono::system_clock::time_point()> now = o.now;
    if (!now) now = [] { return std::chrono::system_clock::now(); };
    const auto t0 = now();
    auto r = conn->exec("SELECT (extract(epoch from clock_timestamp()) * 1000000)::bigint");
    const auto t1 = now();
    const auto local_us =
        std::chrono::duration_cast<std::chrono::microseconds>((t0 + (t1 - t0) / 2).time_since_epoch()).count();
    const auto off = milliseconds((to_i64(r.rows.at(0).at(0).value_or("0")) - local_us) / 1000);
    const auto abs = off < milliseconds(0) ? -off : off;
    const auto detail = fmt::format("server clock {} ms {} this host's", abs.count(), off.count() >= 0 ? "ahead of" : "behind");
    if (abs >= o.clock_warn) return warn("pg_clock", detail, "run NTP on both hosts: record times are server times");
    return ok("pg_clock", detail);
  });
  return out;
}

}  // namespace jobguard::ops
