// The CLI's PostgreSQL seam (postgres.hpp) in a Redis-only build
// (JOBGUARD_WITH_POSTGRES=OFF): every use is refused by name. Nothing here
// includes libpq or libpqxx, so the binary does not link them.
#include <fmt/format.h>

#include "postgres.hpp"

namespace jobguard::cli::pg {

bool built_in() noexcept { return false; }

void require(std::string_view use) {
  throw NotBuiltIn(fmt::format("{} needs PostgreSQL, and this jobguard was built without it (JOBGUARD_WITH_POSTGRES=OFF)",
                               use));
}

std::string version_lines() { return "PostgreSQL: not built in (JOBGUARD_WITH_POSTGRES=OFF)"; }

std::unique_ptr<guard::CompletionStore> completion_store(const guard::PgOptions&, bool) {
  require("a completion record in PostgreSQL");
  return nullptr;
}

guard::MigrateReport migrate(const guard::PgOptions&) {
  require("this command");
  return {};
}

}  // namespace jobguard::cli::pg
