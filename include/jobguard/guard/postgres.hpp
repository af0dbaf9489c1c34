// PostgreSQL guardrails: a connection that bounds every statement with a
// timeout, explicit migrations, advisory locks keyed by hashed lock names, and
// fenced writes that refuse a stale fencing token.
//
// libpqxx stays an implementation detail: statements take text parameters and
// return rows of text, which is all the guards need and keeps consumers free of
// libpqxx's headers and ABI.
//
// Errors (jobguard::Error):
//   errc::postgres_unavailable  connect failed, connection dropped (retry the call)
//   errc::timeout               statement_timeout or connect_timeout passed
//   errc::in_doubt              the connection broke during COMMIT: the
//                               transaction may or may not have committed
//   errc::server_error          any other SQL error (constraint, syntax...), and
//                               "jobguard tables missing: run `jobguard pg migrate`"
//   errc::invalid_url           the URL/conninfo does not parse
//
// Threads: a PgConnection is used by one thread at a time (libpq connections
// are not thread-safe); open one per thread. PgTransaction lives only inside
// the callback of PgConnection::transact.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace jobguard::guard {

struct PgOptions {
  // postgresql://user:pass@host:port/db?... or "host=... dbname=..." (libpq syntax).
  std::string url{};
  // Connect deadline. Default 5 s. libpq counts whole seconds and treats
  // values under 2 s as 2 s; zero is refused (every call has a deadline).
  std::chrono::seconds connect_timeout{5};
  // statement_timeout set on the session and again (SET LOCAL) in every
  // transaction we open, so it holds behind transaction pooling too.
  // Default 5 s; zero is refused.
  std::chrono::milliseconds statement_timeout{5000};
  std::string application_name = "jobguard";
};

// NULL is std::nullopt.
using PgValue = std::optional<std::string>;
using PgParams = std::vector<PgValue>;

struct PgResult {
  std::vector<std::vector<PgValue>> rows{};
  std::uint64_t affected_rows = 0;
  bool empty() const noexcept { return rows.empty(); }
};

// How a fenced write compares the stored token with the writer's.
enum class FenceCompare {
  // stored <= token: the current holder may write several times under its own
  // grant; a holder whose grant was superseded (smaller token) is refused.
  // Safe because tokens are never reused across grants. The default.
  same_or_newer,
  // stored < token: each token writes at most once.
  newer_only,
};

enum class FenceOutcome {
  accepted,   // the write happened and the stored token is now `token`
  stale,      // refused: "stale fencing token" (a newer holder already wrote)
  missing,    // fenced_update only: no row with that id
};
const char* to_string(FenceOutcome o) noexcept;

struct FenceResult {
  FenceOutcome outcome = FenceOutcome::stale;
  // The token stored after the call (ours when accepted, the newer one when
  // stale; nullopt when missing or never fenced).
  std::optional<std::int64_t> stored_fence{};
  bool accepted() const noexcept { return outcome == FenceOutcome::accepted; }
};

// UPDATE <table> SET <assignments>, <fence_column> = $2
//   WHERE <id_column> = $1 AND (<fence_column> IS NULL OR <fence_column> <= $2)
// Identifiers are quoted by us; `assignments` is SQL written by the caller with
// its own parameters numbered from $3 (values[0] is $3).
struct FencedUpdate {
  std::string table{};
  std::string id_column = "id";
  std::string fence_column = "fence";
  std::string assignments{};  // e.g. "status = $3, amount = $4"; may be empty
  std::string id{};
  PgParams values{};
  FenceCompare compare = FenceCompare::same_or_newer;
};

// The 64-bit advisory-lock key for a lock name: the first 8 bytes of
// SHA-256(name), read big-endian, as a signed int64 (two's complement).
// Stable across versions, platforms and languages, e.g. in SQL:
//   ('x' || left(encode(sha256(convert_to(name, 'UTF8')), 'hex'), 16))::bit(64)::bigint
std::int64_t advisory_key(std::string_view lock_name);

class PgTransaction;

class PgConnection {
 public:
  // Connects at once; throws postgres_unavailable / timeout / invalid_url.
  explicit PgConnection(PgOptions options);
  ~PgConnection();
  PgConnection(const PgConnection&) = delete;
  PgConnection& operator=(const PgConnection&) = delete;

  const PgOptions& options() const noexcept;

  // One statement in its own implicit transaction.
  PgResult exec(std::string_view sql, const PgParams& params = {});

  // Runs `body` in one transaction (READ COMMITTED) and commits when it
  // returns; an exception rolls back and propagates. A broken connection during
  // COMMIT throws errc::in_doubt. Never retried here: the body may have side
  // effects outside the database.
  void transact(const std::function<void(PgTransaction&)>& body);

  // --- session-level advisory locks -----------------------------------------
  // Held until unlocked or the session ends. They do NOT work behind
  // PgBouncer-style transaction pooling: the next statement may run on another
  // server connection, so the lock is held by a session you no longer talk to
  // (and unlock runs elsewhere). Behind such a pooler use the transaction-level
  // forms on PgTransaction.
  bool try_advisory_lock(std::string_view lock_name);
  // Waits up to `timeout` (lock_timeout); false when it passed. Zero is refused.
  bool advisory_lock(std::string_view lock_name, std::chrono::milliseconds timeout);
  // False when this session did not hold it.
  bool advisory_unlock(std::string_view lock_name);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

class PgTransaction {
 public:
  PgResult exec(std::string_view sql, const PgParams& params = {});

  // --- transaction-level advisory locks -------------------------------------
  // Released by COMMIT or ROLLBACK, never explicitly. These are the forms that
  // work behind PgBouncer-style transaction pooling.
  bool try_advisory_xact_lock(std::string_view lock_name);
  // Waits up to `timeout`; false when it passed (the transaction stays usable:
  // the wait runs in a savepoint). Zero is refused.
  bool advisory_xact_lock(std::string_view lock_name, std::chrono::milliseconds timeout);

  // --- fenced writes --------------------------------------------------------
  FenceResult fenced_update(const FencedUpdate& update, std::int64_t token);
  // For a resource with no row of its own: records `token` in jobguard_fences
  // unless a newer (or, with newer_only, equal) token is already stored. Run
  // the guarded write in the same transaction, after an accepted advance: the
  // row lock on the fence row serialises writers until COMMIT.
  FenceResult advance_fence(std::string_view resource, std::int64_t token,
                            FenceCompare compare = FenceCompare::same_or_newer);

  struct Impl;
  explicit PgTransaction(Impl& impl) : impl_(impl) {}

 private:
  Impl& impl_;
};

// Runs a single fenced write in its own transaction.
FenceResult fenced_update(PgConnection& conn, const FencedUpdate& update, std::int64_t token);
FenceResult advance_fence(PgConnection& conn, std::string_view resource, std::int64_t token,
                          FenceCompare compare = FenceCompare::same_or_newer);

// --- migrations ---------------------------------------------------------------
struct MigrateReport {
  int from_version = 0;
  int to_version = 0;
  std::vector<std::string> created{};  // "table jobguard_fences", ...; empty when up to date
};

// Creates the jobguard tables (IF NOT EXISTS, one transaction, serialised by
// an advisory lock so concurrent migrations are safe) and records the schema
// version in jobguard_schema_version. Idempotent. The guards never create
// tables on first use; they fail with "run `jobguard pg migrate`".
MigrateReport pg_migrate(const PgOptions& options);
MigrateReport pg_migrate(const std::string& url);
int pg_schema_version();  // the version this library expects

}  // namespace jobguard::guard
