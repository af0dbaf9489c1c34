// A job source on a Redis Stream with a consumer group: at-least-once
// delivery. A job read by a consumer stays in the group's pending list until
// it is acknowledged; a consumer that dies leaves it there, and after
// `claim_idle` another consumer takes it over with XAUTOCLAIM. A job that has
// failed (or stalled) `max_attempts` times goes to a dead-letter stream with
// the last error attached, so one poison job cannot loop forever.
//
// Threads: the blocking members are safe to call from any thread except the
// client's event-loop thread; the async_ members are coroutines for that
// event loop (job::StreamWorker uses them). The Client must outlive the source.
#pragma once

#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jobguard/job/unique.hpp"

namespace jobguard::redis {
class Client;
class Command;
struct Reply;
}

namespace jobguard::job {

struct StreamOptions {
  // The stream key; required.
  std::string stream{};
  // The consumer group. Default "jobguard".
  std::string group = "jobguard";
  // Where dead jobs go. Default empty = "<stream>:dead".
  std::string dead_letter{};
  // How long next() waits for a new job (XREADGROUP BLOCK). Default 200 ms;
  // must be in [1 ms, 1 s]: a short block keeps shutdown and reclaiming prompt.
  std::chrono::milliseconds block{200};
  // A pending job idle this long is taken over from its consumer. Default 30 s;
  // must be > 0. Keep it above the longest time a healthy consumer holds a job.
  std::chrono::milliseconds claim_idle{30000};
  // Deliveries after which a failed or stalled job is dead-lettered. Default 5; must be >= 1.
  int max_attempts = 5;
  // Deadline of the non-blocking calls. Default 2 s; must be > 0. Blocking
  // reads get `block` + this.
  std::chrono::milliseconds call_timeout{2000};

  // Throws Error(invalid_argument) naming the first field out of range; what
  // the StreamSource constructor checks, callable before any connection.
  void validate() const;
};

struct StreamJob {
  std::string id{};                                        // the stream entry id
  std::vector<std::pair<std::string, std::string>> fields{};  // as added
  bool reclaimed = false;         // taken over from a stalled consumer
  std::int64_t deliveries = 1;    // known for reclaimed and failed jobs; 1 otherwise
  // The value of field `name`, or empty.
  std::string field(std::string_view name) const;
};

// One entry of the group's pending list (XPENDING, extended form).
struct PendingEntry {
  std::string id{};
  std::string consumer{};          // who holds it now
  std::chrono::milliseconds idle{0};  // since its last delivery
  std::int64_t deliveries = 0;
};

// One entry of the dead-letter stream: a job moved there after max_attempts.
struct DeadLetter {
  std::string id{};       // its id in the dead-letter stream
  std::string source_id{};  // its id in the job stream
  std::int64_t attempts = 0;
  std::string last_error{};
  std::vector<std::pair<std::string, std::string>> fields{};  // the job's own fields
};

class StreamSource {
 public:
  // Throws Error(invalid_argument) naming the bad option.
  StreamSource(redis::Client& client, StreamOptions options);

  const StreamOptions& options() const noexcept { return opts_; }
  const std::string& dead_letter_stream() const noexcept { return opts_.dead_letter; }

  // XGROUP CREATE <stream> <group> 0 MKSTREAM; an existing group is fine.
  // Starting at 0 delivers jobs added before the group existed (a producer
  // re-filling a stream after Redis lost it).
  void ensure_group();
  // XADD <stream> * fields...; returns the new id.
  std::string add(const std::vector<std::pair<std::string, std::string>>& fields);

