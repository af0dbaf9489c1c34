#include <fmt/format.h>

#include "pg/pg_internal.hpp"
#include "jobguard/detail/completion_parts.hpp"
#include "jobguard/error.hpp"
#include "jobguard/guard/idempotency.hpp"

namespace jobguard::guard {
namespace detail {
void check_begin_args(std::string_view key, std::chrono::milliseconds lease, const IdempotencyOptions& o);
}

namespace {

using detail::from_ms;

// All times are the server's clock_timestamp(): one clock judges every lease.
constexpr const char* kClaimSet =
    "fingerprint = $2, state = 'in_progress', owner = $3, started_at = clock_timestamp(), "
    "lease_expires_at = clock_timestamp() + $4::bigint * interval '1 millisecond', result = NULL, "
    "expires_at = clock_timestamp() + $5::bigint * interval '1 millisecond'";

}  // namespace

PgIdempotencyStore::PgIdempotencyStore(PgOptions pg, IdempotencyOptions options)
    : opts_(std::move(options)), conn_(std::make_unique<PgConnection>(std::move(pg))) {}
PgIdempotencyStore::~PgIdempotencyStore() = default;

BeginResult PgIdempotencyStore::begin(std::string_view key, std::string_view fingerprint,
                                      std::chrono::milliseconds lease, std::string_view owner) {
  detail::check_begin_args(key, lease, opts_);
  const std::string me = owner.empty() ? make_owner_token() : std::string(owner);
  const PgParams claim{std::string(key), std::string(fingerprint), me, std::to_string(lease.count()),
                       std::to_string(std::max(opts_.retention, lease).count())};
  std::lock_guard lk(mu_);
  BeginResult b;
  // A row can vanish between the INSERT that conflicted and the SELECT (an
  // abandon() commits in between): then the next round inserts.
  for (int round = 0; round < 5; ++round) {
    bool done = false;
    conn_->transact([&](PgTransaction& tx) {
      auto ins = tx.exec(
          "INSERT INTO jobguard_idempotency (key, fingerprint, state, owner, started_at, lease_expires_at, expires_at) "
          "VALUES ($1, $2, 'in_progress', $3, clock_timestamp(), "
          "clock_timestamp() + $4::bigint * interval '1 millisecond', "
          "clock_timestamp() + $5::bigint * interval '1 millisecond') "
          "ON CONFLICT (key) DO NOTHING "
          "RETURNING (extract(epoch FROM started_at) * 1000)::bigint",
          claim);
      if (!ins.empty()) {
        b = {};
        b.status = BeginStatus::claimed;
        b.owner = me;
        b.since = from_ms(detail::to_i64(ins.rows[0][0]));
        done = true;
        return;
      }
      // FOR UPDATE: concurrent begins on this key queue here, so only one of
      // them can see an expired lease and take it over.
      auto cur = tx.exec(
          "SELECT state, fingerprint, owner, (extract(epoch FROM started_at) * 1000)::bigint, "
          "ceil(extract(epoch FROM (lease_expires_at - clock_timestamp())) * 1000)::bigint, result, "
          "expires_at <= clock_timestamp() "
          "FROM jobguard_idempotency WHERE key = $1 FOR UPDATE",
          {std::string(key)});
      if (cur.empty()) return;
      const auto& row = cur.rows[0];
      const bool expired = row[6] == PgValue("t");
      b = {};
      if (!expired) {
        b.owner = row[2].value_or("");
        b.since = from_ms(detail::to_i64(row[3]));
        if (row[1].value_or("") != fingerprint) {
          b.status = BeginStatus::fingerprint_conflict;
          b.stored_fingerprint = row[1].value_or("");
          done = true;
          return;
        }
        if (row[0] == PgValue("completed")) {
          b.status = BeginStatus::completed;
          b.result = row[5].value_or("");
          done = true;
          return;
        }
        const auto left = detail::to_i64(row[4]);
        if (left > 0) {
          b.status = BeginStatus::in_progress;
          b.lease_left = std::chrono::milliseconds(left);
          done = true;
          return;
        }
        b.reclaimed = true;
      }
      auto upd = tx.exec(fmt::format("UPDATE jobguard_idempotency SET {} WHERE key = $1 "
                                     "RETURNING (extract(epoch FROM started_at) * 1000)::bigint",
                                     kClaimSet),
                         claim);
      b.status = BeginStatus::claimed;
      b.owner = me;
      b.since = from_ms(detail::to_i64(upd.rows.at(0).at(0)));
      done = true;
    });
    if (done) return b;
  }
  throw Error(errc::server_error, fmt::format("idempotency key \"{}\": record kept vanishing during begin", key));
}

void PgIdempotencyStore::complete(std::string_view key, std::string_view owner, std::string_view result) {
  std::lock_guard lk(mu_);
  auto r = conn_->exec(
      "UPDATE jobguard_idempotency SET state = 'completed', result = $3, "
      "expires_at = clock_timestamp() + $4::bigint * interval '1 millisecond' "
      "WHERE key = $1 AND owner = $2 AND state = 'in_progress'",
      {std::string(key), std::string(owner), std::string(result), std::to_string(opts_.retention.count())});
  if (r.affected_rows == 1) return;
  auto cur = conn_->exec("SELECT state, owner FROM jobguard_idempotency WHERE key = $1", {std::string(key)});
  if (!cur.empty() && cur.rows[0][0] == PgValue("completed") && cur.rows[0][1] == PgValue(std::string(owner)))
    return;  // a retried complete()
  const std::string state = cur.empty() ? "absent" : cur.rows[0][0].value_or("?");
  const std::string holder = cur.empty() ? "nobody" : cur.rows[0][1].value_or("?");
  throw Error(errc::lease_lost, fmt::format("idempotency key \"{}\": not held by {} (state {}, owner {})", key, owner,
                                            state, holder));
}

bool PgIdempotencyStore::abandon(std::string_view key, std::string_view owner) {
  std::lock_guard lk(mu_);
  auto r = conn_->exec("DELETE FROM jobguard_idempotency WHERE key = $1 AND owner = $2 AND state = 'in_progress'",
                       {std::string(key), std::string(owner)});
  return r.affected_rows == 1;
}

}  // namespace jobguard::guard
