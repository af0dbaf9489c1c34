// The pure parts of the Redis Cluster client: key slots (CRC16 with hash
// tags), the routing key of an encoded command, redirect replies (MOVED,
// ASK) and the slot map from CLUSTER SLOTS. No sockets: unit-tested.
// Private to src/redis.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "jobguard/redis/reply.hpp"

namespace jobguard::redis {
std::uint16_t key_slot(std::string_view key) noexcept;
}  // namespace jobguard::redis

namespace jobguard::redis::detail {

inline constexpr std::uint16_t kClusterSlots = 16384;

// CRC16-CCITT (XMODEM) of `data`: the hash Redis Cluster slots use.
std::uint16_t crc16(std::string_view data) noexcept;
// The slot of `key`: of its hash tag (the part between the first '{' and
// the next '}', when not empty), else of the whole key. Public as
// jobguard::redis::key_slot (client.hpp); the same function here.
using ::jobguard::redis::key_slot;

// The key a command is routed by, from its RESP encoding (an array of bulk
// strings, as Command builds it): EVAL/EVALSHA's first key (none with
// numkeys 0), none for commands without keys (PING, INFO, WAIT, CLUSTER,
// SCRIPT...), else the first argument. nullopt = any node.
std::optional<std::string_view> routing_key(std::string_view payload);

struct Redirect {
  enum class Kind { moved, ask };
  Kind kind = Kind::moved;
  std::uint16_t slot = 0;
  std::string host;
  std::uint16_t port = 0;
};
// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381" (an IPv6 host may
// hold ':'; the port is after the last one). nullopt for anything else.
std::optional<Redirect> parse_redirect(std::string_view error_text);

struct SlotRange {
  std::uint16_t first = 0, last = 0;
  std::string host;
  std::uint16_t port = 0;  // the range's primary
};
// CLUSTER SLOTS: [[first, last, [host, port, id...], replicas...], ...].
// Empty on a reply of another shape. An empty host means "the node that
// answered" (`seed_host`).
std::vector<SlotRange> parse_cluster_slots(const Reply& r, const std::string& seed_host);

// CLUSTER SHARDS (Redis 7.0+): [["slots", [first, last, ...], "nodes",
// [[field, value, ...], ...]], ...]; each shard's ranges go to the node whose
// role is "master", at its "endpoint" (else "ip"; empty or "?" = `seed_host`)
// and its "port", or "tls-port" when `tls`. A shard without slots (a
// primary being added) is skipped. Empty on a reply of another shape.
std::vector<SlotRange> parse_cluster_shards(const Reply& r, const std::string& seed_host, bool tls);

// The slot map's source: CLUSTER SHARDS where the server has it, else CLUSTER
// SLOTS (deprecated since 7.0, the only one before). One per asker: the first
// answer that is an error or an unknown shape turns SHARDS off for good.
struct SlotMapSource {
  bool shards = true;
  std::vector<std::string> command() const;
  // The map in a call's outcome, or empty: then `retry_with_slots()` says
  // whether to ask again at once (SHARDS was just turned off: the server
  // refused it, server_error, or its reply had a shape we do not know). A
  // timeout, a lost connection or CLUSTERDOWN change nothing.
  std::vector<SlotRange> parse(std::error_code ec, const Reply& r, const std::string& seed_host, bool tls);
  bool retry_with_slots() const noexcept { return fell_back_; }

 private:
  bool fell_back_ = false;
};

}  // namespace jobguard::redis::detail
