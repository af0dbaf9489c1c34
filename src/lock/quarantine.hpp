// The gate in front of every grant: has the server this process talks to kept
// its lock state? See docs/lock-safety.md, "Quarantine after lost lock state".
//
// The server is checked (scripts/epoch.lua: run_id, evictions, the lock-state
// record) before the first grant, again every `recheck`, and after every
// reconnect; a grant is delivered only if no reconnect happened between the
// check and the grant's reply, so the grant came from the server that was
// checked (a TCP connection does not survive a restart or a failover).
//
// Threads: every member runs on the client's event-loop thread only. Owned by
// a LockService (shared); a check in flight keeps it alive.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "jobguard/clock.hpp"
#include "jobguard/redis/client.hpp"
#include "lock/clock_watch.hpp"

namespace jobguard::detail {

// The record every client of a server reads and writes (a hash, no TTL).
inline constexpr const char* kLockStateKey = "jobguard:epoch";

class StateGate : public std::enable_shared_from_this<StateGate> {
 public:
  // On a Redis Cluster each primary keeps a record of its own (a loss on one
  // shard is invisible in another's), checked together: one shard's entry.
  struct ShardCheck {
    redis::PrimaryShard node;
    std::string epoch;    // its record's epoch id
    std::string evicted;  // as Ticket::evicted, for this shard
  };
  struct Ticket {
    std::uint64_t mark = 0;  // the client's connect count the check ran under (mark())
    std::uint64_t clock_gen = 0;  // server clock steps found before the check (clock_sample)
    // The record's epoch id then; on a cluster every shard's, "address=id"
    // joined by spaces (any shard's change changes it).
    std::string epoch;
    std::string evicted;             // acquire.lua's eviction baseline on an evicting server, else ""
    // evicted_keys at the check on one server, evicting or not ("" on a
    // cluster): a script grant compares it too, so a server that starts
    // evicting between two checks (CONFIG SET maxmemory) refuses the grant.
    std::string evicted_count;
    // What a script grant of `key` compares evicted_keys with: evicted_for,
    // else evicted_count.
    const std::string& script_evicted_for(std::string_view key) const;
    std::vector<ShardCheck> shards;  // a cluster's shards as checked; empty on one server
    // The epoch a grant of `key` is made in: its shard's on a cluster ("" for
    // a slot no checked shard served), else `epoch`.
    const std::string& epoch_for(std::string_view key) const;
    const std::string& evicted_for(std::string_view key) const;
    const ShardCheck* shard_for(std::string_view key) const;  // null: no checked shard serves its slot
  };
  using TicketPtr = std::shared_ptr<const Ticket>;
  // ec clear: the grant may be asked for under `t`. ec set: refused; `detail`
  // is one line, `retry_in` > 0 when a quarantine ends in that long or a
  // failover under way may be over by then (a waiter asks again then).
  using Admit = std::function<void(std::error_code ec, const std::string& detail, std::chrono::milliseconds retry_in,
                                   TicketPtr t)>;
  // A new epoch was found: every lease granted under another one is lost.
  using Listener = std::function<void(const std::string& epoch, const std::string& reason)>;

  // `clock` (the service's) must outlive the gate. `clock_probe`: how often
  // the server's TIME is read while the gate is in use (0 = only the checks'
  // and grants' own readings).
  StateGate(redis::Client& client, std::chrono::milliseconds max_ttl, std::chrono::milliseconds recheck,
            const MonotonicClock& clock = MonotonicClock::steady(),
            std::chrono::milliseconds clock_probe = std::chrono::milliseconds(200));

  void admit(Admit cb);
  // admit()'s common case without a callback: the ticket to grant under
  // now, or null when the caller must go through admit().
  TicketPtr ready();
  // True while no reconnect happened since `t`'s check: a reply received
  // now came from the server that was checked.
  bool current(const Ticket& t) const;
  // Check again before the next grant (acquire.lua saw an eviction, a lease
  // renewal came back on a new connection).
  void invalidate();
  // The epoch of the last check ("" before the first); on a cluster every
  // shard's (Ticket::epoch), so a change of it is news for some lease.
  const std::string& epoch() const noexcept { return last_epoch_; }
  // The last check's epoch for `key`'s shard (Ticket::epoch_for): what a
  // lease on `key` compares its grant's epoch with.
  const std::string& epoch_for(std::string_view key) const;
  // True when the last check ran on the connection in use now.
  bool checked_current() const { return ticket_ && ticket_->mark == mark(); }
  // The same for a reply about `key`: on a cluster also when the last check
  // failed on other shards but found `key`'s shard intact, on connections
  // still in use (a node that stays CLUSTERDOWN after a restart must not
  // stall the renewals of leases on the shards that are fine).
  bool checked_current(std::string_view key) const;
  // Starts a check unless one is running or the last one is current.
  void recheck();
  // `owner` dies -> the listener is dropped.
  void listen(std::weak_ptr<void> owner, Listener l);
  std::chrono::milliseconds max_ttl() const noexcept { return max_ttl_; }
  std::uint64_t mark() const;
  // From the last check: the server's version ("7.0.15"; "" before the
  // first) and whether replica confirmations use WAITAOF there (Redis 7.2+
  // with appendonly yes, unless the URL says waitaof=no) rather than WAIT.
  const std::string& server_version() const noexcept { return server_version_; }
  bool aof_enabled() const noexcept { return aof_enabled_; }
  bool waitaof() const noexcept;

