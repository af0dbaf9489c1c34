// The two backends of the guard stores, for typed tests: the same test body
// runs against PostgreSQL and against Redis. Both servers are real processes,
// one of each per test binary (keys/tables are named per test).
#pragma once

#include <memory>

#include "jobguard/testing/embedded_redis.hpp"
#include "jobguard/guard/completion.hpp"
#include "jobguard/guard/idempotency.hpp"
#include "jobguard/redis/client.hpp"
#include "support/postgres_fixture.hpp"

namespace jobguard::test {

inline EmbeddedRedis& shared_redis() {
  static std::unique_ptr<EmbeddedRedis> server = [] {
    auto s = std::make_unique<EmbeddedRedis>();
    s->start();
    return s;
  }();
  return *server;
}

inline std::unique_ptr<redis::Client> make_redis_client() {
  redis::ConnectionOptions o;
  o.host = shared_redis().host();
  o.port = shared_redis().port();
  o.connect_timeout = std::chrono::milliseconds(1000);
  o.command_timeout = std::chrono::milliseconds(2000);
  auto c = std::make_unique<redis::Client>(o);
  if (!c->wait_connected(std::chrono::seconds(5))) throw std::runtime_error("redis client never connected");
  return c;
}

// A store plus the client it borrows (declared first: destroyed last).
template <class Store>
struct Handle {
  std::unique_ptr<redis::Client> client;
  std::unique_ptr<Store> store;
  Store* operator->() const { return store.get(); }
  Store& operator*() const { return *store; }
};

struct PgBackend {
  static constexpr const char* kName = "postgres";
  static guard::PgOptions pg() {
    guard::PgOptions o;
    o.url = shared_postgres().url();
    o.connect_timeout = std::chrono::seconds(3);
    return o;
  }
  static Handle<guard::IdempotencyStore> idempotency(guard::IdempotencyOptions o = {}) {
    return {nullptr, std::make_unique<guard::PgIdempotencyStore>(pg(), o)};
  }
  static Handle<guard::CompletionStore> completion() {
    return {nullptr, std::make_unique<guard::PgCompletionStore>(pg())};
  }
};

struct RedisBackend {
  static constexpr const char* kName = "redis";
  static Handle<guard::IdempotencyStore> idempotency(guard::IdempotencyOptions o = {}) {
    Handle<guard::IdempotencyStore> h;
    h.client = make_redis_client();
    h.store = std::make_unique<guard::RedisIdempotencyStore>(*h.client, o);
    return h;
  }
  static Handle<guard::CompletionStore> completion(guard::RedisCompletionOptions o = {}) {
    Handle<guard::CompletionStore> h;
    h.client = make_redis_client();
    h.store = std::make_unique<guard::RedisCompletionStore>(*h.client, o);
    return h;
  }
};

struct BackendNames {
  template <class T>
  static std::string GetName(int) {
    return T::kName;
  }
};

}  // namespace jobguard::test