  // The next job for `consumer`: a stalled job first (XAUTOCLAIM, when the
  // last reclaim scan is older than claim_idle / 4), else a new one
  // (XREADGROUP ... BLOCK). nullopt when nothing came within `block`.
  // Stalled jobs past max_attempts are dead-lettered here, not returned.
  //
  // A group or stream that vanished (NOGROUP after a Redis restart without
  // persistence or a DEL of the stream; UNBLOCKED when the stream was deleted
  // under a blocked read) is recreated from id 0 and the call ends empty:
  // next(), reclaim(), ack(), deliveries() and fail() all survive
  // it, so a worker keeps working. Jobs pending in the lost group are lost
  // with it (Redis lost them); jobs added afterwards are delivered. The
  // inspection calls (pending_count(), pending()) never create the group:
  // they throw the NOGROUP error.
  std::optional<StreamJob> next(std::string_view consumer);
  // One XAUTOCLAIM scan now, regardless of when the last one ran.
  std::optional<StreamJob> reclaim(std::string_view consumer);
  // XACK; true when the job was still pending (false: already acknowledged or
  // unknown, e.g. the stream was lost).
  bool ack(std::string_view id);
  // Reports a failed attempt. Below max_attempts the job stays pending and is
  // retried after claim_idle; at max_attempts it is moved to the dead-letter
  // stream with `error`, its fields, and the delivery count. True if dead-lettered.
  bool fail(const StreamJob& job, std::string_view error);

  // Adds a unique job (see unique.hpp): the entry with its unique lock in
  // one script, or, on conflict, nothing (Result::conflict names the holder;
  // on_conflict log is the caller's to report as success). The fields gain
  // jobguard_unique, jobguard_unique_key and jobguard_unique_conflict.
  // Throws Error(invalid_argument) for options that do not fit the strategy
  // and for a job without a field to key by.
  UniqueAdd add_unique(std::vector<std::pair<std::string, std::string>> fields, const UniqueOptions& unique);
  // Frees unique locks whose job is gone (see unique.hpp), scanning up to
  // `budget` registered locks per script call until the registry has been
  // walked once. Returns the freed locks with the entry id each named.
  std::vector<std::pair<std::string, std::string>> reap_unique(std::size_t budget = 256);
  // Up to `max` unique locks the reaper watches, with the entry id holding
  // each (for inspection: `jobguard jobs ls`). until-expired locks are not
  // among them.
  std::vector<std::pair<std::string, std::string>> unique_locks(std::size_t max);

  // Deliveries of a pending job (XPENDING); 0 when it is not pending.
  std::int64_t deliveries(std::string_view id);
  std::int64_t pending_count();
  std::int64_t length(const std::string& stream);
  // The first `max` pending jobs, oldest first (for inspection: `jobguard jobs ls`).
  std::vector<PendingEntry> pending(std::size_t max);
  // The newest `max` dead-letter entries, newest first.
  std::vector<DeadLetter> dead_letters(std::size_t max);
  // One dead-letter entry by its id in the dead-letter stream; nullopt when
  // there is none.
  std::optional<DeadLetter> dead_letter_entry(std::string_view id);
  // Puts dead letter `id` back on the job stream with the job's own fields
  // (a fresh entry: deliveries start again at 1) and removes it from the
  // dead-letter stream, in that order. Returns the new entry's id; nullopt
  // when no such dead letter exists (already retried, or never there).
  std::optional<std::string> retry_dead_letter(std::string_view id);

