// Redis locks done right: an owner token only its holder knows, atomic
// compare-and-delete / compare-and-pexpire, optional fencing tokens issued in
// the same script as the grant, waiting woken by pub/sub with full-jitter
// backoff as the fallback, and an optional fair (FIFO) mode.
//
// What a lock protects against and what it does not: docs/lock-safety.md.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "jobguard/clock.hpp"
#include "jobguard/error.hpp"

// No Asio here: a translation unit that only takes and releases locks does
// not pay for <jobguard/redis/client.hpp> (Boost.Asio, ~580 headers). The one
// that constructs the Client includes it.
namespace jobguard {
namespace redis {
class Client;
class Script;
class Subscriber;
}
namespace observe {
struct LockClassMetrics;
class Registry;
}

// Builds the Redis keys of a lock from the business object it guards
// ("invoice:48291", "tenant:alpha:sync"). Every key of one resource carries
// the resource in a hash tag, so the lock, its fence counter and its wait
// queue live in one Redis Cluster slot and one script can touch them all:
//   <prefix>:lock:{invoice:48291}    the lock (value = owner token)
//   <prefix>:fence:{invoice:48291}   the fencing high-water mark
//   <prefix>:queue:{invoice:48291}   fair-mode waiters (list) + :qexp (zset)
//   <prefix>:waiters:{invoice:48291} default-mode waiters by arrival (zset): a
//                                    release wakes the longest-waiting one
//   <prefix>:released:{invoice:48291} the pub/sub channel for releases
//   <prefix>:grant:<random>          a LockService's channel for fair handoffs
//   <prefix>:grant:{invoice:48291}:<random>  the same on a Redis Cluster, one per
//                                    fair resource (sharded pub/sub: in the lock's slot)
class KeyBuilder {
 public:
  // Throws Error(invalid_argument) on an empty prefix or one containing
  // braces, spaces or control characters.
  explicit KeyBuilder(std::string prefix = "jobguard");
  // Throws Error(invalid_argument) naming the problem for a resource that is
  // empty, longer than 512 bytes, or contains '{', '}', whitespace or control
  // characters (which would break the hash tag or logs).
  std::string lock_key(std::string_view resource) const;
  std::string fence_key(std::string_view resource) const;
  std::string queue_key(std::string_view resource) const;
  std::string queue_expiry_key(std::string_view resource) const;
  std::string waiters_key(std::string_view resource) const;
  std::string channel(std::string_view resource) const;
  // A counting semaphore's keys (semaphore.hpp), in the same slot as the
  // resource's fence counter, which its permits' fences share:
  //   <prefix>:sem:{r}      holders (zset "<token> <slot>" by lease expiry)
  //   <prefix>:semq:{r}     waiters by first arrival (zset) + :semqexp (liveness)
  //   <prefix>:permits:{r}  the stored permit count, when one was set
  //   <prefix>:semwake:{r}  the pub/sub channel a release wakes waiters on
  std::string permit_holders_key(std::string_view resource) const;
  std::string permit_line_key(std::string_view resource) const;
  std::string permit_line_expiry_key(std::string_view resource) const;
  std::string permit_count_key(std::string_view resource) const;
  std::string permit_channel(std::string_view resource) const;
  // A read-write lock's keys (rwlock.hpp), in the fence counter's slot too:
  //   <prefix>:rwr:{r}      readers (zset token by lease expiry)
  //   <prefix>:rww:{r}      the writer (zset, at most one live member)
  //   <prefix>:rwq:{r}      waiters by first arrival (zset) + :rwqexp (liveness)
  //   <prefix>:rwqw:{r}     the writers among them (zset, same arrivals)
  //   <prefix>:rwwake:{r}   the pub/sub channel a release wakes waiters on
  std::string rw_readers_key(std::string_view resource) const;
  std::string rw_writer_key(std::string_view resource) const;
  std::string rw_line_key(std::string_view resource) const;
  std::string rw_line_expiry_key(std::string_view resource) const;
  std::string rw_writers_line_key(std::string_view resource) const;
  std::string rw_channel(std::string_view resource) const;
  // "invoice:48291" from "jobguard:lock:{invoice:48291}"; nullopt if not ours.
  std::optional<std::string> resource_of(std::string_view lock_key) const;
  const std::string& prefix() const noexcept { return prefix_; }
  static void validate_resource(std::string_view resource);

