// The semaphore's scripts, for the waiter (waiter_shell.cpp) and the service.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard {
namespace detail {
const redis::Script& sem_acquire_script();
const redis::Script& sem_release_script();
const redis::Script& sem_extend_script();
// The holders' zset member of a permit: "<token> <slot>".
inline std::string permit_member(const std::string& token, int slot) {
  std::string m;
  m.reserve(token.size() + 8);
  m.append(token).append(1, ' ').append(std::to_string(slot));
  return m;
}

// A LockService's semaphore and read-write lock calls, coalesced: every
// attempt (sem_acquire.lua, rw_acquire.lua) and every release (sem_release.lua,
// rw_release.lua) on the same resource, with the same count or mode, made in
// one turn of the client's event loop goes in one script call, so its fixed
// cost (the script itself, the clock, the sweep, the count, the writer's
// check, the line) is paid once per turn, not once per holder. Each holder is
// still granted under its own token, lease, slot and fence, and released
// against its own token and lease, in the order asked; each caller gets its
// own answer, as from a call of its own. Any thread may call; one LockService
// owns one.
class SemaphoreCalls : public std::enable_shared_from_this<SemaphoreCalls> {
 public:
  explicit SemaphoreCalls(redis::Client& client) : client_(client) {}
  // What a semaphore attempt shares with the others of its call
  // (sem_acquire.lua's ARGV 4-7): only attempts that agree on all of it go
  // in one call.
  struct PermitTerms {
    long long ttl_ms = 0;
    bool fence = false;
    bool wait = false;  // joins the line when busy, under its token
    long long waiter_lease_ms = 0;
  };
  // One attempt under `token`, in the line (when terms.wait) as `waiter`
  // ("" = the token); `keys` its five keys; done gets its own reply
  // ({1, fence, slot, permits}, {0, ms left, permits, 0} or {-1, evicted, 0,
  // 0}). `epoch`: the lock-state record's id the grant is admitted under,
  // compared in the script ("" = not compared: a cluster, whose record is in
  // another slot).
  void acquire(const std::vector<std::string>& keys, int permits, const std::string& evicted,
               const std::string& epoch, const redis::Confirm& confirm, const PermitTerms& terms,
               std::string token, std::string waiter, redis::ConfirmedCompletion done);
  void release(const KeyBuilder& keys, const std::string& resource, std::string member, int permits,
               LockService::ReleaseHandler done);
  // A reader's or the writer's attempt: `item` is its six per-attempt
  // arguments (rw_acquire.lua), `keys` its six keys.
  void acquire_rw(const std::vector<std::string>& keys, LockMode mode, const std::string& evicted,
                  const std::string& epoch, const redis::Confirm& confirm, std::vector<std::string> item,
                  redis::ConfirmedCompletion done);
  void release_rw(const KeyBuilder& keys, const std::string& resource, std::string token, LockMode mode,
                  LockService::ReleaseHandler done);

 private:
  struct Batch {
    const redis::Script* script = nullptr;
    std::vector<std::string> keys, args;  // the common arguments, then each item's
    redis::Confirm confirm;
    std::vector<redis::ConfirmedCompletion> done;
    // The reply: one element per item (any shape), or a semaphore grant's
    // (sem_acquire.lua): the call's three shared values, then one code per
    // attempt, then, with fences, one fence each; each caller gets its
    // attempt as four values (semaphore.cpp, grant_reply).
    bool grants = false;
    bool fenced = false;
  };
  // The holders' key, the script, the count (a read-write lock: its mode), the
  // eviction count and the epoch (one string), the confirmation, and a
  // semaphore attempt's shared terms (ttl ms, waiter lease ms, fence + 2 *
  // wait; zero elsewhere).
  using BatchKey =
      std::tuple<std::string, const void*, int, std::string, int, long long, bool, long long, long long, int>;
  redis::ConfirmedCompletion release_completion(LockService::ReleaseHandler done);
  template <class MakeBatch>
  void add(BatchKey key, MakeBatch&& make, std::vector<std::string> item, redis::ConfirmedCompletion done);
  void send(Batch b);
  redis::Client& client_;
  std::mutex mu_;
  std::map<BatchKey, Batch> pending_;
};
}  // namespace detail
}  // namespace jobguard
