// A LockService's insides, shared by the files that make it up:
//   lock_service.cpp    the service's calls (acquire, release, extend) and the
//                       release and extend scripts' calls
//   grant_channels.cpp  where waiters hear a release or a fair grant: the
//                       subscriber, its channels and the waiters behind them
//   waiter_shell.cpp    one acquire in progress, the I/O around WaiterMachine
//   lock.cpp            the Lock a grant becomes
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "jobguard/clock.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/subscriber.hpp"
#include "lock/semaphore_internal.hpp"
#include "lock/waiter.hpp"

namespace jobguard {

// Loop-thread state of a LockService: the subscriber, the channels it listens
// on and the waiters behind them (grant_channels.cpp).
struct LockService::Impl : std::enable_shared_from_this<LockService::Impl> {
  struct WaiterBase {
    virtual ~WaiterBase() = default;
    // A release on the waiter's resource channel (or a reconnect that may
    // have hidden one): look again.
    virtual void wake() = 0;
    // A fair release handed the lock to this waiter (release.lua).
    virtual void on_grant(std::optional<std::int64_t> fence) = 0;
    // Its entry in a default-mode line ("wake <id>" names it).
    virtual const std::string& waiter_id() const noexcept = 0;
  };

  // Plain waiters listen on their resource's release channel, shared by every
  // waiter of this service on it; fair waiters on this service's grant
  // channel, where a release names the waiter it handed the lock to. The
  // grant channel stays for the service's life, so a worker looping on a fair
  // lock does not SUBSCRIBE, UNSUBSCRIBE and try a second time around every wait.
  //
  // On a cluster (sharded pub/sub) a release can only SPUBLISH to a channel
  // in its own slot, so a service has a grant channel per fair resource it
  // waits on, with the resource's hash tag (grant_channel_for). Each is kept
  // while it has waiters and for `linger_until` after the last one left: a
  // waiter that gave up may still be handed the lock for as long as its queue
  // place lives, and the service passes such a grant on only while it hears it.
  struct Channel {
    redis::Subscriber::Id id = 0;
    std::unordered_set<WaiterBase*> waiters;
    bool ready = false;
    bool grants = false;                    // a grant channel (fair waiters)
    MonotonicClock::time_point ready_at{};  // when the loop saw the server's confirmation
    MonotonicClock::time_point linger_until{};  // cluster grant channel without waiters: dropped after
  };

  // What a waiter that just registered must do to be sure it hears the release.
  using Heard = detail::WaiterMachine::Heard;

  Impl(redis::Client& c, KeyBuilder k, const MonotonicClock& clk);

  // The client outlives the service and so every handler that finds us alive.
  redis::Client& client;
  // The service's clock: channel confirmations are compared with attempts' send times.
  const MonotonicClock& clock;
  const KeyBuilder keys;
  const std::string grant_channel;
  const bool sharded;  // a Redis Cluster: sharded pub/sub
  // Semaphore attempts and releases: one script call per resource per turn of the loop.
  std::shared_ptr<detail::SemaphoreCalls> semaphore_calls;

  // Where a release tells a fair waiter of ours on `resource` that it has the
  // lock. On a cluster "<prefix>:grant:{resource}:<id>", in the lock's slot.
  std::string grant_channel_for(const std::string& resource) const;

  std::unique_ptr<redis::Subscriber> subscriber;  // made on first wait; loop thread only
  mutable std::mutex sub_error_mu;
  Error sub_error;  // the subscriber's last refusal; guarded by sub_error_mu
  std::unordered_map<std::string, Channel> channels;               // by channel name; loop thread only
  std::unordered_map<std::string, WaiterBase*> granted_by_token;   // fair waiters; loop thread only
  std::unordered_map<std::string, MonotonicClock::time_point> abandoned;   // token -> forget after; loop thread only
  // Default mode: a release of ours woke the waiter that has waited longest
  // (release.lua), and that waiter's acquire is still on its way: the lock is
  // free until it lands. A holder that loops (release, then at once wait for
  // the same lock again) would take it back first almost every time its
  // acquire beats the woken waiter's — on a slow host often enough to matter
  // (see docs/bench.md), each one sending the woken waiter to the back of its wait and
  // stretching the tail of every worker's wait. So our next waiting acquire
  // of that resource holds its first attempt until the instant here: one of
  // the release's round trips from its reply (at least 200 us, at most 5 ms).
  // The wake left the server with our reply, so by then the woken waiter's
  // attempt has normally landed, and we join the line behind it. Longer is
  // worse: a yield that outlasts the woken waiter's hold lands in the next
  // handoff's gap and takes the lock from the next woken waiter (three
  // round trips raise the p99 wait above no yield at all with a 1 ms hold:
  // see docs/bench.md). It then asks as usual, so a woken
  // waiter that died costs the loop that little and no more; a live one
  // costs it nothing, as it would find the lock taken anyway. Try-once
  // acquires never wait for it: their caller wants an answer now.
  // Resource -> until; entries last a few ms and are swept on insert.
  std::unordered_map<std::string, MonotonicClock::time_point> yield_until;  // loop thread only

