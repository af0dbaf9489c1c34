// Completion records: durable proof that one unit of work ran. record() for a
// (job_kind, entity, run_id) succeeds once; every later attempt learns that the
// unit already ran, when, by whom, and what it returned. This is phase three of
// claim -> side effect -> record completion: a worker that crashed after the
// side effect but before recording can still repeat the effect, so pair it with
// an idempotency key where the effect itself must not repeat.
//
// Threads: both stores are safe to call from any thread (the PostgreSQL store
// serialises on its one connection; the Redis store shares the Client).
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "jobguard/guard/postgres.hpp"

namespace jobguard::redis {
class Client;
}

namespace jobguard::guard {
namespace scripts {
struct RecordPiece;
}

struct CompletionRecord {
  std::string job_kind{}, entity{}, run_id{};
  std::chrono::system_clock::time_point completed_at{};  // the server's clock
  std::string completed_by{};
  std::string result{};
};

struct RecordOutcome {
  bool recorded = false;     // true: ours is the record; false: it had already run
  CompletionRecord record{}; // ours, or the one that was there first
};

class CompletionStore {
 public:
  virtual ~CompletionStore() = default;
  virtual RecordOutcome record(std::string_view job_kind, std::string_view entity, std::string_view run_id,
                               std::string_view completed_by, std::string_view result = {}) = 0;
  virtual std::optional<CompletionRecord> find(std::string_view job_kind, std::string_view entity,
                                               std::string_view run_id) = 0;

  // Non-blocking forms, for a caller on the Redis client's event loop
  // (GuardedRunner::async_run, job::StreamWorker): `done` runs on that loop.
  // Only a store whose is_async() is true has them; the others (PostgreSQL:
  // libpqxx blocks) are called in their blocking form on a thread of the
  // caller's, never on the loop. The defaults report invalid_argument.
  // `done` gets the failure (a jobguard::Error) or the value.
  template <class T>
  using Done = std::function<void(std::exception_ptr, T)>;
  virtual bool is_async() const noexcept { return false; }
  virtual void async_record(std::string_view job_kind, std::string_view entity, std::string_view run_id,
                            std::string_view completed_by, std::string_view result, Done<RecordOutcome> done);
  virtual void async_find(std::string_view job_kind, std::string_view entity, std::string_view run_id,
                          Done<std::optional<CompletionRecord>> done);
  // Internal, for the library's composed scripts (the guarded runner's
  // one-call claim and finish): where a script may read and write this
  // store's records itself (include/jobguard/detail/guard_scripts.hpp);
  // null when it may not, and the records are reached through this interface.
  virtual const scripts::RecordPiece* script_piece() const noexcept { return nullptr; }
};

// Table jobguard_completions, unique (job_kind, entity, run_id). Kept forever
// (a durable record); prune it yourself if you must.
class PgCompletionStore final : public CompletionStore {
 public:
  explicit PgCompletionStore(PgOptions options);
  ~PgCompletionStore() override;
  RecordOutcome record(std::string_view job_kind, std::string_view entity, std::string_view run_id,
                       std::string_view completed_by, std::string_view result = {}) override;
  std::optional<CompletionRecord> find(std::string_view job_kind, std::string_view entity,
                                       std::string_view run_id) override;

 private:
  std::mutex mu_;
  std::unique_ptr<PgConnection> conn_;
};

struct RedisCompletionOptions {
  std::string prefix = "jobguard:done:";
  // How long a record is kept. Default zero = forever. A record that expires
  // no longer stops a rerun: keep it longer than any retry can arrive.
  std::chrono::milliseconds retention{0};
  // Per-call deadline; zero = the client's command_timeout.
  std::chrono::milliseconds timeout{0};
};

// One string per record, <prefix><kind>:<entity>:<run_id>, with ':' and '%'
// in the parts percent-encoded so distinct triples never share a key (its
// format: src/guard/scripts/stored.lua; a hash an older jobguard wrote is
// still read). Written by a Lua script (create-if-absent, read back
// otherwise) using the server's clock.
// A Redis that loses data (restart without persistence, failover to a lagging
// replica) loses records: use PostgreSQL where a rerun costs money.
class RedisCompletionStore final : public CompletionStore {
 public:
  // `client` must outlive the store.
  RedisCompletionStore(redis::Client& client, RedisCompletionOptions options = {});
  RecordOutcome record(std::string_view job_kind, std::string_view entity, std::string_view run_id,
                       std::string_view completed_by, std::string_view result = {}) override;
  std::optional<CompletionRecord> find(std::string_view job_kind, std::string_view entity,
                                       std::string_view run_id) override;
  bool is_async() const noexcept override { return true; }
  void async_record(std::string_view job_kind, std::string_view entity, std::string_view run_id,
                    std::string_view completed_by, std::string_view result, Done<RecordOutcome> done) override;
  void async_find(std::string_view job_kind, std::string_view entity, std::string_view run_id,
                  Done<std::optional<CompletionRecord>> done) override;
  // Throws Error(invalid_argument) when a part is empty.
  std::string key_for(std::string_view job_kind, std::string_view entity, std::string_view run_id) const;
  const scripts::RecordPiece* script_piece() const noexcept override { return piece_.get(); }

 private:
  redis::Client& client_;
  RedisCompletionOptions opts_;
  std::shared_ptr<const scripts::RecordPiece> piece_;
};

}  // namespace jobguard::guard
