#include "jobguard/guard/postgres.hpp"

#include <fmt/format.h>
#include <libpq-fe.h>
#include <openssl/evp.h>

#include <pqxx/pqxx>

#include "pg/pg_errors.hpp"
#include "pg/pg_internal.hpp"
#include "jobguard/error.hpp"
#include "jobguard/text.hpp"

namespace jobguard::guard {
namespace detail {

std::string one_line(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\n' || c == '\r') {
      if (!out.empty() && out.back() != ' ') out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

namespace {
// Every error of this file is PostgreSQL's: the runner decides by the source
// (a statement timeout is not Redis timing out).
Error pg_error(errc e, const std::string& detail) { return Error(e, detail, error_source::postgres); }
}  // namespace

void rethrow_pg(std::string_view doing, std::chrono::milliseconds statement_timeout) {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const pqxx::in_doubt_error& e) {
    throw pg_error(errc::in_doubt, fmt::format("{}: the connection broke during COMMIT, the transaction may or may "
                                            "not have committed ({})",
                                            doing, one_line(e.what())));
  } catch (const pqxx::broken_connection& e) {
    throw pg_error(errc::postgres_unavailable, fmt::format("{}: {}", doing, one_line(e.what())));
  } catch (const pqxx::sql_error& e) {
    const std::string& state = e.sqlstate();
    const std::string msg = one_line(e.what());
    if (state == "57014") {  // query_canceled: statement_timeout (or a cancel request)
      throw pg_error(errc::timeout, fmt::format("{}: statement_timeout of {} ms exceeded ({})", doing,
                                             statement_timeout.count(), msg));
    }
    if (state == "42P01" && msg.find("jobguard_") != std::string::npos) {
      throw pg_error(errc::server_error,
                  fmt::format("{}: jobguard tables missing in this database ({}): run `jobguard pg migrate` "
                              "(or guard::pg_migrate) first",
                              doing, msg));
    }
    // Admin shutdown / crash of the server: the session is gone, retry elsewhere.
    if (state.rfind("57P", 0) == 0 || state.rfind("08", 0) == 0) {
      throw pg_error(errc::postgres_unavailable, fmt::format("{}: {} (SQLSTATE {})", doing, msg, state));
    }
    throw pg_error(errc::server_error, fmt::format("{}: {} (SQLSTATE {})", doing, msg, state));
  } catch (const std::exception& e) {
    throw pg_error(errc::server_error, fmt::format("{}: {}", doing, one_line(e.what())));
  }
}

namespace {
std::string hide_quoted(std::string_view s) {
  std::string out;
  bool in = false;
  for (char c : s) {
    if (c == '"') {
      out += in ? "***\"" : "\"";
      in = !in;
    } else if (!in) {
      out.push_back(c);
    }
  }
  return out;
}
}  // namespace

std::string libpq_text(const PgOptions& o, std::string_view why) {
  // libpq quotes pieces of what it could not parse or use; with a password
  // in the URL such a piece may be part of it ("user:pa/ss@h" reads as port
  // "pa"), so then its quoted values are hidden.
  std::string text = one_line(why);
  if (redact_url(o.url) != escape_text(o.url, 0)) text = hide_quoted(text);
  return escape_text(text, 512);
}

std::string build_conninfo(const PgOptions& o) {
  if (o.url.empty())
    throw Error(errc::invalid_url, "no PostgreSQL URL given (--postgres or $JOBGUARD_POSTGRES_URL)");
  if (o.connect_timeout.count() <= 0)
    throw Error(errc::invalid_argument, "PostgreSQL connect_timeout must be > 0");
  if (o.statement_timeout.count() <= 0)
    throw Error(errc::invalid_argument, "PostgreSQL statement_timeout must be > 0");
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(o.url.c_str(), &err);
  if (opts == nullptr) {
    std::string why = err ? one_line(err) : "out of memory";
    if (err) PQfreemem(err);
    // libpq quotes pieces of what it could not parse; with a password in
    // the text such a piece may be part of it ("user:pa/ss@h" reads as port
    // "pa"), so then its quoted values are hidden too.
    throw Error(errc::invalid_url, fmt::format("PostgreSQL URL \"{}\": {}", redact_url(o.url), libpq_text(o, why)));
  }
  auto quote = [](std::string_view v) {
    std::string q = "'";
    for (char c : v) {
      if (c == '\'' || c == '\\') q.push_back('\\');
      q.push_back(c);
    }
    q.push_back('\'');
    return q;
  };
  std::string out;
  bool has_app = false;
  for (PQconninfoOption* p = opts; p->keyword != nullptr; ++p) {
    if (p->val == nullptr) continue;
    const std::string_view kw = p->keyword;
    // Ours wins: every connect has our deadline.
    if (kw == "connect_timeout") continue;
    if (kw == "application_name") has_app = true;
    out += fmt::format("{}={} ", kw, quote(p->val));
  }
  PQconninfoFree(opts);
  out += fmt::format("connect_timeout={}", o.connect_timeout.count());
  if (!has_app && !o.application_name.empty()) out += " application_name=" + quote(o.application_name);
  return out;
}

std::string describe_target(const PgOptions& o) {
  // host:port/db for messages, never the password. But libpq reads
  // "postgresql://app:pw/x@db/jobs" as host "app", port "pw", database
  // "x@db/jobs": pieces that carry the password. When the parse does not
  // put the host after the URI's last '@', or the port is not a number, the
  // URI is shown redacted instead.
  const bool uri = o.url.find("://") != std::string::npos;
  const auto last_at = o.url.rfind('@');
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(o.url.c_str(), &err);
  if (err) PQfreemem(err);
  if (opts == nullptr) return "PostgreSQL";
  std::string host = "localhost", port = "5432", db;
  for (PQconninfoOption* p = opts; p->keyword != nullptr; ++p) {
    if (p->val == nullptr) continue;
    const std::string_view kw = p->keyword;
    if (kw == "host" || kw == "hostaddr") host = p->val;
    else if (kw == "port") port = p->val;
    else if (kw == "dbname") db = p->val;
  }
  PQconninfoFree(opts);
  if (uri) {
    const bool port_ok = !port.empty() && port.find_first_not_of("0123456789") == std::string::npos;
    const bool host_after_at = last_at == std::string::npos || o.url.find(host, last_at) != std::string::npos;
    if (!port_ok || !host_after_at || (last_at != std::string::npos && db.find('@') != std::string::npos))
      return "PostgreSQL " + redact_url(o.url);
  }
  return fmt::format("PostgreSQL {}:{}{}{}", escape_text(host, 128), escape_text(port, 16), db.empty() ? "" : "/",
                     escape_text(db, 128));
}

PgResult to_result(const pqxx::result& r) {
  PgResult out;
  out.affected_rows = r.affected_rows();
  out.rows.reserve(r.size());
  for (const auto& row : r) {
    std::vector<PgValue> v;
    v.reserve(row.size());
    for (const auto& f : row) {
      if (f.is_null()) v.emplace_back(std::nullopt);
      else v.emplace_back(std::string(f.c_str(), f.size()));
    }
    out.rows.push_back(std::move(v));
  }
  return out;
}

pqxx::result exec_params(pqxx::transaction_base& tx, std::string_view sql, const PgParams& params) {
  std::vector<const char*> ptrs;
  ptrs.reserve(params.size());
  for (const auto& p : params) ptrs.push_back(p ? p->c_str() : nullptr);
  return tx.exec_params(std::string(sql), pqxx::prepare::make_dynamic_params(ptrs));
}

std::string quote_ident(pqxx::transaction_base& tx, std::string_view name) {
  if (name.empty()) throw Error(errc::invalid_argument, "empty SQL identifier");
  // "schema.table": quote each part.
  std::string out;
  std::size_t start = 0;
  while (true) {
    const auto dot = name.find('.', start);
    const auto part = name.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (part.empty()) throw Error(errc::invalid_argument, fmt::format("malformed SQL identifier \"{}\"", name));
    if (!out.empty()) out.push_back('.');
    out += tx.quote_name(std::string(part));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return out;
}

std::int64_t to_i64(const PgValue& v) {
  if (!v) return 0;
  return std::stoll(*v);
}

}  // namespace detail

using detail::rethrow_pg;

const char* to_string(FenceOutcome o) noexcept {
  switch (o) {
    case FenceOutcome::accepted: return "accepted";
    case FenceOutcome::stale: return "stale fencing token";
    case FenceOutcome::missing: return "no such row";
  }
  return "?";
}

std::int64_t advisory_key(std::string_view lock_name) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(lock_name.data(), lock_name.size(), md, &len, EVP_sha256(), nullptr) != 1 || len < 8)
    throw Error(errc::invalid_argument, "SHA-256 failed while hashing an advisory lock name");
  std::uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u = (u << 8) | md[i];
  return static_cast<std::int64_t>(u);  // two's complement (C++20)
}