  // Server clock steps (lock/clock_watch.hpp). True when a grant's reply can
  // carry the server's clock: one server. Then acquire.lua asks for the
  // server's time. On a cluster every primary's clock is watched on its own
  // (a node's clock is not its neighbour's) from the checks and the probe,
  // which reads every primary's TIME every `clock_probe` while in use.
  bool watches_clock() const noexcept;
  // A reading of the server's TIME (µs) taken between `sent` and `received`
  // (the steady clock, never the service's injectable one: a test's frozen
  // clock is not a server's step). True when it shows a forward step: the
  // server is quarantined like one that lost its state, every lease granted
  // before is lost now, and no ticket issued before is current().
  bool clock_sample(std::int64_t server_us, std::chrono::steady_clock::time_point sent,
                    std::chrono::steady_clock::time_point received);
  // Something holds or wants a lock: keep reading the server's clock for
  // max_ttl more.
  void touch();
  std::uint64_t clock_steps() const noexcept { return clock_steps_; }

 private:
  struct Checked;  // one server's reply to epoch.lua
  void check();
  void check_cluster(std::uint64_t sent_mark);
  void on_checked(std::uint64_t sent_mark, std::chrono::steady_clock::time_point sent, bool stepping,
                  std::error_code ec, redis::Reply r);
  // `stepping`: the primary whose record this check writes a step to ("").
  void on_cluster_checked(std::uint64_t sent_mark, std::chrono::steady_clock::time_point sent,
                          const std::string& stepping, std::vector<ShardCheck> shards,
                          std::vector<std::pair<std::error_code, redis::Reply>> replies);
  // The check's answer, taken (both deployments): a new ticket, its epoch,
  // and a quarantine when `left` > 0.
  void apply(std::shared_ptr<Ticket> t, std::chrono::milliseconds left, std::string reason);
  bool retry_after_flap(std::uint64_t sent_mark);
  // The last good check's epoch of the shard `node` served then ("" if none).
  const std::string& last_epoch_for(const redis::PrimaryShard& node) const;
  void settle(std::error_code ec, const std::string& detail, std::chrono::milliseconds retry_in);
  std::string refusal(std::chrono::milliseconds left) const;  // quarantine_message for this server
  // `node`: the cluster primary whose clock stepped ("" on one server).
  void clock_stepped(std::chrono::microseconds step, const std::string& node = {});
  // A cluster primary's TIME, read between `sent` and `received`.
  bool node_clock_sample(const std::string& node, std::int64_t server_us, std::chrono::steady_clock::time_point sent,
                         std::chrono::steady_clock::time_point received);
  void probe_cluster();
  // A watch's verdict acted on: a forward step quarantines, a backward one
  // is told.
  bool judge(std::chrono::microseconds step, const std::string& node);
  void arm_probe();
  void probe();
  void warn(const std::string& line) const;

  redis::Client& client_;
  const MonotonicClock& clock_;
  const std::chrono::milliseconds max_ttl_, recheck_;
  TicketPtr ticket_;  // the last good check; null before it or after invalidate()
  std::chrono::steady_clock::time_point checked_at_{}, quarantine_until_{};
  std::string reason_;
  std::string last_epoch_;  // survives invalidate(): a changed id is news
  TicketPtr last_;          // the last good check, kept across invalidate() (epoch_for)
  // A cluster check that failed on some shards: the others as found (a
  // failed shard's epoch ""). For checked_current(key) only, never a grant.
  TicketPtr partial_;
  std::string server_version_;
  bool aof_enabled_ = false;
  bool checking_ = false;
  int retries_ = 0;
  std::vector<Admit> waiting_;
  std::vector<std::pair<std::weak_ptr<void>, Listener>> listeners_;
  // The clock-step watch: its samples are from one connection generation
  // (a reconnect may reach another server, with a clock of its own).
  ClockWatch watch_;
  std::uint64_t watch_mark_ = 0;
  std::uint64_t clock_gen_ = 0, clock_steps_ = 0;
  std::int64_t pending_step_ms_ = 0;  // found, not yet written to the record
  std::string pending_step_node_;     // on a cluster: the primary whose record it goes to
  // A cluster's primaries' watches, by address (clock_probe.cpp says why a
  // new connection does not start a node's watch again).
  std::map<std::string, ClockWatch> node_watch_;
  const std::chrono::milliseconds clock_probe_;
  std::chrono::steady_clock::time_point touched_{};
  bool probing_ = false;
};

// The lock-state record of one cluster shard: "jobguard:epoch:{<n>}" for the
// smallest n whose slot `shard` serves (every client picks the same key).
// Empty when it serves no slot.
std::string lock_state_key_for(const redis::PrimaryShard& shard);

// "7.2.4" >= 7.2; false for anything that does not start with "<n>.<n>".
bool version_at_least(std::string_view version, int major, int minor);

// epoch.lua's reason for a server without a record (a new server, or one
// restarted empty: the two look the same).
inline constexpr std::string_view kNoRecordReason = "no lock-state record";

// The message a refused grant carries. With `url`, a quarantine whose only
// reason is a missing record also names the way forward: `jobguard server
// trust --redis URL` for a server just provisioned, else how long to wait.
std::string quarantine_message(const std::string& reason, std::chrono::milliseconds left,
                               const std::string& url = {});
// True when `reason` (a cluster's: "address: reason" joined by "; ") says
// only that records were missing.
bool only_missing_records(std::string_view reason);

}  // namespace jobguard::detail
