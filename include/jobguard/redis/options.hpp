// Where and how to connect. Parsed from redis:// and rediss:// URLs or filled
// in by hand. Every duration says its default and what zero means.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace jobguard::redis {

struct TlsOptions {
  bool enabled = false;       // rediss:// sets it
  std::string ca_file{};      // PEM bundle; empty = the system default paths
  std::string server_name{};  // SNI and the name verified; empty = the URL host
  bool verify_peer = true;    // false only for tests against self-signed servers
  std::string cert_file{};    // client certificate (mutual TLS), optional
  std::string key_file{};
};

// A primary found through Redis Sentinel (`redis+sentinel://` URLs). Empty
// `sentinels` = connect to host:port directly.
struct SentinelOptions {
  struct Address {
    std::string host;
    std::uint16_t port = 26379;
    bool operator==(const Address&) const = default;
  };
  // Where to ask first; the sentinels these know of (`SENTINEL sentinels`)
  // are asked too when these do not answer.
  std::vector<Address> sentinels{};
  std::string master_name{};
  // AUTH for the sentinels themselves (URL option `sentinel_password`);
  // user/password above are the data nodes'.
  std::string password{};
  // How often a ready connection asks a sentinel whether the primary moved
  // (URL option `sentinel_check`). A failover does not close the old
  // primary's connections until the sentinels demote it, seconds later;
  // until this check notices, calls still go to it. Default 1 s; 0 = only
  // after an error (not recommended).
  std::chrono::milliseconds check_interval{1000};
  // TLS to the sentinels themselves, with the data nodes' TLS settings (CA,
  // client certificate, verify; the SNI and the name checked are the
  // sentinel's host unless `sni` names one). Set by the scheme
  // rediss+sentinel:// (TLS to both), or the URL option `sentinel_tls` alone
  // (sentinels and data nodes often differ: TLS only in front of one).
  bool tls = false;
};

inline constexpr std::chrono::microseconds kMaxBusyPoll{1000000};