// ---------------------------------------------------------------------------

struct PgConnection::Impl {
  PgOptions opts;
  std::string conninfo;
  std::string target;
  std::unique_ptr<pqxx::connection> conn;

  void connect() {
    conn.reset();
    try {
      auto c = std::make_unique<pqxx::connection>(conninfo);
      // A transparent reconnect would lose the session's statement_timeout:
      // we reconnect ourselves (ensure()) and set it again.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
      c->inhibit_reactivation(true);  // deprecated in 6.x, yet reactivation is still on by default
#pragma GCC diagnostic pop
      pqxx::nontransaction n(*c);
      n.exec(fmt::format("SET statement_timeout = {}", opts.statement_timeout.count()));
      n.commit();
      conn = std::move(c);
    } catch (const pqxx::broken_connection& e) {
      throw Error(errc::postgres_unavailable,
                  fmt::format("cannot connect to {} (connect_timeout {} s): {}", target,
                              opts.connect_timeout.count(), detail::libpq_text(opts, e.what())),
                  error_source::postgres);
    } catch (...) {
      rethrow_pg(fmt::format("connecting to {}", target), opts.statement_timeout);
    }
  }

  pqxx::connection& ensure() {
    if (!conn || !conn->is_open()) connect();
    return *conn;
  }
};