  // --- the same as coroutines on the client's event loop ---------------------
  // Up to `max` jobs: stalled ones first (when a reclaim scan is due, as in
  // next()), then new ones with XREADGROUP COUNT max BLOCK `block`, sent on
  // `reader` when given: a blocked read holds its connection, so a caller
  // with other commands in flight (renewals, acks) reads on a client of its
  // own. Empty when nothing came within `block`.
  boost::asio::awaitable<std::vector<StreamJob>> async_next(std::string consumer, std::size_t max,
                                                            redis::Client* reader = nullptr);
  // ensure_group() as a coroutine.
  boost::asio::awaitable<void> async_ensure_group();
  boost::asio::awaitable<bool> async_ack(std::string id);
  // async_ack, gathered: the acks asked for on the client's loop in one turn
  // leave as one XACK with every id (the stream worker's finished jobs: one
  // command for a batch instead of one per job). A batch that fails is
  // retried id by id through async_ack, which then reports its own error as
  // it does alone; acknowledging an id twice is harmless.
  // Call it on the client's loop thread only. Whether each id was still
  // pending is not known per id in a batch, so nothing is returned.
  boost::asio::awaitable<void> async_ack_gathered(std::string id);
  // Jobs delivered to `consumer` that it will not run after all (a stopping
  // worker's read-ahead): each stays pending with its delivery count, made
  // as idle as a stalled job's (XCLAIM ... IDLE claim_idle JUSTID), so the
  // next reclaim scan of any consumer takes it over instead of one claim_idle
  // from now.
  boost::asio::awaitable<void> async_hand_back(std::string consumer, std::vector<std::string> ids);
  // A delivery that found its unit in another delivery's hands (busy, or
  // the wait for the lock ran out): the job stays pending for the next
  // reclaim, and this delivery is not charged to it (XCLAIM ... RETRYCOUNT
  // deliveries-1 JUSTID). Charged, a duplicate delivered while its twin runs
  // longer than claim_idle would be dead-lettered as "stalled" though
  // nothing about it is poison. A holder that never lets go keeps the job
  // pending for as long; a job that kills its worker is still charged (the
  // worker dies before this call).
  boost::asio::awaitable<void> async_defer(std::string consumer, const StreamJob& job);
  // A job `consumer` holds but has not started yet (it waits for a limit):
  // its idle time starts again, so no reclaim scan takes it over as
  // stalled, and no delivery is counted. False when it is no longer pending
  // with `consumer` (another consumer took it over, or it left the queue).
  boost::asio::awaitable<bool> async_touch(std::string consumer, std::string id);
  // Releases the unique lock `job` carries, if it is still this job's.
  // True when released; false when the job has no lock or it is another's.
  boost::asio::awaitable<bool> async_release_unique(std::string lock_key, std::string job_id);
  boost::asio::awaitable<std::vector<std::pair<std::string, std::string>>> async_reap_unique(std::size_t budget);
  // The jobs the reclaim scans of async_next dead-lettered as stalled since
  // the last call, with their delivery counts: the worker counts and logs
  // them, as it does the jobs it dead-letters itself.
  std::vector<StreamJob> take_stalled();
  boost::asio::awaitable<bool> async_fail(StreamJob job, std::string error);
  // Moves `job` to the dead-letter stream now, whatever its deliveries (a
  // job that can never succeed: a malformed unit id).
  boost::asio::awaitable<void> async_dead_letter(StreamJob job, std::string error);

  // How many times a vanished group was recreated (for logs and tests).
  std::uint64_t groups_recreated() const noexcept { return groups_recreated_.load(std::memory_order_relaxed); }

 private:
  // Runs `cmd` (on `via`, default the source's client); on NOGROUP /
  // UNBLOCKED recreates the group, then retries once when `retry`, else
  // returns a nil reply.
  boost::asio::awaitable<redis::Reply> exec_group(redis::Command cmd, std::chrono::milliseconds timeout, bool retry,
                                                  redis::Client* via = nullptr);
  boost::asio::awaitable<std::vector<StreamJob>> async_reclaim(std::string consumer, std::size_t max);
  boost::asio::awaitable<std::int64_t> async_deliveries(std::string id);
  boost::asio::awaitable<void> dead_letter(StreamJob job, std::string error, std::int64_t deliveries);
  // Runs a coroutine on the client's loop and waits for it (not from the loop).
  template <class T>
  T block_on(boost::asio::awaitable<T> aw);
  // async_ack_gathered's batch for this turn (loop thread only): ids, and
  // whom to tell whether their XACK went through.
  struct AckBatch {
    std::vector<std::string> ids;
    std::vector<std::function<void(bool)>> waiters;
  };
  std::shared_ptr<AckBatch> acks_;
  redis::Client& client_;
  StreamOptions opts_;
  std::mutex mu_;
  std::string cursor_ = "0-0";
  std::chrono::steady_clock::time_point last_scan_{};
  std::atomic<std::uint64_t> groups_recreated_{0};
  std::vector<StreamJob> stalled_;  // guarded by mu_
};

}  // namespace jobguard::job