struct ConnectionOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 6379;
  std::string user{};         // ACL user; empty = the default user
  std::string password{};     // empty = no AUTH
  int db = 0;                 // SELECT db after connecting when non-zero
  TlsOptions tls{};
  // With sentinels set, every (re)connect asks a sentinel for the primary
  // of `master_name` (`SENTINEL get-master-addr-by-name`) instead of using
  // host:port, and checks `ROLE` on the connection before any call is sent:
  // a server that is not (or no longer) a primary is left and the sentinels
  // asked again (docs/redis-client.md, "Sentinel").
  SentinelOptions sentinel{};
  // Redis Cluster (URL option `cluster=yes`): host:port is a seed; the slot
  // map comes from CLUSTER SLOTS, each command goes to its key's primary,
  // MOVED/ASK are followed and TRYAGAIN/CLUSTERDOWN retried within the
  // call's deadline (docs/redis-client.md, "Cluster").
  bool cluster = false;
  std::string client_name{};  // CLIENT SETNAME, so `CLIENT LIST` shows who we are
  // The longest lock TTL any client of this server uses (URL option `max_ttl`).
  // A LockService on this connection refuses longer TTLs, and after finding
  // that the server lost lock state refuses grants for this long
  // (docs/lock-safety.md, "Quarantine after lost lock state"). Default 60 s.
  std::chrono::milliseconds lock_max_ttl{60000};
  // Replica-confirmed grants (URL options `replicas`, `replicas_timeout`,
  // `waitaof`; docs/lock-safety.md, "Replica-confirmed grants"). A lock's
  // grant, renewal and fence advance is followed, on the same connection, by
  // `WAIT lock_replicas lock_replicas_timeout`, and the holder is told it
  // holds the lock only when that many replicas acknowledged it. Default 0 =
  // off; LockOptions::replicas overrides it per lock. WAIT blocks the
  // connection it runs on for up to the timeout when a replica lags, so
  // every caller multiplexed on it waits too: keep the timeout short.
  int lock_replicas = 0;
  std::chrono::milliseconds lock_replicas_timeout{500};
  // Use `WAITAOF 1 N timeout` instead of WAIT where the server has it
  // (Redis 7.2+, detected by the lock-state check) and runs with
  // appendonly yes: the grant is then on disk on the primary and on N
  // replicas, not only in their memory. Default on; `waitaof=no` keeps WAIT.
  bool lock_waitaof = true;

  // Number of multiplexed connections shared by every caller. Default 1; the
  // event loop is the bottleneck long before one socket is (docs/bench.md:
  // one and two connections within a few % at 64 callers). Commands a caller
  // issues without waiting keep their order only on one connection.
  int connections = 1;
  // Busy polling (URL option `busy_poll`, e.g. `100us`): after anything
  // happened, the client's own I/O thread keeps polling its sockets for this
  // long before it sleeps, so a reply that arrives meanwhile is read without
  // the wake-up of a sleeping thread. It trades CPU for round-trip time: a
  // client that makes calls back to back keeps a core busy; one with nothing
  // in flight sleeps once the window has passed. Default 0 = off; at most
  // kMaxBusyPoll. A Client on the caller's io_context ignores it (the caller
  // runs that loop).
  std::chrono::microseconds busy_poll{0};
  // Connect (TCP + TLS + AUTH/SELECT) deadline. Default 2 s; must be > 0.
  std::chrono::milliseconds connect_timeout{2000};
  // Deadline for a call that does not give its own. Default 2 s; must be > 0:
  // every network call in jobguard has a deadline.
  std::chrono::milliseconds command_timeout{2000};
  // Reconnect backoff: full jitter between 0 and min(max, min * 2^attempt).
  std::chrono::milliseconds reconnect_min{25};
  std::chrono::milliseconds reconnect_max{1000};

  // --- limits on what a server may send (docs/redis-client.md) ---------------
  // Checked on the raw bytes as they arrive, before anything is buffered or
  // allocated for a reply: a reply over a limit is a protocol error on its
  // connection (every call in flight on it fails with errc::protocol_error
  // naming the limit; the connection is dropped and re-established).
  // Elements a reply may declare, counted over all its nested arrays.
  // Default 1 Mi: jobguard's own replies hold a handful, XREADGROUP a batch;
  // a million covers KEYS/SCAN on large databases while capping what one
  // reply can make us allocate (~80 MB of Reply values). Must be > 0.
  std::size_t max_reply_elements = std::size_t{1} << 20;
  // Bytes of one bulk string, status or error line. Default 64 MiB (Redis'
  // own maximum is 512 MiB; jobguard stores tokens and job payloads). hiredis
  // buffers a bulk string whole before handing it over, so this is also the
  // most one reply can make us buffer. Must be > 0.
  std::size_t max_bulk_bytes = std::size_t{64} << 20;
  // Nesting depth of arrays (1 = a flat array). Default 7, which is also the
  // most the hiredis 0.14 reader supports; values above 7 are refused.
  int max_reply_depth = 7;

  // --- liveness ---------------------------------------------------------------
  // TCP keepalive on every connection, so a peer that vanished (host power
  // loss, a NAT that dropped the flow) is noticed by the kernel even while
  // no call is in flight. Default on: probes after 15 s idle, every 5 s, 3
  // unanswered probes close the connection (~30 s). Zero durations keep the
  // system defaults.
  bool keepalive = true;
  std::chrono::seconds keepalive_idle{15};
  std::chrono::seconds keepalive_interval{5};
  int keepalive_probes = 3;
  // A ready connection on which calls reached their deadline this many times
  // in a row, with no reply in between, is closed and replaced (logged as a
  // warning): a frozen link would otherwise time every call out forever,
  // since TCP may not notice for many minutes. Calls that expire together
  // (one deadline sweep, e.g. a pipelined burst behind a server stalled for a
  // moment) count as one timeout; any reply, a late one included, resets the
  // count. Default 3; 0 = never recycle.
  int recycle_after_timeouts = 3;
  // A subscribed connection sends nothing of its own once its SUBSCRIBEs are
  // confirmed, so no call of it can time out and the rule above never sees
  // a frozen link; keepalive does not either when something on the path
  // still answers for the peer (a proxy, a relay). The subscriber therefore
  // PINGs (allowed in subscribed mode) at this interval while connected; a
  // PING unanswered by its deadline counts as a timeout. A frozen subscriber
  // link is replaced after about recycle_after_timeouts × this interval, and
  // its subscriptions restored (waiters are told of the reconnect: they may
  // have missed a release). Default 5 s; 0 = never ping.
  std::chrono::milliseconds subscriber_ping_interval{5000};
  // Where the client reports what an operator should see (a recycled
  // connection, a reply over a limit): one line, no newline, called on the
  // event loop. Empty = written to stderr.
  std::function<void(const std::string&)> on_warning{};
};

// Parses `redis://[user[:password]@]host[:port][/db][?opt=val&...]` and
// `rediss://...` (TLS). Query options: `timeout`, `connect_timeout` (durations),
// `connections`, `ca` (CA file), `sni`, `verify` (yes/no), `cert`, `key`,
// `name`, `max_ttl` (a duration, lock_max_ttl), `replicas` (0..64),
// `replicas_timeout` (a duration), `waitaof` (yes/no), `cluster` (yes/no),
// `busy_poll` (a duration, 0us..1s). IPv6 hosts go in brackets. The userinfo runs to the last '@', so a
// password may hold raw '/', '?', ':' or '@' (an '@' in a query value must be
// written %40). Throws Error(errc::invalid_url) naming the bad part, e.g.
// `invalid URL: port 99999 out of range (1..65535) in "redis://h:99999"`; the
// URL in the message has its password masked (redact_url) and no password
// fragment is ever quoted.
//
// `redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/master-name[/db][?...]`
// names sentinels (port 26379 by default) and the master they monitor;
// `sentinel_password` is the sentinels' own password, `sentinel_check` (a
// duration) how often a ready connection asks whether the primary moved.
ConnectionOptions parse_url(std::string_view url);

// `url` with `password` put into it (percent-encoded), for a password that
// comes from a file or the environment rather than the command line. Throws
// Error(errc::invalid_url) when `url` does not parse or already carries a
// password (two sources: which one is meant?).
std::string with_password(std::string_view url, std::string_view password);

// The URL back, password masked: for logs and `jobguard doctor`.
std::string to_display_url(const ConnectionOptions& o);

}  // namespace jobguard::redis