 private:
  std::string key(std::string_view kind, std::string_view resource) const;
  std::string prefix_;
};

// "<host>/<pid>/<job>#<32 hex chars from the OS random source>". The prefix
// tells an operator who holds a lock; the 128 random bits make it unguessable
// and unique. Throws Error(invalid_argument) if job contains '#' or whitespace.
std::string make_token(std::string_view job_id = {});
// The readable part of a token ("web-3/4121/invoice-run"), or the whole value
// for tokens written by other clients (node-redlock, Laravel...).
std::string token_owner(std::string_view token);

// The compare-and-delete(-and-publish) script every jobguard lock is released
// with (KEYS[1] lock key; ARGV[1] token, ARGV[2] release channel), for tools
// that talk to Redis directly, like the raw half of `jobguard bench`. A fair
// lock's release also passes KEYS[2..4] queue, queue expiries, fence counter
// and ARGV[3] the resource, and hands the lock to the queue's live head.
const redis::Script& lock_release_script();

// What a grant (or renewal, or fence advance) that fewer replicas
// acknowledged than asked for does (LockOptions::on_unconfirmed).
enum class Unconfirmed {
  // The grant is released and the acquire fails with errc::server_busy
  // naming how many replicas acknowledged; an unconfirmed renewal does not
  // count (the lease's safe time does not move). The default.
  fail_closed,
  // The grant is kept, and a warning line goes to the client's on_warning
  // (stderr when unset): for classes where a double grant after a failover
  // is acceptable but should be seen.
  warn,
};
const char* to_string(Unconfirmed u) noexcept;

// The replica confirmation a lock asked for, resolved against the
// connection's defaults (Lock::confirmation()).
struct ReplicaConfirmation {
  int replicas = 0;                        // 0 = none
  std::chrono::milliseconds timeout{500};  // WAIT's timeout
  Unconfirmed on_unconfirmed = Unconfirmed::fail_closed;
};

// What a lock on a resource excludes (LockOptions::mode).
enum class LockMode {
  mutex,      // the plain lock: one holder
  shared,     // a reader of a read-write lock (<jobguard/rwlock.hpp>)
  exclusive,  // its writer: alone, no readers
};
const char* to_string(LockMode m) noexcept;

struct LockOptions {
  // Lock time-to-live; a crashed holder's lock frees itself after this.
  // Default 30 s; must be >= 10 ms.
  std::chrono::milliseconds ttl{30000};
  // How long acquire() waits for a busy lock. Default 0 = try once.
  std::chrono::milliseconds wait{0};
  // Issue a fencing token with the grant (see fence()). Default off: the
  // plain form is `SET key token NX PX ttl`, compatible with other clients.
  bool fence = false;
  // FIFO handoff: a releaser (or a newcomer) cannot barge ahead of a waiter;
  // the release hands the lock straight to the head of the queue.
  // Default off. Every client contending on a fair lock must use fair mode.
  bool fair = false;
  // Goes into the token's readable prefix and into logs.
  std::string job_id{};
  // Metrics and logs are per lock class, never per key.
  std::string lock_class = "default";
  // Fallback backoff while waiting: full jitter in [0, min(max, min*2^n)];
  // a queued fair waiter, which is told of its grant, refreshes its place
  // every [max/2, max] instead.
  std::chrono::milliseconds backoff_min{5};
  std::chrono::milliseconds backoff_max{200};
  // Replica-confirmed grants (docs/lock-safety.md): the grant, each renewal
  // of its lease and the fence issued with it are confirmed with `WAIT
  // replicas timeout` on the connection that wrote them before the holder
  // is told. -1 = the connection's `replicas` URL option
  // (redis::ConnectionOptions::lock_replicas, default 0 = off).
  int replicas = -1;
  // The server-side wait for the acknowledgements. 0 = the connection's
  // `replicas_timeout` (default 500 ms).
  std::chrono::milliseconds replicas_timeout{0};
  Unconfirmed on_unconfirmed = Unconfirmed::fail_closed;
  // 0: a mutex. N >= 1: one permit of a counting semaphore of N permits on
  // the resource (<jobguard/semaphore.hpp>): at most N holders at once,
  // waiters served first come, first served. A count stored for the resource
  // (set_permits) overrides N. Not with `fair` (permits are always FIFO).
  // At most kMaxPermits.
  int permits = 0;
  static constexpr int kMaxPermits = 10000;
  // shared / exclusive: a reader or the writer of the resource's read-write
  // lock (<jobguard/rwlock.hpp>) instead of its mutex: readers hold together,
  // a writer alone, and a waiting writer stops new readers from entering.
  // Not with `permits` or `fair` (its line is always served in order).
  LockMode mode = LockMode::mutex;
};

// Data-loss quarantine: a server that lost lock state (restarted without
// persistence, failed over to a replica that missed writes, evicted keys) is
// refused grants until every lease an earlier incarnation could have granted
// has expired. docs/lock-safety.md, "Quarantine after lost lock state".
struct QuarantineOptions {
  // The longest lock TTL any client of the server uses: the length of a
  // quarantine, and the largest ttl acquire() accepts (a longer lease would
  // outlive it). Default 0 = the connection's `max_ttl` URL option
  // (redis::ConnectionOptions::lock_max_ttl, default 60 s).
  std::chrono::milliseconds max_ttl{0};
  // A service that keeps granting checks the server again this often, which
  // catches a FLUSHALL or a REPLICAOF on a connection that stayed up (a
  // restart or failover breaks the connection and is checked at once).
  // Default 1 s; must be > 0.
  std::chrono::milliseconds recheck{1000};
  // While the service grants or holds a lease, the server's TIME is read
  // this often, so a holder learns within it that a forward step of the
  // server's clock expired its key early (docs/lock-safety.md, "Server clock
  // steps"). Default 200 ms; 0 = only the checks' and grants' own readings.
  std::chrono::milliseconds clock_probe{200};
};

// The explicit opt-out for a server the caller has just started empty (test
// fixtures, `--embedded`): records it as having kept its state, so its first
// grants are not quarantined. Never for a server that may have granted locks
// before: a restarted one looks exactly like a new one. Unchecked and without
// an audit; for a server someone else provisioned, the TrustOptions overload
// below. Blocking; throws Error.
void trust_new_server(redis::Client& client);

// The checked way to trust a server just provisioned (`jobguard server
// trust`): refuses when the server shows signs of having served locks, and
// leaves an audit record (who, when, why) in the lock-state record.
// docs/lock-safety.md, "Trusting a new server".
struct TrustOptions {
  // Why: stored in the record (trusted_why) and in the caller's log line.
  std::string reason;
  // Trust in spite of the signs found (they are stored in the record,
  // trusted_forced). Also lifts a quarantine running on the server.
  bool force = false;
  // The lock keys' prefix (LockService's): any key under "<prefix>:" but the
  // lock-state record itself is a sign of locks served.
  std::string key_prefix = "jobguard";
  // Who: default empty = "user@host pid N" of this process.
  std::string who;
  // SCAN COUNT hint while looking for keys under the prefix.
  std::size_t scan_count = 1000;
};

// One primary's answer (one server: one; a cluster: one per primary).
struct TrustedServer {
  enum class Outcome {
    trusted,  // the record now says intact; written by this call
    already,  // the record already said intact (this process wrote it, nothing evicted, no quarantine): untouched
    refused,  // signs of having served locks and no force: untouched
  };
  std::string address;  // host:port of the primary
  Outcome outcome = Outcome::refused;
  std::string epoch;                // the record's epoch id (after the call)
  std::int64_t server_time_ms = 0;  // the server's TIME when it judged (ms since the epoch)
  std::vector<std::string> signs;   // what it found: why it refused, or what force overrode
  // The record's audit fields ("" / 0 when it has none: trusted by the
  // unchecked trust_new_server(client), or never trusted).
  std::string trusted_by, trusted_why;
  std::int64_t trusted_at_ms = 0;
};

struct TrustResult {
  std::vector<TrustedServer> servers;
  // True when any primary refused; then no record was written anywhere (on a
  // cluster every primary is judged before any is written).
  bool refused() const noexcept;
};

// Blocking; throws Error: invalid_argument for a replica or a bad prefix,
// as Client::exec for the connection. A refusal is not an exception: see
// TrustResult::refused().
TrustResult trust_new_server(redis::Client& client, const TrustOptions& opts);

class LockService;

// What Redis says about one resource's lock right now (LockService::inspect).
// A snapshot taken by one script, so its fields agree with each other; it is
// stale the moment it returns.
struct LockInfo {
  std::string resource;
  std::string key;
  // Held: the lock key exists. The fields below describe its holder.
  bool held = false;
  // The holder's readable owner, token_owner(): "web-3/4121/invoice-run"
  // (host/pid/job) for jobguard tokens, the whole value for other clients'.
  std::string holder;
  // Time left before the key expires (-1 ms: the key has no TTL, which no
  // jobguard client ever writes).
  std::chrono::milliseconds ttl_left{0};
  // The fencing high-water mark of the resource (the last fence issued, by a
  // grant or a force release); nullopt when none was ever issued. It is the
  // current holder's fence only if that holder asked for one.
  std::optional<std::int64_t> fence;
  // Time since `fence` was issued, derived from it: fences are never below
  // the server clock in microseconds (acquire.lua), so a fence that reads as
  // a past server time is its grant time. nullopt when the fence does not
  // read as a time (a counter ahead of the clock) or there is none. It is
  // the holder's age only when the holder is fenced (docs/operations.md).
  std::optional<std::chrono::milliseconds> fence_age;
  // Waiters for the resource: fair-mode waiters in its queue and default-mode
  // waiters in its line (LLEN + ZCARD). A waiter woken by a release is out
  // of the line until its attempt answers, and a dead one's entry counts
  // until a release pops it.
  std::int64_t waiters = 0;
  // The server's clock at the snapshot (unix ms), for display.
  std::int64_t server_time_ms = 0;
};

// A held lock. Destroying a Lock that is still held releases it (without
// waiting for the reply): scope exit is release. Movable, not copyable.
// Threads: one owner at a time. release()/extend() block for Redis's reply;
// on the client's event-loop thread, where that reply could never arrive,
// they throw errc::invalid_argument at once instead (the lock stays held, so
// scope exit still releases it): use async_release()/async_extend() there,
// or the completion-token forms in <jobguard/async.hpp> (docs/async.md).
class Lock {
 public:
  Lock(Lock&&) noexcept;
  Lock& operator=(Lock&&) noexcept;
  ~Lock();

