// PgCompletionStore: the PostgreSQL half of completion.hpp (target jobguard::pg).
#include <fmt/format.h>

#include "jobguard/detail/completion_parts.hpp"
#include "pg/pg_internal.hpp"
#include "jobguard/error.hpp"
#include "jobguard/guard/completion.hpp"

namespace jobguard::guard {
namespace {

using detail::check_parts;
using detail::from_ms;

constexpr const char* kCompletedMs = "(extract(epoch FROM completed_at) * 1000)::bigint";

}  // namespace

// --- PostgreSQL -----------------------------------------------------------------

PgCompletionStore::PgCompletionStore(PgOptions options) : conn_(std::make_unique<PgConnection>(std::move(options))) {}
PgCompletionStore::~PgCompletionStore() = default;

RecordOutcome PgCompletionStore::record(std::string_view job_kind, std::string_view entity, std::string_view run_id,
                                        std::string_view completed_by, std::string_view result) {
  check_parts(job_kind, entity, run_id);
  std::lock_guard lk(mu_);
  RecordOutcome out;
  out.record = {std::string(job_kind), std::string(entity), std::string(run_id), {}, std::string(completed_by),
                std::string(result)};
  // ON CONFLICT DO NOTHING waits for a concurrent inserter of the same triple
  // to finish: exactly one of them gets the row back.
  auto r = conn_->exec(fmt::format("INSERT INTO jobguard_completions (job_kind, entity, run_id, completed_by, result) "
                                   "VALUES ($1, $2, $3, $4, $5) ON CONFLICT ON CONSTRAINT jobguard_completions_once "
                                   "DO NOTHING RETURNING {}",
                                   kCompletedMs),
                       {std::string(job_kind), std::string(entity), std::string(run_id), std::string(completed_by),
                        std::string(result)});
  if (!r.empty()) {
    out.recorded = true;
    out.record.completed_at = from_ms(detail::to_i64(r.rows[0][0]));
    return out;
  }
  auto cur = conn_->exec(fmt::format("SELECT {}, completed_by, result FROM jobguard_completions "
                                     "WHERE job_kind = $1 AND entity = $2 AND run_id = $3",
                                     kCompletedMs),
                         {std::string(job_kind), std::string(entity), std::string(run_id)});
  if (cur.empty())  // deleted between our INSERT and SELECT: only a manual prune does that
    throw Error(errc::server_error, fmt::format("completion record {}/{}/{} conflicted but then vanished",
                                                job_kind, entity, run_id));
  out.record.completed_at = from_ms(detail::to_i64(cur.rows[0][0]));
  out.record.completed_by = cur.rows[0][1].value_or("");
  out.record.result = cur.rows[0][2].value_or("");
  return out;
}

std::optional<CompletionRecord> PgCompletionStore::find(std::string_view job_kind, std::string_view entity,
                                                        std::string_view run_id) {
  check_parts(job_kind, entity, run_id);
  std::lock_guard lk(mu_);
  auto r = conn_->exec(fmt::format("SELECT {}, completed_by, result FROM jobguard_completions "
                                   "WHERE job_kind = $1 AND entity = $2 AND run_id = $3",
                                   kCompletedMs),
                       {std::string(job_kind), std::string(entity), std::string(run_id)});
  if (r.empty()) return std::nullopt;
  CompletionRecord rec{std::string(job_kind), std::string(entity), std::string(run_id),
                       from_ms(detail::to_i64(r.rows[0][0])), r.rows[0][1].value_or(""), r.rows[0][2].value_or("")};
  return rec;
}

}  // namespace jobguard::guard