struct PgTransaction::Impl {
  pqxx::dbtransaction& tx;
  const PgOptions& opts;
};

PgConnection::PgConnection(PgOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->opts = std::move(options);
  impl_->conninfo = detail::build_conninfo(impl_->opts);
  impl_->target = detail::describe_target(impl_->opts);
  impl_->connect();
}

PgConnection::~PgConnection() = default;

const PgOptions& PgConnection::options() const noexcept { return impl_->opts; }

PgResult PgConnection::exec(std::string_view sql, const PgParams& params) {
  try {
    pqxx::nontransaction n(impl_->ensure());
    auto r = detail::to_result(detail::exec_params(n, sql, params));
    n.commit();
    return r;
  } catch (...) {
    rethrow_pg(fmt::format("{}: query", impl_->target), impl_->opts.statement_timeout);
  }
}

void PgConnection::transact(const std::function<void(PgTransaction&)>& body) {
  try {
    pqxx::work w(impl_->ensure());
    // SET LOCAL as well: behind a transaction pooler the session SET may have
    // been made on another server connection.
    w.exec(fmt::format("SET LOCAL statement_timeout = {}", impl_->opts.statement_timeout.count()));
    PgTransaction::Impl ti{w, impl_->opts};
    PgTransaction t(ti);
    body(t);
    w.commit();
  } catch (...) {
    rethrow_pg(fmt::format("{}: transaction", impl_->target), impl_->opts.statement_timeout);
  }
}

namespace {

void check_wait(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0)
    throw Error(errc::invalid_argument, "advisory lock wait timeout must be > 0 (use the try_ form not to wait)");
}

bool is_lock_timeout(const pqxx::sql_error& e) { return e.sqlstate() == "55P03"; }

}  // namespace

bool PgConnection::try_advisory_lock(std::string_view lock_name) {
  auto r = exec("SELECT pg_try_advisory_lock($1)", {std::to_string(advisory_key(lock_name))});
  return r.rows.at(0).at(0) == std::optional<std::string>("t");
}

bool PgConnection::advisory_lock(std::string_view lock_name, std::chrono::milliseconds timeout) {
  check_wait(timeout);
  const auto doing = fmt::format("{}: advisory lock \"{}\"", impl_->target, lock_name);
  try {
    pqxx::connection& c = impl_->ensure();
    pqxx::nontransaction n(c);
    // The wait is bounded by lock_timeout; statement_timeout must not cut it short.
    const auto stmt = std::max(impl_->opts.statement_timeout, timeout + std::chrono::milliseconds(1000));
    n.exec(fmt::format("SET lock_timeout = {}; SET statement_timeout = {}", timeout.count(), stmt.count()));
    bool got = true;
    try {
      n.exec_params("SELECT pg_advisory_lock($1)", advisory_key(lock_name));
    } catch (const pqxx::sql_error& e) {
      if (!is_lock_timeout(e)) throw;
      got = false;
    }
    n.exec(fmt::format("SET lock_timeout = 0; SET statement_timeout = {}", impl_->opts.statement_timeout.count()));
    n.commit();
    return got;
  } catch (...) {
    rethrow_pg(doing, impl_->opts.statement_timeout);
  }
}

bool PgConnection::advisory_unlock(std::string_view lock_name) {
  auto r = exec("SELECT pg_advisory_unlock($1)", {std::to_string(advisory_key(lock_name))});
  return r.rows.at(0).at(0) == std::optional<std::string>("t");
}

// ---------------------------------------------------------------------------

PgResult PgTransaction::exec(std::string_view sql, const PgParams& params) {
  return detail::to_result(detail::exec_params(impl_.tx, sql, params));
}

bool PgTransaction::try_advisory_xact_lock(std::string_view lock_name) {
  auto r = impl_.tx.exec_params("SELECT pg_try_advisory_xact_lock($1)", advisory_key(lock_name));
  return r.at(0).at(0).as<bool>();
}

