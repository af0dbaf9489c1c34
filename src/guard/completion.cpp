#include "jobguard/guard/completion.hpp"

#include <fmt/format.h>

#include "guard/pg_internal.hpp"
#include "guard/scripts.hpp"
#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::guard {
namespace {

std::chrono::system_clock::time_point from_ms(std::int64_t ms) {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
}

void check_parts(std::string_view kind, std::string_view entity, std::string_view run_id) {
  if (kind.empty() || entity.empty() || run_id.empty())
    throw Error(errc::invalid_argument,
                fmt::format("completion record needs a job kind, an entity and a run id (got \"{}\", \"{}\", \"{}\")",
                            kind, entity, run_id));
}

// ':' separates the parts and '%' escapes: distinct triples, distinct keys.
std::string encode_part(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '%') out += "%25";
    else if (c == ':') out += "%3A";
    else out.push_back(c);
  }
  return out;
}

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

// --- Redis ----------------------------------------------------------------------

RedisCompletionStore::RedisCompletionStore(redis::Client& client, RedisCompletionOptions options)
    : client_(client), opts_(std::move(options)) {
  if (opts_.retention.count() < 0) throw Error(errc::invalid_argument, "completion retention must be >= 0");
}

std::string RedisCompletionStore::key_for(std::string_view job_kind, std::string_view entity,
                                          std::string_view run_id) const {
  return fmt::format("{}{}:{}:{}", opts_.prefix, encode_part(job_kind), encode_part(entity), encode_part(run_id));
}

RecordOutcome RedisCompletionStore::record(std::string_view job_kind, std::string_view entity, std::string_view run_id,
                                           std::string_view completed_by, std::string_view result) {
  check_parts(job_kind, entity, run_id);
  static const redis::Script script{std::string(scripts::completion_record)};
  auto r = client_.eval(script, {key_for(job_kind, entity, run_id)},
                        {std::string(completed_by), std::string(result), std::to_string(opts_.retention.count())},
                        {opts_.timeout});
  if (!r.is_array() || r.elements.size() != 4)
    throw Error(errc::protocol_error, "completion_record script: unexpected reply " + redis::to_debug_string(r));
  RecordOutcome out;
  out.recorded = r.elements[0].integer == 1;
  out.record = {std::string(job_kind), std::string(entity), std::string(run_id),
                from_ms(std::stoll(r.elements[1].str)), r.elements[2].str, r.elements[3].str};
  return out;
}

std::optional<CompletionRecord> RedisCompletionStore::find(std::string_view job_kind, std::string_view entity,
                                                           std::string_view run_id) {
  check_parts(job_kind, entity, run_id);
  auto r = client_.exec(redis::Command{"HMGET", key_for(job_kind, entity, run_id), "at", "by", "result"},
                        {opts_.timeout});
  if (!r.is_array() || r.elements.size() != 3)
    throw Error(errc::protocol_error, "HMGET completion record: unexpected reply " + redis::to_debug_string(r));
  if (r.elements[0].is_nil()) return std::nullopt;
  return CompletionRecord{std::string(job_kind), std::string(entity), std::string(run_id),
                          from_ms(std::stoll(r.elements[0].str)), r.elements[1].str, r.elements[2].str};
}

}  // namespace jobguard::guard
