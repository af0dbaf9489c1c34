// `jobguard doctor`: is this Redis (and PostgreSQL) fit for locks? One line
// per check: OK / WARN / FAIL, what was seen, what to do. A thin layer over
// jobguard/ops/doctor.hpp; docs/operations.md explains every finding.
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "jobguard/error.hpp"
#include "jobguard/job/catalog.hpp"
#include "jobguard/ops/doctor.hpp"
#include "jobguard/redis/client.hpp"
#include "postgres.hpp"

namespace jobguard::cli {
namespace {

constexpr const char* kDoctorHelp = R"(Check the lock Redis (and PostgreSQL with --postgres), one line per check:
  connection role replicas eviction evicted_keys persistence lua acl latency
  clock cluster shared_workload semaphores rwlocks  [pg_connection pg_role
  pg_schema pg_advisory_locks pg_latency pg_clock]
Each line is OK, WARN or FAIL with what was seen and, for WARN/FAIL, what to
do (docs/operations.md: what each finding means). The permission probe writes
and deletes the keys <prefix>:doctor:{probe}[:audit] and {<prefix>:fleet}:doctor-probe;
everything else only reads. semaphores and rwlocks look at the live
semaphores and read-write locks (SCAN, up to 1000 of each): one over its
count, a writer waiting 60s or more behind readers, a plain lock held beside
them; with --catalog FILE also one that breaks its class's permits or mode.

Exit status: 0 every check OK; 1 warnings, no failure; 2 at least one FAIL;
when the connection check fails, its error's status below (69 Redis unreachable,
78 password refused, 77 PING or INFO not allowed); 78 before any check when
--postgres (or $JOBGUARD_POSTGRES_URL) is given to a Redis-only build.)";

namespace doctor_exit {
inline constexpr int warnings = 1;
inline constexpr int failures = 2;
}  // namespace doctor_exit

struct DoctorArgs {
  std::string key_prefix = "jobguard";
  int pings = 5;
  std::string catalog;
};

int run_doctor(const Globals& g, const DoctorArgs& a) {
  if (!g.postgres_url.empty()) pg::require("--postgres (or $JOBGUARD_POSTGRES_URL)");
  auto conn = redis::parse_url(g.redis_url);
  if (conn.client_name.empty()) conn.client_name = "jobguard-doctor";
  ops::DoctorOptions o;
  o.key_prefix = a.key_prefix;
  o.pings = a.pings;
  if (!a.catalog.empty()) o.catalog = std::make_shared<const job::Catalog>(job::Catalog::load(a.catalog));
  std::vector<ops::CheckResult> results;
  {
    redis::Client client(conn);
    // A server that never answers is the connection check's FAIL, not a hang.
    client.wait_connected(conn.connect_timeout);
    results = ops::check_redis(client, o);
  }
  const bool unreachable = !results.empty() && results.front().name == "connection" &&
                           results.front().status == ops::CheckStatus::fail;
  if (!g.postgres_url.empty()) {
    auto pg = ops::check_postgres(g.postgres_url, o);
    results.insert(results.end(), pg.begin(), pg.end());
  }
  if (g.json) {
    auto arr = nlohmann::ordered_json::array();
    for (const auto& r : results)
      arr.push_back({{"check", r.name}, {"status", ops::to_string(r.status)}, {"detail", r.detail},
                     {"advice", r.advice}});
    std::cout << nlohmann::ordered_json{{"redis", redis::to_display_url(conn)},
                                        {"status", ops::to_string(ops::worst(results))},
                                        {"checks", arr}}
                     .dump()
              << "\n";
  } else {
    for (const auto& r : results) {
      std::string line = fmt::format("{:<4} {}: {}", ops::to_string(r.status), r.name, r.detail);
      if (!r.advice.empty()) line += " -> " + r.advice;
      std::cout << line << "\n";
    }
  }
  // Its code decides: a refused password is 78 whatever else was found.
  if (unreachable) return results.front().code ? exit_status_for(results.front().code) : exit_code::unavailable;
  switch (ops::worst(results)) {
    case ops::CheckStatus::ok: return exit_code::ok;
    case ops::CheckStatus::warn: return doctor_exit::warnings;
    case ops::CheckStatus::fail: return doctor_exit::failures;
  }
  return doctor_exit::failures;
}

}  // namespace

void add_doctor(CLI::App& root, Globals& g, Commands& out) {
  auto a = std::make_shared<DoctorArgs>();
  auto* doc = root.add_subcommand("doctor", "Check that Redis (and PostgreSQL) are fit for locks");
  doc->footer(exit_status_help(kDoctorHelp));
  doc->fallthrough();
  add_key_prefix(*doc, a->key_prefix, "Key prefix of the locks");
  doc->add_option("--pings", a->pings, "PINGs timed for the latency check")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  doc->add_option("--catalog", a->catalog, "Lock catalog YAML: judge semaphores and read-write locks by their class");
  out.emplace_back(doc, [&g, a] { return run_doctor(g, *a); });
}

}  // namespace jobguard::cli