  const std::string& resource() const noexcept { return resource_; }
  const std::string& key() const noexcept { return key_; }
  const std::string& token() const noexcept { return token_; }
  // The fencing token issued with this grant, if LockOptions::fence.
  std::optional<std::int64_t> fence() const noexcept { return fence_; }
  std::chrono::milliseconds ttl() const noexcept { return ttl_; }
  std::chrono::steady_clock::time_point acquired_at() const noexcept { return acquired_at_; }
  bool held() const noexcept { return held_; }
  // The server's lock-state epoch at the grant; a lease is lost when the
  // server is found in another one (docs/lock-safety.md).
  const std::string& epoch() const noexcept { return epoch_; }
  // The replica confirmation its grant had and its renewals get.
  const ReplicaConfirmation& confirmation() const noexcept { return confirmation_; }
  // A permit of a counting semaphore (LockOptions::permits): the permit
  // count it was granted under (the stored one, if set), else 0.
  int permits() const noexcept { return permits_; }
  // A permit's slot in [0, permits()): no two live holders share one, so a
  // downstream that fences each slot as it would a mutex (accept a fence
  // only if not below the slot's last one) accepts at most permits() writers
  // at a time (docs/semaphore.md). -1 for a mutex.
  int permit_slot() const noexcept { return slot_; }
  // LockOptions::mode it was granted in: a reader or writer of a read-write
  // lock, or a mutex / semaphore permit (LockMode::mutex).
  LockMode mode() const noexcept { return mode_; }