  void woke_waiter(const std::string& resource, MonotonicClock::time_point sent, MonotonicClock::time_point replied);
  // The instant our next waiting acquire of `resource` may first ask, if one
  // is owed to a waiter we woke; consumed by that acquire.
  std::optional<MonotonicClock::time_point> take_yield(const std::string& resource, MonotonicClock::time_point now);
  static constexpr long kYieldMinUs = 200, kYieldMaxUs = 5000;

  std::string last_class;                                  // LockService::class_metrics; loop thread only
  observe::LockClassMetrics* last_metrics = nullptr;

  redis::Subscriber& sub();
  // "<token> <fence or -1> <resource>" on the grant channel.
  void on_grant_message(const std::string& msg);
  // Loop thread. A fair waiter that ended without the lock; its place in the
  // queue outlives it by at most `place_lease`.
  void abandon(std::string token, std::chrono::milliseconds place_lease);
  // Loop thread. `sent_at`: when the waiter sent the attempt that found the lock busy.
  Heard watch(const std::string& channel, WaiterBase* w, MonotonicClock::time_point sent_at, bool grants);
  // Loop thread. `linger`: how long a cluster grant channel is kept once its
  // last waiter leaves (the waiter's queue place may outlive it that long).
  void unwatch(const std::string& channel, WaiterBase* w, std::chrono::milliseconds linger = {});
  // Cluster: the grant channels without waiters whose linger has passed
  // (`keep` excepted: it is about to be used). Swept when a waiter comes or
  // goes, so an idle service keeps at most the channels of its last waits.
  void drop_idle_grant_channels(const std::string& keep);

 private:
  void on_release_message(const std::string& channel, const std::string& msg);
  void on_channel_ready(const std::string& channel);
  // Every waiter on `ch` looks again (the set is copied: a woken waiter may leave it).
  static void wake_all(const Channel& ch);
};

namespace detail {
const redis::Script& lock_acquire_script();
const redis::Script& lock_extend_script();
const redis::Script& lock_leave_script();

// The client's on_warning sink, else stderr.
void warn_line(redis::Client& client, const std::string& line);

// The WAIT (or WAITAOF, where the last lock-state check found Redis 7.2+
// with AOF on) a confirmation sends.
redis::Confirm to_confirm(const ReplicaConfirmation& c, const std::shared_ptr<void>& gate);

// Releases a lock by compare-and-delete; a fair lock's release hands it to the
// live head of its queue (release.lua). Shared by Lock, LockService and the
// grant listener, which must work after the service that started it is gone.
// `woke`: called on the loop thread when the release woke a default-mode
// waiter by name (release.lua's 2), before `done`.
void release_lock(redis::Client& client, const KeyBuilder& keys, const std::string& resource,
                  const std::string& token, LockService::ReleaseHandler done, bool fair,
                  std::function<void()> woke = nullptr);

// The exception a blocking call rethrows on the caller's thread, with a text
// of its own: copies of an Error share their text, and the loop thread drops
// its copy after the handler that fulfils the promise returns. Sharing it,
// the caller's thread and the loop race to free it as far as TSan can see
// (tests/tsan_suppressions.cpp); unshared, each frees its own.
std::exception_ptr caller_exception(const Error& e);

// One acquire in progress (waiter_shell.cpp). Made on any thread, started on
// the client's event loop; it keeps itself alive by its pending operations.
class LockWaiter;
std::shared_ptr<LockWaiter> make_waiter(std::shared_ptr<LockService> svc, std::string resource, LockOptions opts,
                                        LockService::AcquireHandler done);
void start_waiter(const std::shared_ptr<LockWaiter>& w, LockService::Impl* impl);
}  // namespace detail

}  // namespace jobguard
