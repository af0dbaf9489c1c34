// Idempotency keys: make a retry of a side effect harmless.
//
//   auto b = store.begin(key, fingerprint, lease);
//   switch (b.status) {
//     case BeginStatus::claimed:   do the effect (passing `key` downstream), then
//                                  store.complete(key, b.owner, result)
//     case BeginStatus::in_progress: someone else holds it; retry later
//     case BeginStatus::completed:   return b.result (do not repeat the effect)
//     case BeginStatus::fingerprint_conflict: the key was reused for a different request
//   }
//
// An in-progress record left by a crashed worker becomes claimable once its
// lease has passed on the *server's* clock, never before (b.reclaimed tells the
// new owner that an earlier attempt may have done part of the work: the effect
// downstream must itself be keyed by `key`, as a payment API is).
// complete()/abandon() only act for the current owner: a worker whose lease
// passed and whose record was reclaimed gets errc::lease_lost from complete().
// Records (in progress or completed) are kept for `retention` after their last
// change; after that the key is new again.
//
// Threads: both stores are safe to call from any thread.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "jobguard/guard/postgres.hpp"

namespace jobguard::redis {
class Client;
struct Reply;
}

namespace jobguard::guard {
namespace scripts {
struct KeyPiece;
}

enum class BeginStatus { claimed, in_progress, completed, fingerprint_conflict };
const char* to_string(BeginStatus s) noexcept;

struct BeginResult {
  BeginStatus status = BeginStatus::claimed;
  bool reclaimed = false;  // claimed after an earlier owner's lease passed
  // claimed: our owner token (pass it to complete/abandon); in_progress: the
  // holder; completed: who completed it.
  std::string owner{};
  std::chrono::system_clock::time_point since{};  // when the current attempt began (server clock)
  std::chrono::milliseconds lease_left{0};      // in_progress: until it becomes claimable
  std::string result{};                         // completed: the stored result
  std::string stored_fingerprint{};             // fingerprint_conflict: the one on record
};

struct IdempotencyOptions {
  // How long a record lives after its last change. Default 24 h; must exceed
  // every lease and the longest a client keeps retrying.
  std::chrono::milliseconds retention{std::chrono::hours(24)};
  // Redis only: key prefix; per-call deadline (zero = the client's command_timeout).
  std::string prefix = "jobguard:idem:";
  std::chrono::milliseconds timeout{0};
};

class IdempotencyStore {
 public:
  virtual ~IdempotencyStore() = default;
  // `lease` > 0: how long an in-progress claim keeps others out. `owner`
  // empty = a fresh token "host/pid/<random hex>".
  virtual BeginResult begin(std::string_view key, std::string_view fingerprint, std::chrono::milliseconds lease,
                            std::string_view owner = {}) = 0;
  // Throws Error(errc::lease_lost) when `owner` no longer holds the key.
  virtual void complete(std::string_view key, std::string_view owner, std::string_view result) = 0;
  // Drops our in-progress claim so the next begin() claims at once (the
  // effect did not happen). False when `owner` did not hold it.
  virtual bool abandon(std::string_view key, std::string_view owner) = 0;

  // Non-blocking forms, as CompletionStore's (completion.hpp): `done` runs on
  // the Redis client's event loop with the failure or the value; only a store
  // whose is_async() is true has them (the defaults report invalid_argument).
  template <class T>
  using Done = std::function<void(std::exception_ptr, T)>;
  virtual bool is_async() const noexcept { return false; }
  virtual void async_begin(std::string_view key, std::string_view fingerprint, std::chrono::milliseconds lease,
                           std::string_view owner, Done<BeginResult> done);
  virtual void async_complete(std::string_view key, std::string_view owner, std::string_view result,
                              Done<bool> done);
  virtual void async_abandon(std::string_view key, std::string_view owner, Done<bool> done);
  // Internal, as CompletionStore::script_piece(): where a composed script
  // may claim and complete this store's keys itself; null when it may not.
  virtual const scripts::KeyPiece* script_piece() const noexcept { return nullptr; }
};

// Table jobguard_idempotency (run `jobguard pg migrate` first).
class PgIdempotencyStore final : public IdempotencyStore {
 public:
  explicit PgIdempotencyStore(PgOptions pg, IdempotencyOptions options = {});
  ~PgIdempotencyStore() override;
  BeginResult begin(std::string_view key, std::string_view fingerprint, std::chrono::milliseconds lease,
                    std::string_view owner = {}) override;
  void complete(std::string_view key, std::string_view owner, std::string_view result) override;
  bool abandon(std::string_view key, std::string_view owner) override;

 private:
  IdempotencyOptions opts_;
  std::mutex mu_;
  std::unique_ptr<PgConnection> conn_;
};

// One string per key (its format: src/guard/scripts/stored.lua; a hash an
// older jobguard wrote is still read), changed only by Lua scripts (atomic
// on the server).
class RedisIdempotencyStore final : public IdempotencyStore {
 public:
  // `client` must outlive the store.
  RedisIdempotencyStore(redis::Client& client, IdempotencyOptions options = {});
  BeginResult begin(std::string_view key, std::string_view fingerprint, std::chrono::milliseconds lease,
                    std::string_view owner = {}) override;
  void complete(std::string_view key, std::string_view owner, std::string_view result) override;
  bool abandon(std::string_view key, std::string_view owner) override;
  bool is_async() const noexcept override { return true; }
  void async_begin(std::string_view key, std::string_view fingerprint, std::chrono::milliseconds lease,
                   std::string_view owner, Done<BeginResult> done) override;
  // `done` gets true; a key no longer ours is the lease_lost failure.
  void async_complete(std::string_view key, std::string_view owner, std::string_view result,
                      Done<bool> done) override;
  void async_abandon(std::string_view key, std::string_view owner, Done<bool> done) override;

  // Internal, for the library's composed scripts (script_piece()): where a
  // key lives and how the pieces' replies read (the same parsing as begin()
  // and complete()). Null when the options keep no completed key (retention
  // zero), which the composed finish cannot write.
  const scripts::KeyPiece* script_piece() const noexcept override { return piece_.get(); }
  std::string key_for(std::string_view key) const { return opts_.prefix + std::string(key); }
  static BeginResult parse_begin_reply(const redis::Reply& r);
  // Throws Error(lease_lost) when the key was not `owner`'s to complete.
  static void check_complete_reply(const redis::Reply& r, std::string_view key, std::string_view owner);

 private:
  redis::Client& client_;
  IdempotencyOptions opts_;
  std::shared_ptr<const scripts::KeyPiece> piece_;
};

// "host/pid/<16 random hex>": unique per call, readable in `in_progress`.
std::string make_owner_token();

}  // namespace jobguard::guard
