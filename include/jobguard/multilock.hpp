// All-or-none locks over several resources ("move stock from warehouse A to
// B: hold both, or neither"), on the mutex's machinery.
//
// Each resource is a plain mutex key (jobguard:lock:{R}, its own owner token,
// its own fence counter), so `locks show`, `doctor`, force release and every
// other client see ordinary locks. On one server (and without replica
// confirmation) one script grants every key or none per attempt, as on a
// Redis Cluster for names that hash to one slot. Otherwise, on a cluster,
// whose keys live in their resources' slots, acquire_all takes them
// one by one, try-once each, in canonical order (byte order of the resource
// names); a busy key makes it release every key it took (and wait for the
// releases' replies) before it reports busy or waits. Either way a contender
// never holds some keys while it waits for others, so two contenders cannot
// deadlock whatever order they name the resources in. Waiting is a retry with
// full-jitter backoff
// (LockOptions::backoff_min/max) until LockOptions::wait runs out; it is not
// woken by releases. Every grant passes the quarantine gate and is fenced
// (LockOptions::fence) exactly as a mutex grant is, per key.
//
// LeaseScheduler::adopt_all makes the set one Lease: one renewal of every key
// per period (its safe time moves only when every key was renewed), lost —
// one lost signal, one stop_token — when any key is lost.
// What this protects against and what not: docs/multilock.md.
//
//   auto svc = LockService::create(client);
//   if (auto both = acquire_all(*svc, {"warehouse:A", "warehouse:B"}, {.ttl = 10s, .wait = 5s, .fence = true})) {
//     move_stock(both->fence("warehouse:A"), both->fence("warehouse:B"));
//   }
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"

namespace jobguard {

// Several held locks, taken together. Destroying one that is still held
// releases every lock (each Lock's scope exit). Movable, not copyable; the
// threading rules are Lock's.
class MultiLock {
 public:
  explicit MultiLock(std::vector<Lock> locks) : locks_(std::move(locks)) {}
  MultiLock(MultiLock&&) noexcept = default;
  MultiLock& operator=(MultiLock&&) noexcept = default;

  // In canonical order: byte order of the resource names.
  const std::vector<Lock>& locks() const noexcept { return locks_; }
  // The lock of `resource`; null if it is not one of the set.
  const Lock* find(std::string_view resource) const noexcept;
  // The fencing token `resource`'s grant was issued from its own fence
  // counter (LockOptions::fence); nullopt without one or for a resource not
  // in the set. Fences of different resources are not comparable.
  std::optional<std::int64_t> fence(std::string_view resource) const noexcept;
  // Every lock still held (none released, detached or given away).
  bool held() const noexcept;

  // Releases every lock (compare-and-delete each). True if every one was
  // still ours. Throws the first Error after trying them all.
  bool release();
  // The non-blocking form: `done` gets (no error, all ours) or the first Error.
  void async_release(std::function<void(const Error&, bool)> done);
  // Hands the locks over (LeaseScheduler::adopt_all); this is empty after.
  std::vector<Lock> take() noexcept { return std::move(locks_); }

 private:
  std::vector<Lock> locks_;
};

// Acquires every resource or none; nullopt when any stayed busy for the whole
// wait (then none is held: each taken key was released and its release
// answered before). `opts` is a mutex's: permits and fair are refused, and so
// is an empty set or a resource named twice (Error(invalid_argument), thrown
// on the caller's thread). Throws Error on a Redis failure, after releasing
// what it took; a key whose release failed too is left to expire by its TTL.
// Blocking: not from the client's event-loop thread.
std::optional<MultiLock> acquire_all(LockService& service, std::vector<std::string> resources,
                                     const LockOptions& opts = {});
// The asynchronous form; `done` runs on the event loop, never inside the call.
using AcquireAllHandler = std::function<void(const Error&, std::optional<MultiLock>)>;
void async_acquire_all(LockService& service, std::vector<std::string> resources, LockOptions opts,
                       AcquireAllHandler done);

// The checks acquire_all makes before it sends anything, and the canonical
// order: returns the resources sorted, or throws Error(invalid_argument)
// naming the problem (no resource, one named twice, permits or fair set, or
// what LockService::check_options refuses).
std::vector<std::string> canonical_resources(const LockService& service, std::vector<std::string> resources,
                                             const LockOptions& opts);

}  // namespace jobguard
