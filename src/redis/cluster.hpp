// The pure parts of the Redis Cluster client: key slots (CRC16 with hash
// tags), the routing key of an encoded command, redirect replies (MOVED,
// ASK) and the slot map from CLUSTER SLOTS. No sockets: unit-tested.
// Private to src/redis.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jobguard/redis/reply.hpp"

namespace jobguard::redis::detail {

inline constexpr std::uint16_t kClusterSlots = 16384;

// CRC16-CCITT (XMODEM) of `data`: the hash Redis Cluster slots use.
std::uint16_t crc16(std::string_view data) noexcept;
// The slot of `key`: of its hash tag (the part between the first '{' and
// the next '}', when not empty), else of the whole key.
std::uint16_t key_slot(std::string_view key) noexcept;

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

}  // namespace jobguard::redis::detail
