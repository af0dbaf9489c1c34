// Counting semaphores: at most N holders of a resource at once ("at most 5
// workers call the payment provider"), on the mutex's machinery.
//
// A permit is a Lock (LockOptions::permits = N): it has its own owner token,
// a lease that a LeaseScheduler renews and loses like a mutex's, the
// quarantine gate in front of every grant, an optional fencing token from
// the resource's fence counter (the mutex's rules), and a slot in [0, N)
// that no other live holder has, so a downstream can fence each slot as it
// fences a mutex. Waiters are served first come, first served and woken by
// name when a permit comes back. A crashed holder's permit comes back when
// its lease expires by the server's clock: not before, and at the next
// attempt after. What this protects against and what not: docs/semaphore.md.
//
//   auto svc = LockService::create(client);
//   LockOptions o{.ttl = 10s, .wait = 30s, .fence = true, .permits = 5};
//   if (auto permit = svc->acquire("payment-provider", o)) { ... }
//
// The awaitable and callback forms are the mutex's (LockService::async_acquire,
// <jobguard/async.hpp>) with the same options.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jobguard/admin.hpp"
#include "jobguard/lock.hpp"

namespace jobguard {

// One live permit (its lease not yet expired by the server's clock).
struct PermitHolder {
  std::string holder;  // token_owner(): "web-3/4121/job"
  int slot = 0;
  std::chrono::milliseconds ttl_left{0};
};

// What Redis says about one semaphore now (one read-only script).
struct SemaphoreInfo {
  std::string resource;
  std::string key;                    // the holders' key
  std::optional<int> stored_permits;  // set_permits(); nullopt = each acquire's own count
  std::vector<PermitHolder> holders;  // live holders, by slot
  std::optional<std::int64_t> fence;  // the resource's fencing high-water mark
  std::int64_t waiters = 0;           // live places in the line
  std::int64_t server_time_ms = 0;
};

// Blocking, not from the client's event-loop thread. Throws Error on Redis
// failures and a malformed resource.
SemaphoreInfo inspect_semaphore(LockService& service, std::string_view resource);

// Stores the permit count of `resource`: from now on it overrides every
// acquire's LockOptions::permits. Lowering it never takes a permit from a
// holder; no new permit is granted until the holders are fewer than the new
// count. Raising it wakes the waiters. The stored count is state like a lock
// key: a server that loses it (a restart without persistence) falls back to
// each acquire's own count. Throws Error(invalid_argument) for a count outside
// [1, LockOptions::kMaxPermits]; Error on Redis failures.
void set_permits(LockService& service, std::string_view resource, int permits);
// Forgets the stored count (each acquire's own count applies again).
void clear_permits(LockService& service, std::string_view resource);

namespace admin {

// Which permit an operator force-releases: its slot, or its holder (the
// token_owner "host/pid/job" that `locks show` prints), or both (the slot,
// only while that holder has it).
struct PermitReleaseOptions {
  std::string reason;  // required: goes into the audit record
  std::string who;     // default empty = default_who()
  std::optional<int> slot;
  std::string holder;
  std::size_t audit_maxlen = 10000;
};

// The mutex's force_release for one permit of `resource`'s semaphore, in one
// script: removes that live holder (its slot comes free), advances the
// resource's fence past every fence issued, wakes the waiters and appends an
// audit record (holder "host/pid/job (slot N)"). Like the mutex's, it does
// not stop the old holder: its renewal finds the permit gone and a
// downstream that fences each slot refuses its late writes. Outcomes:
// released; not_held (no live permit matches); holder_changed (the slot is
// someone else's now). Throws Error(invalid_argument) without a reason,
// without a slot or holder, or when the holder alone names more than one
// permit; Error on Redis failures. Blocking.
ForceReleaseResult force_release_permit(LockService& service, std::string_view resource,
                                        const PermitReleaseOptions& opts);

// The semaphores of `service`'s key prefix that have live holders, sorted by
// resource (SCAN of the holders' keys, then one inspect each; `opts` as for
// list_locks, its filter and limit included). Blocking.
std::vector<SemaphoreInfo> list_semaphores(LockService& service, const ListOptions& opts = {});

}  // namespace admin

}  // namespace jobguard
