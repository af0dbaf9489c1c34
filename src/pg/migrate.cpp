#include <fmt/format.h>

#include <pqxx/pqxx>

#include "pg/pg_errors.hpp"
#include "pg/pg_internal.hpp"
#include "jobguard/error.hpp"
#include "jobguard/guard/postgres.hpp"

namespace jobguard::guard {
namespace {

constexpr int kSchemaVersion = 1;

struct Table {
  const char* name;
  const char* ddl;
};

// Version 1. Later versions append statements; existing ones never change.
const Table kTables[] = {
    {"jobguard_fences",
     "CREATE TABLE IF NOT EXISTS jobguard_fences ("
     " resource text PRIMARY KEY,"
     " fence bigint NOT NULL,"
     " updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"},
    {"jobguard_completions",
     "CREATE TABLE IF NOT EXISTS jobguard_completions ("
     " job_kind text NOT NULL,"
     " entity text NOT NULL,"
     " run_id text NOT NULL,"
     " completed_at timestamptz NOT NULL DEFAULT clock_timestamp(),"
     " completed_by text NOT NULL,"
     " result text,"
     " CONSTRAINT jobguard_completions_once UNIQUE (job_kind, entity, run_id))"},
    {"jobguard_idempotency",
     "CREATE TABLE IF NOT EXISTS jobguard_idempotency ("
     " key text PRIMARY KEY,"
     " fingerprint text NOT NULL,"
     " state text NOT NULL CHECK (state IN ('in_progress', 'completed')),"
     " owner text NOT NULL,"
     " started_at timestamptz NOT NULL,"
     " lease_expires_at timestamptz NOT NULL,"
     " result text,"
     " expires_at timestamptz NOT NULL)"},
};

}  // namespace

int pg_schema_version() { return kSchemaVersion; }

MigrateReport pg_migrate(const std::string& url) {
  PgOptions o;
  o.url = url;
  return pg_migrate(o);
}

MigrateReport pg_migrate(const PgOptions& options) {
  PgConnection conn(options);
  MigrateReport report;
  report.to_version = kSchemaVersion;
  conn.transact([&](PgTransaction& tx) {
    // Two concurrent `jobguard pg migrate` runs would race on CREATE TABLE IF
    // NOT EXISTS (a unique violation in pg_type): serialise them.
    tx.exec("SELECT pg_advisory_xact_lock($1)", {std::to_string(advisory_key("jobguard:migrate"))});
    auto exists = [&](const char* name) {
      return tx.exec("SELECT to_regclass($1) IS NOT NULL", {std::string(name)}).rows.at(0).at(0) ==
             PgValue("t");
    };
    if (!exists("jobguard_schema_version")) {
      report.created.emplace_back("table jobguard_schema_version");
      tx.exec(
          "CREATE TABLE IF NOT EXISTS jobguard_schema_version ("
          " version integer PRIMARY KEY,"
          " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())");
    }
    const auto v = tx.exec("SELECT coalesce(max(version), 0) FROM jobguard_schema_version").rows.at(0).at(0);
    report.from_version = static_cast<int>(detail::to_i64(v));
    if (report.from_version > kSchemaVersion)
      throw Error(errc::invalid_argument,
                  fmt::format("database schema version {} is newer than this jobguard's ({}): upgrade jobguard",
                              report.from_version, kSchemaVersion));
    for (const auto& t : kTables) {
      if (!exists(t.name)) report.created.push_back(fmt::format("table {}", t.name));
      tx.exec(t.ddl);
    }
    if (!exists("jobguard_idempotency_expires")) report.created.emplace_back("index jobguard_idempotency_expires");
    tx.exec("CREATE INDEX IF NOT EXISTS jobguard_idempotency_expires ON jobguard_idempotency (expires_at)");
    tx.exec("INSERT INTO jobguard_schema_version (version) VALUES ($1) ON CONFLICT (version) DO NOTHING",
            {std::to_string(kSchemaVersion)});
  });
  return report;
}

}  // namespace jobguard::guard
