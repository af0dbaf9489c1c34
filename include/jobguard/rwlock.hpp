// Read-write locks: readers of a resource hold it together, a writer holds
// it alone ("reports read the ledger together, the nightly rebuild writes it
// alone"), on the mutex's machinery.
//
// A reader or the writer is a Lock (LockOptions::mode = LockMode::shared or
// LockMode::exclusive): each holder has its own owner token, a lease that a
// LeaseScheduler renews and loses like a mutex's, the quarantine gate in
// front of every grant, and an optional fencing token from the resource's
// fence counter. A writer is granted only once the readers it excluded are
// gone, so its fence is above each of theirs, and every reader after it gets
// a higher one. Waiters are served in arrival order and woken by name.
//
// Writer preference: a waiting writer stops new readers from entering, so a
// stream of readers cannot starve it: a writer waits for the holders it found
// and the waiters ahead of it in the line, never for a reader that came after
// it. What bounds a reader is its own hold (the job) and, should it crash,
// its lease: its place comes back when the lease expires by the server's
// clock. What this protects against and what not: docs/rwlock.md.
//
//   auto svc = LockService::create(client);
//   LockOptions o{.ttl = 10s, .wait = 30s, .fence = true};
//   o.mode = LockMode::shared;
//   if (auto reader = svc->acquire("ledger", o)) { ... }
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

// One live holder of a read-write lock (its lease not yet expired by the
// server's clock).
struct RwHolder {
  std::string token;   // the owner token (what an audited force release names)
  std::string holder;  // token_owner(): "web-3/4121/job"
  std::chrono::milliseconds ttl_left{0};
};

// What Redis says about one read-write lock now (one read-only script).
struct RwLockInfo {
  std::string resource;
  std::string readers_key, writer_key;
  std::optional<RwHolder> writer;
  std::vector<RwHolder> readers;      // by lease expiry
  std::optional<std::int64_t> fence;  // the resource's fencing high-water mark
  std::int64_t waiters = 0;           // live places in the line
  std::int64_t waiting_writers = 0;   // of which writers
  // How long the longest-waiting live writer has been in the line (since its
  // first arrival, by the server's clock); 0 when no writer waits. Readers
  // that keep a writer waiting are what doctor's rwlocks check reports.
  std::chrono::milliseconds writer_waiting{0};
  std::int64_t server_time_ms = 0;
};

// Blocking, not from the client's event-loop thread. Throws Error on Redis
// failures and a malformed resource.
RwLockInfo inspect_rwlock(LockService& service, std::string_view resource);

// An operator's force release (`jobguard locks release KEY --rw`): removes
// the live readers and writer whose owner (token_owner) is
// opts.expect_holder — one reader, say — or every holder when it is empty,
// advances the resource's fence past every fence issued, wakes the waiters
// and appends an audit record (holder "reader web-3/4121/job,..."), in one
// script. Like admin::force_release it does not stop the holders removed:
// they see a lost lease at their next renewal, and only a fenced downstream
// refuses their late writes. Outcome holder_changed: opts.expect_holder
// holds nothing but someone else does (`holder` names one). Not confirmed
// by replicas. Throws Error(invalid_argument) without a reason, Error on
// Redis failures.
admin::ForceReleaseResult force_release_rw(LockService& service, std::string_view resource,
                                           const admin::ForceReleaseOptions& opts);

namespace admin {

// The read-write locks of `service`'s key prefix that have a live reader or
// writer, sorted by resource (SCAN of the readers' and writers' keys, then
// one inspect each; `opts` as for list_locks, its filter and limit
// included). Blocking.
std::vector<RwLockInfo> list_rwlocks(LockService& service, const ListOptions& opts = {});

}  // namespace admin

}  // namespace jobguard
