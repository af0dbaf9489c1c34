// Shared by lease.cpp (the Lease a caller holds) and lease_scheduler.cpp
// (what renews it): a lease's state and the scheduler's insides.
#pragma once

#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stop_token>
#include <string>
#include <vector>

#include "jobguard/lease.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/quorum.hpp"
#include "lock/deadline_buckets.hpp"
#include "lock/lease_timeline.hpp"
#include "lock/quarantine.hpp"
#include "lock/quorum_internal.hpp"

namespace jobguard {

struct Lease::State {
  using Clock = std::chrono::steady_clock;
  using ms = std::chrono::milliseconds;

  State(std::shared_ptr<LeaseScheduler> s, Lock l, const LeaseOptions& o, const MonotonicClock& c,
        observe::LockClassMetrics& m, std::vector<Lock> others = {})
      : sched(std::move(s)),
        lock(std::move(l)),
        more(std::move(others)),
        opts(o),
        clock(c),
        metrics(m),
        tl(detail::LeaseTimeline::resolve(lock.ttl(), o), lock.acquired_at()),
        coalesce(tl.config().coalesce),
        safe_until_ns(tl.safe_until().time_since_epoch().count()) {}

  // A quorum lease's lock (LeaseScheduler::adopt(QuorumLock)) and its last
  // renewal's answers (for the reason; loop thread only). The lease's own
  // paths release it (or not, when lost): never the lock's destructor.
  struct Quorum {
    explicit Quorum(QuorumLock l) : lock(std::move(l)) {}
    ~Quorum() { lock.detach(); }
    QuorumLock lock;
    detail::ExtendTally last;
  };

  std::shared_ptr<LeaseScheduler> sched;
  Lock lock;  // empty (not held) for a quorum lease
  // The rest of a multi-lock's set (LeaseScheduler::adopt_all): renewed with
  // `lock` as one, and losing any of them loses the lease.
  std::vector<Lock> more;
  std::unique_ptr<Quorum> quorum;  // set: a quorum lease, and `lock` is empty
  LeaseOptions opts;
  const MonotonicClock& clock;       // the scheduler's (= the service's)
  observe::LockClassMetrics& metrics;  // the lock's class in the scheduler's registry
  detail::LeaseTimeline tl;  // event-loop thread only
  ms coalesce;               // resolved LeaseOptions::coalesce
  // Mirrors of the timeline for other threads.
  std::atomic<Clock::rep> safe_until_ns;
  std::atomic<LeaseState> state{LeaseState::active};
  std::atomic<std::uint64_t> renewals{0};
  mutable std::mutex mu;  // reason, on_lost
  std::string reason;
  std::function<void(LeaseState, const std::string&)> on_lost;
  // Lease::when_ended waiters by id, guarded by mu; taken all at once when
  // the lease ends (ended_with says how, and turns later ones away).
  std::map<std::uint64_t, std::function<void(LeaseState)>> end_waiters;
  std::uint64_t next_waiter = 0;
  std::optional<LeaseState> ended_with;
  std::stop_source stop;
  std::atomic<bool> release_called{false};
  // In the scheduler's deadline queue, under generation qgen: an entry with
  // another generation is one left behind by a reschedule (loop thread only).
  bool queued = false;
  std::uint64_t qgen = 0;
  // The scheduler's epoch generation this lease's epoch was last found equal
  // to (loop thread only; 0 = never).
  std::uint64_t epoch_same_gen = 0;

  const std::string& key() const noexcept { return quorum ? quorum->lock.key() : lock.key(); }
  const std::string& token() const noexcept { return quorum ? quorum->lock.token() : lock.token(); }
  const std::string& resource() const noexcept { return quorum ? quorum->lock.resource() : lock.resource(); }
  Clock::time_point acquired_at() const noexcept { return quorum ? quorum->lock.acquired_at() : lock.acquired_at(); }
};

// The scheduler's loop-thread state: the leases by their next deadline, the
// renewals they send and what the replies say (lease_scheduler.cpp).
struct LeaseScheduler::Impl {
  using Clock = std::chrono::steady_clock;
  using ms = std::chrono::milliseconds;
  using DeadlineQueue = detail::DeadlineBuckets<std::shared_ptr<Lease::State>>;