  // Per-class metrics this lock reports to (never null for a granted lock),
  // in its service's registry (LockServiceOptions::metrics).
  observe::LockClassMetrics& metrics() const noexcept { return *metrics_; }
  // LockOptions::lock_class of the acquire.
  const std::string& lock_class() const noexcept { return lock_class_; }

  // Whether it was taken in fair mode (its release hands it to the queue head).
  bool fair() const noexcept { return fair_; }
  // The service that granted it; null for a moved-from Lock.
  LockService* service() const noexcept { return service_.get(); }

  // Compare-and-delete. True if the lock was still ours; false if it had
  // expired or been taken by someone else (nothing is deleted then), or was
  // released already. Throws Error naming the server and the key on a Redis
  // failure (the TTL frees the lock then).
  bool release();
  // Compare-and-pexpire to `ttl` (default: the acquire ttl). False if no longer ours.
  bool extend(std::chrono::milliseconds ttl = std::chrono::milliseconds(0));

  // The non-blocking forms, safe on the event-loop thread: `done` runs on
  // the event loop, never inside the call, with the answer the blocking form
  // returns (false, posted, when not held), or its Error (which names the
  // server and the key). The Lock must outlive the call only until it
  // returns (the operation keeps what it needs).
  using Handler = std::function<void(const Error&, bool)>;
  void async_release(Handler done);
  void async_extend(std::chrono::milliseconds ttl, Handler done);
  // Forget the lock without releasing it (it expires by its TTL). For a
  // process that forks and hands the lock to a child, or for tests.
  void detach() noexcept { held_ = false; }
  // Internal, for src/job: a script of the library's released the lock
  // (release.lua inside a guarded job's finish); `ours` is what its
  // compare-and-delete found. Counted as release() counts, then forgotten.
  void released_by_script(bool ours) noexcept;

