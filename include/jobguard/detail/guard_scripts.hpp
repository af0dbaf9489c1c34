// guard's Lua sources (src/guard/scripts/*.lua, embedded at build time), as
// pieces a script of a part above guard is composed from (the guarded
// runner's one-call claim and finish), so the formats of the idempotency key
// and the completion record are written once. Shared by the library's parts
// (include/jobguard/detail/, not installed), not an application API.
#pragma once

#include <string>
#include <string_view>

#include "jobguard/redis/script.hpp"

namespace jobguard::redis {
class Client;
}
namespace jobguard::guard {
class RedisCompletionStore;
class RedisIdempotencyStore;
}  // namespace jobguard::guard

namespace jobguard::guard::scripts {
// What a Redis store lends a script composed above guard that reads and
// writes its records (completion_record) or keys (idempotency_*) in the same
// call as its own work: the client its keys live on (the composed call must
// go there, or it would touch another server's keys) and the arguments the
// pieces' writes take, as those pieces take them. A store that offers none
// (PostgreSQL, an application's own) is reached one call at a time.
struct RecordPiece {
  redis::Client* client = nullptr;
  const RedisCompletionStore* store = nullptr;  // key_for(kind, entity, run_id)
  std::string retention_ms;                     // completion_record's retention argument
};
struct KeyPiece {
  redis::Client* client = nullptr;
  // key_for(key); async_abandon of a key the composed claim wrote and its grant handed back
  RedisIdempotencyStore* store = nullptr;
  std::string retention_ms;  // idempotency_begin / _complete's retention argument; never "0"
};

extern const std::string_view stored;
extern const std::string_view completion_record;
extern const std::string_view idempotency_begin;
extern const std::string_view idempotency_complete;
extern const std::string_view idempotency_abandon;

// `body` after stored.lua, the one reader and writer of the idempotency key's
// and the completion record's format: every script that touches either is
// built so (a composed script once, before its functions).
inline std::string with_stored_format(std::string_view body) { return std::string(stored) + std::string(body); }
}  // namespace jobguard::guard::scripts