bool PgTransaction::advisory_xact_lock(std::string_view lock_name, std::chrono::milliseconds timeout) {
  check_wait(timeout);
  auto saved = impl_.tx.exec("SELECT current_setting('lock_timeout'), current_setting('statement_timeout')");
  const std::string old_lock = saved.at(0).at(0).c_str(), old_stmt = saved.at(0).at(1).c_str();
  const auto stmt = std::max(impl_.opts.statement_timeout, timeout + std::chrono::milliseconds(1000));
  bool got = false;
  // A lock_timeout error aborts the transaction: wait inside a savepoint so a
  // "busy" answer leaves the caller's transaction usable.
  impl_.tx.exec("SAVEPOINT jobguard_advisory_wait");
  try {
    impl_.tx.exec_params("SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)",
                         std::to_string(timeout.count()), std::to_string(stmt.count()));
    impl_.tx.exec_params("SELECT pg_advisory_xact_lock($1)", advisory_key(lock_name));
    impl_.tx.exec("RELEASE SAVEPOINT jobguard_advisory_wait");
    got = true;
  } catch (const pqxx::sql_error& e) {
    if (!is_lock_timeout(e)) throw;
    impl_.tx.exec("ROLLBACK TO SAVEPOINT jobguard_advisory_wait");
  }
  // Released savepoints keep SET LOCAL values: put the caller's back.
  impl_.tx.exec_params("SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)",
                       old_lock, old_stmt);
  return got;
}

FenceResult PgTransaction::fenced_update(const FencedUpdate& u, std::int64_t token) {
  auto& tx = impl_.tx;
  const std::string table = detail::quote_ident(tx, u.table);
  const std::string idc = detail::quote_ident(tx, u.id_column);
  const std::string fc = detail::quote_ident(tx, u.fence_column);
  const char* op = u.compare == FenceCompare::same_or_newer ? "<=" : "<";
  // Under READ COMMITTED a concurrent writer of the same row makes us wait for
  // its COMMIT and then re-check the WHERE clause on its version of the row,
  // so two holders can never both pass the fence check.
  const std::string sql =
      fmt::format("UPDATE {t} SET {a}{sep}{f} = $2 WHERE {id} = $1 AND ({f} IS NULL OR {f} {op} $2)", fmt::arg("t", table),
                  fmt::arg("a", u.assignments), fmt::arg("sep", u.assignments.empty() ? "" : ", "),
                  fmt::arg("f", fc), fmt::arg("id", idc), fmt::arg("op", op));
  PgParams params;
  params.reserve(u.values.size() + 2);
  params.emplace_back(u.id);
  params.emplace_back(std::to_string(token));
  params.insert(params.end(), u.values.begin(), u.values.end());
  auto r = detail::exec_params(tx, sql, params);
  FenceResult out;
  if (r.affected_rows() > 0) {
    out.outcome = FenceOutcome::accepted;
    out.stored_fence = token;
    return out;
  }
  auto cur = detail::exec_params(tx, fmt::format("SELECT {} FROM {} WHERE {} = $1", fc, table, idc), {u.id});
  if (cur.empty()) {
    out.outcome = FenceOutcome::missing;
  } else {
    out.outcome = FenceOutcome::stale;
    if (!cur[0][0].is_null()) out.stored_fence = cur[0][0].as<std::int64_t>();
  }
  return out;
}

FenceResult PgTransaction::advance_fence(std::string_view resource, std::int64_t token, FenceCompare compare) {
  auto& tx = impl_.tx;
  const std::string sql = fmt::format(
      "INSERT INTO jobguard_fences AS f (resource, fence) VALUES ($1, $2) "
      "ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence, updated_at = clock_timestamp() "
      "WHERE f.fence {} EXCLUDED.fence RETURNING f.fence",
      compare == FenceCompare::same_or_newer ? "<=" : "<");
  auto r = tx.exec_params(sql, std::string(resource), token);
  FenceResult out;
  if (!r.empty()) {
    out.outcome = FenceOutcome::accepted;
    out.stored_fence = token;
    return out;
  }
  out.outcome = FenceOutcome::stale;
  auto cur = tx.exec_params("SELECT fence FROM jobguard_fences WHERE resource = $1", std::string(resource));
  if (!cur.empty()) out.stored_fence = cur[0][0].as<std::int64_t>();
  return out;
}

FenceResult fenced_update(PgConnection& conn, const FencedUpdate& update, std::int64_t token) {
  FenceResult out;
  conn.transact([&](PgTransaction& tx) { out = tx.fenced_update(update, token); });
  return out;
}

FenceResult advance_fence(PgConnection& conn, std::string_view resource, std::int64_t token, FenceCompare compare) {
  FenceResult out;
  conn.transact([&](PgTransaction& tx) { out = tx.advance_fence(resource, token, compare); });
  return out;
}

}  // namespace jobguard::guard