  Impl(boost::asio::any_io_executor ex, const MonotonicClock& c, observe::Registry& r) : timer(ex), clock(c), registry(r) {}
  boost::asio::steady_timer timer;
  const MonotonicClock& clock;
  observe::Registry& registry;
  Clock::time_point armed_for = Clock::time_point::max();
  // Loop thread only. 1 ms buckets: a lease is looked at up to 1 ms after
  // its deadline, nothing next to a renewal period or a drift allowance.
  DeadlineQueue queue{ms(1)};
  std::size_t queued = 0;  // leases in the queue (its entries include stale ones)
  std::mt19937_64 rng{std::random_device{}()};
  std::atomic<std::uint64_t> active{0}, renewals_sent{0}, batches{0}, failures{0}, lost{0};
  std::weak_ptr<LeaseScheduler> owner;
  ms max_coalesce{0};  // the widest coalesce window (capped at 50 ms) of any lease scheduled; loop thread only
  std::string seen_epoch;                 // state_lost; loop thread only
  std::uint64_t seen_epoch_gen = 1;
  std::shared_ptr<void> gate_ptr;  // the service's detail::StateGate
  double jitter(double frac);
  static bool current(const DeadlineQueue::Entry& e) { return e.item->queued && e.item->qgen == e.gen; }
  void schedule(const std::shared_ptr<Lease::State>& s);
  void dequeue(Lease::State& s);
  void unschedule(const std::shared_ptr<Lease::State>& s);
  void arm();
  void publish(const std::shared_ptr<Lease::State>& s);

  // Loop thread. The hard timeout stopped a lease whose key is still ours (as
  // far as we know): delete it now, by compare-and-delete, so the resource is
  // free at once instead of at the TTL. The Lock itself is not touched (its
  // owner's thread may be reading it); Lease::release() finds the lease lost
  // and only detaches it.
  void release_timed_out(const std::shared_ptr<Lease::State>& s);

  // "jobguard:lock:{a}", or "jobguard:lock:{a}, jobguard:lock:{b}" for a multi-lock.
  static std::string keys_text(const Lease::State& s);

  // Loop thread: the lease ended; wake every when_ended waiter.
  static void end(Lease::State& s, LeaseState how);
  void tick();
  detail::StateGate& gate() { return *static_cast<detail::StateGate*>(gate_ptr.get()); }

  // Why the lease is lost because its server lost lock state; "" if it is not.
  std::string state_lost(Lease::State& s);

  // Loop thread: the gate found a new epoch. Every lease granted in another
  // one is lost now, not at its next renewal.
  void on_new_epoch(const std::string& reason);

  // Keys per script call: long enough to amortise the call, short enough
  // that one call holds the server for well under a millisecond.
  static constexpr std::size_t kRenewalBatch = 256;
  void send_renewals(std::vector<std::shared_ptr<Lease::State>> batch);

  // A renewal of its own: a lease whose grant asked for replica confirmation
  // (its renewal is confirmed like the grant: WAIT after it on the same
  // connection, and an unconfirmed one, fail-closed, fails like one Redis did
  // not answer, so the safe time only moves on renewals the replicas have),
  // or any lease on a Redis Cluster (a batch's keys are in many slots).
  void send_renewal(const std::shared_ptr<Lease::State>& s);
  bool batchable(const Lease::State& s) const;
  void renewed(const std::shared_ptr<Lease::State>& s, const Error& e, bool ours);

  // A quorum lease's renewal (quorum_lease.cpp): to every instance, the
  // answers counted back on this loop.
  void send_quorum_renewal(const std::shared_ptr<Lease::State>& s);
  void quorum_renewed(const std::shared_ptr<Lease::State>& s, const detail::ExtendTally& t);
  // Why a quorum lease was lost, naming the majority and the instances.
  static std::string quorum_why_lost(const Lease::State& s, LeaseState st);
  // A scheduler of quorum leases only, on `ex` (a QuorumLockService's loop).
  static std::shared_ptr<LeaseScheduler> for_quorum(boost::asio::io_context& loop);
  boost::asio::io_context* own_loop = nullptr;  // for_quorum's
  // Whether the calling thread is the one the scheduler's renewals run on.
  bool on_loop() const;
};

}  // namespace jobguard
