// `jobguard pg migrate`: creates the tables the PostgreSQL guards need. The
// guards never create them on first use, so schema changes stay an explicit,
// reviewable step. Idempotent: a second run reports "up to date".
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "postgres.hpp"

namespace jobguard::cli {
namespace {

struct PgArgs {
  std::string connect_timeout = "5s";
  std::string statement_timeout = "30s";
};

int run_migrate(const Globals& g, const PgArgs& a) {
  pg::require("this command");
  if (g.postgres_url.empty())
    throw Error(errc::invalid_url, "no PostgreSQL URL: pass --postgres URL or set $JOBGUARD_POSTGRES_URL");
  guard::PgOptions o;
  o.url = g.postgres_url;
  const auto ct = parse_duration(a.connect_timeout, "--connect-timeout");
  o.connect_timeout = std::max(std::chrono::seconds(1), std::chrono::ceil<std::chrono::seconds>(ct));
  o.statement_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
      parse_duration(a.statement_timeout, "--statement-timeout"));
  if (o.statement_timeout.count() <= 0) throw Error(errc::invalid_argument, "--statement-timeout must be > 0");
  const auto r = pg::migrate(o);
  if (g.json) {
    nlohmann::json j{{"from_version", r.from_version}, {"to_version", r.to_version}, {"created", r.created}};
    std::cout << j.dump() << "\n";
    return exit_code::ok;
  }
  if (r.created.empty() && r.from_version == r.to_version) {
    std::cout << fmt::format("jobguard schema is up to date (version {})\n", r.to_version);
    return exit_code::ok;
  }
  for (const auto& c : r.created) std::cout << "created " << c << "\n";
  std::cout << fmt::format("jobguard schema at version {} (was {})\n", r.to_version, r.from_version);
  return exit_code::ok;
}

}  // namespace

void add_pg(CLI::App& root, Globals& g, Commands& out) {
  auto args = std::make_shared<PgArgs>();
  // Kept in a Redis-only build, so that `pg migrate` is refused as such (78),
  // not as an unknown command (64).
  const char* not_built = pg::built_in() ? "" : " (not in this Redis-only build: exit 78)";
  auto* sub = root.add_subcommand("pg", fmt::format("PostgreSQL guardrails: schema management{}", not_built));
  sub->require_subcommand(1);
  sub->footer(exit_status_help("Exit status: 0 ok."));
  auto* mig = sub->add_subcommand(
      "migrate", "Create the jobguard tables (fences, completions, idempotency) if missing; idempotent");
  mig->footer(exit_status_help(fmt::format("Exit status: 0 the tables exist (created now or before){}.", not_built)));
  mig->add_option("--connect-timeout", args->connect_timeout, "Connect deadline (whole seconds, at least 2 s in libpq)")
      ->check(duration_validator())
      ->capture_default_str();
  mig->add_option("--statement-timeout", args->statement_timeout, "statement_timeout for the migration")
      ->check(duration_validator())
      ->capture_default_str();
  out.emplace_back(mig, [&g, args] { return run_migrate(g, *args); });
}

}  // namespace jobguard::cli
