// Shared by the library's parts (include/jobguard/detail/, not installed), not an
// application API; the guarded runner (job) composes with it. A lock's grant
// or release in the same script call as the caller's own work, so a guarded
// job's claim (completion record check + grant + idempotency key) and its
// finish (key completed + record + release) are one round trip each instead
// of three.
//
// The lock's rules stay in acquire.lua and release.lua: a composed script
// embeds them as Lua functions (acquire_as_function(), release_as_function())
// and calls them; nothing of their logic is repeated.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/reply.hpp"
#include "jobguard/redis/script.hpp"

namespace jobguard::detail {

// The lock's grant and release as Lua functions a composed script calls by
// name, with named parameters:
//   grant_once(lock, fence_counter, record, token, ttl_ms, fence, evicted, epoch)
//     a try-once, non-fair grant: acquire.lua's reply ({1, fence or -1},
//     {0, pttl}, {-1, evicted_keys}); fence '1' | '0'; evicted the gate's
//     evicted_keys or '' (where the server does not evict); record the
//     lock-state record and epoch its id at the gate's check ('' = not
//     compared): a record changed since is {-1, -1};
//   release_held(lock, waiters, token, channel, sharded)
//     release.lua's reply (0 not ours, 1 released, 2 released and a waiter
//     woken); waiters the lock's default-mode waiters key; sharded '1' on a
//     Redis Cluster, else ''.
// (Underneath, acquire.lua and release.lua as `local function acquire(KEYS,
// ARGV)` / `release(KEYS, ARGV)`: their parameters shadow the globals.)
std::string acquire_as_function();
std::string release_as_function();
// Any script's text as `local function <name>(KEYS, ARGV) ... end`.
std::string as_lua_function(std::string_view name, std::string_view body);

// A try-once, non-fair grant attempt through `script`, which gets the three
// keys and five arguments such a grant reads first — KEYS 1 the lock, 2 its
// fence counter, 3 the lock-state record; ARGV 1 token, 2 ttl ms, 3 fence
// 0|1, 4 the gate's evicted_keys ('' where the server does not evict), 5 the
// record's epoch id at the gate's check — and the caller's after them. The
// script calls
//   grant_once(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
// and returns {status, fence or pttl, part}:
// status 1 granted, 0 busy, -1 keys evicted or the record changed since the
// gate's check (all as acquire.lua), 2 declined by the caller's own check
// before the grant; `part`
// is the caller's and handed back as it is.
struct ComposedAttempt {
  const redis::Script* script = nullptr;  // static: outlives the call
  std::vector<std::string> keys;          // after the lock's three
  std::vector<std::string> args;          // after its five
  // Sends the call instead of client.async_eval(*script, ...) when set (the
  // job runner's batcher: src/job/fused.hpp); the same contract.
  std::function<void(std::vector<std::string> keys, std::vector<std::string> args, redis::Completion done,
                     redis::CallOptions opts)>
      eval;
  // The plain form, for a caller whose check is "none of these keys exists"
  // (the job runner's first run of a unit): where the grant is the bare
  // SET NX PX (not fenced, on a server that does not evict), it is sent as
  // that and `EXISTS plain_checks…` after it, back to back on one
  // connection, instead of the script. Granted and none exists: granted,
  // with `plain_part` as the caller's part (a string reply; nil when empty).
  // Granted and one exists: the grant is handed back unused (not counted, as
  // a grant on an unchecked connection is) and the answer is fallback, for
  // the caller's ordinary path to read what is there. Busy: busy.
  // Why it is safe to check after the grant, and what it saves:
  // docs/lock-safety.md, "The plain claim". Empty: always the script.
  std::vector<std::string> plain_checks;
  std::string plain_part;
};

enum class ComposedStatus {
  granted,
  busy,      // held by another: counted as a finished try-once when opts.wait is 0
  declined,  // the caller's check said no; no lock
  // Not answered by the lock: a fair or replica-confirmed lock, a Redis
  // Cluster, the state gate not ready (a check or a quarantine pending),
  // keys evicted, or a grant on a connection the gate did not check (handed
  // back). Take the ordinary acquire path; the
  // caller's part may still have run (`part`).
  fallback,
};

struct ComposedResult {
  ComposedStatus status = ComposedStatus::fallback;
  std::optional<Lock> lock;  // granted
  redis::Reply part;         // the caller's part of the reply (nil when the script gave none)
  std::string token;         // the token the attempt used (its idempotency owner may derive from it)
};

// `done` runs on the event loop, never inside this call. An Error when the
// script failed or the server could not be reached: the attempt is in doubt
// (it may have run), as any acquire whose reply was lost.
using ComposedHandler = std::function<void(const Error&, ComposedResult)>;
void async_attempt_composed(LockService& svc, std::string resource, const LockOptions& opts, ComposedAttempt c,
                            ComposedHandler done);

}  // namespace jobguard::detail
