// Helpers shared by the PostgreSQL-backed guards. Private to src/guard.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "jobguard/guard/postgres.hpp"

namespace pqxx {
class transaction_base;
class result;
}  // namespace pqxx

namespace jobguard::guard::detail {

std::string build_conninfo(const PgOptions& o);
// A libpq message made safe to show: one line, escaped, and with its quoted
// values hidden when the URL carries a password (they may be pieces of it).
std::string libpq_text(const PgOptions& o, std::string_view why);
std::string describe_target(const PgOptions& o);  // "PostgreSQL host:port/db", no password
std::string one_line(std::string_view s);
PgResult to_result(const pqxx::result& r);
pqxx::result exec_params(pqxx::transaction_base& tx, std::string_view sql, const PgParams& params);
std::string quote_ident(pqxx::transaction_base& tx, std::string_view name);
std::int64_t to_i64(const PgValue& v);

}  // namespace jobguard::guard::detail
