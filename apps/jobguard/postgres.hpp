// PostgreSQL in the CLI, behind one seam: postgres_on.cpp in a build with it
// (JOBGUARD_WITH_POSTGRES=ON), postgres_off.cpp in a Redis-only build. There
// every use is refused by name, before anything is connected, with exit 78:
// no retry and no other flag makes this binary speak to PostgreSQL.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "jobguard/guard/completion.hpp"
#include "jobguard/guard/postgres.hpp"

namespace jobguard::cli::pg {

// A use of PostgreSQL in a Redis-only build; main reports it as one line
// "jobguard <command>: <what>" and exits 78 (configuration).
class NotBuiltIn : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Whether this jobguard was built with PostgreSQL.
bool built_in() noexcept;

// Throws NotBuiltIn "<use> needs PostgreSQL, and this jobguard was built
// without it (...)" in a Redis-only build, `use` naming what the user asked
// for (a flag, "this command"); nothing otherwise.
void require(std::string_view use);

// `jobguard --version`'s lines for PostgreSQL's client libraries (the loaded
// libpq's own answer), or the line saying it is not built in.
std::string version_lines();

// The completion records of `run --once` and `demo` in PostgreSQL at o.url;
// `migrate` first creates the tables that are missing (`pg migrate`).
std::unique_ptr<guard::CompletionStore> completion_store(const guard::PgOptions& o, bool migrate);

// `jobguard pg migrate`.
guard::MigrateReport migrate(const guard::PgOptions& o);

}  // namespace jobguard::cli::pg