 private:
  friend class LockService;
  friend class LeaseScheduler;  // a quorum lease's State holds an empty one
  Lock() = default;
  std::shared_ptr<LockService> service_;
  std::string resource_, key_, token_, lock_class_;
  std::optional<std::int64_t> fence_;
  observe::LockClassMetrics* metrics_ = nullptr;  // owned by the service's registry
  bool fair_ = false;
  std::chrono::milliseconds ttl_{0};
  std::chrono::steady_clock::time_point acquired_at_{};
  bool held_ = false;
  std::string epoch_;  // the server's lock-state epoch at the grant (quarantine.hpp)
  ReplicaConfirmation confirmation_;
  int permits_ = 0, slot_ = -1;
  LockMode mode_ = LockMode::mutex;
};

// What a LockService is made of besides its Client. Every member has a default.
struct LockServiceOptions {
  KeyBuilder keys{};
  QuarantineOptions quarantine{};
  // The monotonic clock waits, TTL starts (Lock::acquired_at) and quarantine
  // deadlines are read from; leases of this service's locks count on it too.
  // Default null = MonotonicClock::steady(). Not owned: it must outlive the
  // service and every Lock and Lease it grants.
  const MonotonicClock* clock = nullptr;
  // Where the per-class lock metrics go. Default null =
  // observe::Registry::global() (what `jobguard serve` exposes). Not owned:
  // it must outlive the service and every Lock it grants.
  observe::Registry* metrics = nullptr;
};

// Owns the scripts, the release subscriber and the waiters for one Client.
// Create with LockService::create (it is shared by the locks it grants).
// Threads: every member is safe from any thread; async completions run on the
// client's event loop.
class LockService : public std::enable_shared_from_this<LockService> {
 public:
  static std::shared_ptr<LockService> create(redis::Client& client, KeyBuilder keys = KeyBuilder(),
                                             QuarantineOptions quarantine = {});
  static std::shared_ptr<LockService> create(redis::Client& client, LockServiceOptions options);
  ~LockService();

  const KeyBuilder& keys() const noexcept { return keys_; }
  redis::Client& client() noexcept { return client_; }
  // The clock and registry it was given (or the defaults).
  const MonotonicClock& clock() const noexcept { return *clock_; }
  observe::Registry& metrics_registry() const noexcept { return *registry_; }

  // Acquires or gives up: returns nullopt when the lock stayed busy for the
  // whole wait. Throws Error on Redis failures (errc::timeout, not_connected,
  // server_busy for OOM/READONLY/LOADING..., with the server's text, its
  // host:port and the key) and on bad arguments. A try-once acquire (wait =
  // 0) on a client known to be down (redis::Client::down_error) fails at
  // once with not_connected rather than after the command timeout.
  // A server in quarantine is errc::server_busy ("server lost lock state
  // (...); grants refused for N ms more") unless the quarantine ends within
  // the wait: then the acquire waits it out.
  std::optional<Lock> acquire(std::string_view resource, const LockOptions& opts = {});

  // The asynchronous form; `done` runs on the event loop with an Error on a
  // Redis failure (source redis; its text has the server's own words, its
  // host:port and the lock key), or no error and nullopt when busy.
  using AcquireHandler = std::function<void(const Error&, std::optional<Lock>)>;
  void async_acquire(std::string resource, LockOptions opts, AcquireHandler done);

