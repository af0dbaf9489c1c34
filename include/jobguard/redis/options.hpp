// Where and how to connect. Parsed from redis:// and rediss:// URLs or filled
// in by hand. Every duration says its default and what zero means.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace jobguard::redis {

struct TlsOptions {
  bool enabled = false;       // rediss:// sets it
  std::string ca_file;        // PEM bundle; empty = the system default paths
  std::string server_name;    // SNI and the name verified; empty = the URL host
  bool verify_peer = true;    // false only for tests against self-signed servers
  std::string cert_file;      // client certificate (mutual TLS), optional
  std::string key_file;
};

struct ConnectionOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 6379;
  std::string user;           // ACL user; empty = the default user
  std::string password;       // empty = no AUTH
  int db = 0;                 // SELECT db after connecting when non-zero
  TlsOptions tls;
  std::string client_name;    // CLIENT SETNAME, so `CLIENT LIST` shows who we are

  // Number of multiplexed connections shared by every caller. Default 1; the
  // event loop is the bottleneck long before one socket is (docs/bench.md:
  // one and two connections within a few % at 64 callers). Commands a caller
  // issues without waiting keep their order only on one connection.
  int connections = 1;
  // Connect (TCP + TLS + AUTH/SELECT) deadline. Default 2 s; must be > 0.
  std::chrono::milliseconds connect_timeout{2000};
  // Deadline for a call that does not give its own. Default 2 s; must be > 0:
  // every network call in jobguard has a deadline.
  std::chrono::milliseconds command_timeout{2000};
  // Reconnect backoff: full jitter between 0 and min(max, min * 2^attempt).
  std::chrono::milliseconds reconnect_min{25};
  std::chrono::milliseconds reconnect_max{1000};
};

// Parses `redis://[user[:password]@]host[:port][/db][?opt=val&...]` and
// `rediss://...` (TLS). Query options: `timeout`, `connect_timeout` (durations),
// `connections`, `ca` (CA file), `sni`, `verify` (yes/no), `cert`, `key`,
// `name`. IPv6 hosts go in brackets. The userinfo runs to the last '@', so a
// password may hold raw '/', '?', ':' or '@' (an '@' in a query value must be
// written %40). Throws Error(errc::invalid_url) naming the bad part, e.g.
// `invalid URL: port 99999 out of range (1..65535) in "redis://h:99999"`; the
// URL in the message has its password masked (redact_url) and no password
// fragment is ever quoted.
ConnectionOptions parse_url(std::string_view url);

// `url` with `password` put into it (percent-encoded), for a password that
// comes from a file or the environment rather than the command line. Throws
// Error(errc::invalid_url) when `url` does not parse or already carries a
// password (two sources: which one is meant?).
std::string with_password(std::string_view url, std::string_view password);

// The URL back, password masked: for logs and `jobguard doctor`.
std::string to_display_url(const ConnectionOptions& o);

}  // namespace jobguard::redis
