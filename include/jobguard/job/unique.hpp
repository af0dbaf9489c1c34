// Unique jobs: the same job enqueued once, however often its producer fires
// (a cron that overlaps itself, a retried HTTP handler, two schedulers).
//
// A unique job carries a unique lock: a Redis key, one per unique value (the
// job's unit id by default), whose value is the stream entry id of the job
// that holds it. The entry and the lock are written by one script, so there
// is no window between "checked" and "added" for a second producer, and only
// the job named in the lock releases it. What each strategy holds:
//
//   until-executed             from enqueue until the job leaves the queue
//                              (acknowledged after its run, or dead-lettered)
//   until-and-while-executing  from enqueue until its run is granted (the run
//                              itself is exclusive per unit, as every guarded
//                              run is): a new copy may be queued while it runs
//   until-expired              from enqueue for `unique_for`, whatever the job does
//   while-executing            no lock at enqueue; a copy delivered while the
//                              unit runs is a conflict, not a later retry
//
// On conflict at enqueue: reject (nothing added; the caller is told which job
// holds the lock), replace (the holder is deleted if it was not delivered yet,
// else reject), log (nothing added, reported as a success). For
// while-executing, reject dead-letters the copy and log acknowledges it.
//
// A lock whose job is gone (a worker killed between acknowledging a job and
// releasing its lock; an entry deleted by hand) would block its value for
// ever: the reaper (StreamSource::reap_unique, run by every StreamWorker
// every `unique_reap_interval`) frees such orphans, and an enqueue that meets
// one takes it over. What this does not cover is in docs/unique-jobs.md.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace jobguard::job {

enum class UniqueStrategy { until_executed, until_and_while_executing, until_expired, while_executing };
enum class UniqueConflict { reject, replace, log };

// "until-executed", "until-and-while-executing", "until-expired", "while-executing".
std::string_view to_string(UniqueStrategy s) noexcept;
std::optional<UniqueStrategy> parse_unique_strategy(std::string_view s) noexcept;
// "reject", "replace", "log".
std::string_view to_string(UniqueConflict c) noexcept;
std::optional<UniqueConflict> parse_unique_conflict(std::string_view s) noexcept;

struct UniqueOptions {
  UniqueStrategy strategy = UniqueStrategy::until_executed;
  // The lock's TTL. Required (> 0) for until-expired; for until-executed and
  // until-and-while-executing an optional cap (0: none, the reaper frees
  // orphans); refused for while-executing (its lock is the run's lease).
  std::chrono::milliseconds unique_for{0};
  UniqueConflict on_conflict = UniqueConflict::reject;
  // Fields whose values, in this order, make the unique value. Default: the
  // worker's id field, "id". Refused for while-executing (the unit is the key).
  std::vector<std::string> by{};
};

// Throws Error(invalid_argument) naming the first option that does not fit
// the strategy.
void validate(const UniqueOptions& o);

struct UniqueAdd {
  enum class Result { added, replaced, conflict };
  Result result = Result::added;
  std::string id{};            // the new entry's id; empty on conflict
  std::string holder{};        // the job that holds the lock (conflict), or was replaced or orphaned
  std::string holder_state{};  // waiting, delivered or gone (an orphan); empty when there was none
  std::string lock_key{};      // empty for while-executing
};

// The job fields a unique job carries, read by the worker.
inline constexpr std::string_view kUniqueStrategyField = "jobguard_unique";
inline constexpr std::string_view kUniqueKeyField = "jobguard_unique_key";
inline constexpr std::string_view kUniqueConflictField = "jobguard_unique_conflict";

// Keys in the stream's cluster slot: the stream's own hash tag when it has
// one, else the stream key made one.
std::string unique_lock_key(std::string_view stream, std::string_view value);
std::string unique_registry_key(std::string_view stream);

}  // namespace jobguard::job