  // Raw compare-and-delete / compare-and-pexpire by key and token; `done`
  // gets true when the token still owned the key. An Error names the server
  // and the operation; the key is for the caller to add (Error::with_context)
  // so the success path carries no copy of it.
  // `fair`: the lock was taken in fair mode (its release hands it to the queue head).
  using ReleaseHandler = std::function<void(const Error&, bool)>;
  void async_release(const std::string& resource, const std::string& token, ReleaseHandler done,
                     bool fair = false);
  // With `confirm.replicas` > 0 the extension is confirmed (WAIT after it on
  // the same connection); fewer acknowledgements fail it with
  // errc::server_busy under Unconfirmed::fail_closed (the key was extended
  // on the primary, but a promoted replica may not have it), or warn.
  void async_extend(const std::string& resource, const std::string& token, std::chrono::milliseconds ttl,
                    ReleaseHandler done, ReplicaConfirmation confirm = {});
  // LockOptions' replica fields with the connection's defaults applied.
  ReplicaConfirmation confirmation_for(const LockOptions& opts) const;
  // Many compare-and-pexpires in one script call (the lease scheduler's
  // renewals due in one tick). `done` gets one bool per entry, in order, or
  // an Error for the whole batch. Unconfirmed (no WAIT), and every key must
  // be on one server: not for a Redis Cluster (the scheduler renews those,
  // and replica-confirmed leases, one by one).
  // Views: the strings must live until async_extend_many returns (the
  // request is encoded before it does). `key`: the lock's key when the caller
  // has it (Lock::key()); empty = built from `resource`.
  struct ExtendEntry {
    std::string_view resource;
    std::string_view token;
    std::chrono::milliseconds ttl{0};
    std::string_view key{};
  };
  using ExtendManyHandler = std::function<void(const Error&, std::vector<bool>)>;
  void async_extend_many(const std::vector<ExtendEntry>& entries, ExtendManyHandler done);

  // The last refusal by the server of the release subscriber's connection:
  // AUTH rejected, or SUBSCRIBE forbidden (NOPERM: an ACL user without
  // pub/sub rights). Waiters then fall back to polling with backoff. No error
  // when there was none. Also written to the client's on_warning sink.
  Error subscriber_error() const;

  // Who holds `resource`, for how much longer, its fence and its fair queue:
  // one read-only script (EVALSHA), no effect on the lock. Throws Error on
  // Redis failures and on a malformed resource; a free resource is a result
  // (held = false). Blocking: not from the client's event-loop thread.
  LockInfo inspect(std::string_view resource);
  // The asynchronous form; `done` runs on the event loop, with no error or
  // the inspect's Error (the server's words, its address, the lock key).
  void async_inspect(std::string resource, std::function<void(const Error&, LockInfo)> done);

  struct Impl;
  // Internal, for src/lock: building a Lock value.
  Lock make_lock(std::string resource, std::string key, std::string token,
                 std::optional<std::int64_t> fence, const LockOptions& opts,
                 std::chrono::steady_clock::time_point sent_at, std::string epoch = {}, int permits = 0,
                 int slot = -1);
  // Internal, for src/lock: release / extend what a granted Lock holds, a
  // mutex or a semaphore permit alike (Lock, Lease).
  void async_release_held(const Lock& lock, ReleaseHandler done);
  void async_extend_held(const Lock& lock, std::chrono::milliseconds ttl, ReleaseHandler done);
  // Internal, for src/lock: the lock-state gate (lock/quarantine.hpp).
  const std::shared_ptr<void>& gate() const noexcept { return gate_; }
  std::chrono::milliseconds max_ttl() const noexcept { return max_ttl_; }
  // The checks every acquire makes of its options before it sends anything:
  // throws Error(invalid_argument) naming what is wrong (a TTL below 10 ms or
  // above max_ttl(), a negative wait). For callers that take options once and
  // acquire with them many times (job::GuardedRunner): refused when given.
  void check_options(const LockOptions& opts) const;
  // Internal, for src/lock: a class's metrics in this service's registry.
  // The client's event-loop thread only (it remembers the last class).
  observe::LockClassMetrics& class_metrics(const std::string& lock_class) const;

 private:
  LockService(redis::Client& client, LockServiceOptions options);
  redis::Client& client_;
  const MonotonicClock* clock_;
  observe::Registry* registry_;
  KeyBuilder keys_;
  std::chrono::milliseconds max_ttl_;
  std::shared_ptr<void> gate_;  // a detail::StateGate
  std::shared_ptr<Impl> impl_;
};

}  // namespace jobguard
