// The CLI's PostgreSQL seam (postgres.hpp) in a build with PostgreSQL.
#include <fmt/format.h>
#include <libpq-fe.h>

#include <pqxx/version.hxx>

#include "postgres.hpp"

namespace jobguard::cli::pg {

bool built_in() noexcept { return true; }

void require(std::string_view) {}

std::string version_lines() {
  const int pq = PQlibVersion();  // 150018 for 15.18 (major * 10000 + minor since 10)
  return fmt::format("libpqxx {}\nlibpq {}.{}", PQXX_VERSION, pq / 10000, pq % 10000);
}

std::unique_ptr<guard::CompletionStore> completion_store(const guard::PgOptions& o, bool migrate) {
  if (migrate) guard::pg_migrate(o);
  return std::make_unique<guard::PgCompletionStore>(o);
}

guard::MigrateReport migrate(const guard::PgOptions& o) { return guard::pg_migrate(o); }

}  // namespace jobguard::cli::pg
