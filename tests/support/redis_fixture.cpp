#include "support/redis_fixture.hpp"

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <thread>

#include "jobguard/lock.hpp"

namespace jobguard::test {

void RedisTest::SetUp() {
  server = std::make_unique<EmbeddedRedis>();
  server->start();
  if (trust_new_server_) trust_server();
}

void RedisTest::trust_server() const {
  redis::Client c(options());
  jobguard::trust_new_server(c);
}

void RedisTest::TearDown() { server.reset(); }

redis::ConnectionOptions RedisTest::options() const {
  redis::ConnectionOptions o;
  o.host = server->host();
  o.port = server->port();
  o.command_timeout = std::chrono::milliseconds(2000);
  o.connect_timeout = std::chrono::milliseconds(1000);
  return o;
}

std::unique_ptr<redis::Client> RedisTest::make_client() const {
  auto c = std::make_unique<redis::Client>(options());
  EXPECT_TRUE(c->wait_connected(std::chrono::seconds(5))) << "client never connected";
  return c;
}

std::string RedisTest::key(const std::string& suffix) const {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return fmt::format("t:{}.{}:{}", info->test_suite_name(), info->name(), suffix);
}

std::string redis_command_at(const std::string& host, std::uint16_t port, const std::string& command) {
  timeval tv{2, 0};
  redisContext* c = redisConnectWithTimeout(host.c_str(), port, tv);
  if (c == nullptr || c->err) {
    std::string err = c ? c->errstr : "alloc";
    if (c) redisFree(c);
    throw std::runtime_error(fmt::format("connect to {}:{}: {}", host, port, err));
  }
  redisSetTimeout(c, tv);
  auto* r = static_cast<redisReply*>(redisCommand(c, command.c_str()));
  std::string out;
  if (r == nullptr) out = std::string("(io error) ") + c->errstr;
  else if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_ERROR)
    out.assign(r->str, r->len);
  else if (r->type == REDIS_REPLY_INTEGER) out = std::to_string(r->integer);
  else if (r->type == REDIS_REPLY_NIL) out = "(nil)";
  else if (r->type == REDIS_REPLY_ARRAY) out = fmt::format("(array of {})", r->elements);
  if (r) freeReplyObject(r);
  redisFree(c);
  return out;
}

RedisMonitor::RedisMonitor(const std::string& host, std::uint16_t port) {
  timeval tv{2, 0};
  redisContext* c = redisConnectWithTimeout(host.c_str(), port, tv);
  if (c == nullptr || c->err) {
    std::string err = c ? c->errstr : "alloc";
    if (c) redisFree(c);
    throw std::runtime_error(fmt::format("monitor: connect to {}:{}: {}", host, port, err));
  }
  redisSetTimeout(c, tv);
  auto* r = static_cast<redisReply*>(redisCommand(c, "MONITOR"));
  const bool ok = r != nullptr && r->type == REDIS_REPLY_STATUS && std::string(r->str, r->len) == "OK";
  if (r) freeReplyObject(r);
  if (!ok) {
    redisFree(c);
    throw std::runtime_error(fmt::format("monitor: MONITOR refused by {}:{}", host, port));
  }
  ctx_ = c;
}

RedisMonitor::~RedisMonitor() { redisFree(static_cast<redisContext*>(ctx_)); }

std::optional<std::string> RedisMonitor::next_line(std::chrono::milliseconds timeout) {
  auto* c = static_cast<redisContext*>(ctx_);
  if (c->err) return std::nullopt;
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(timeout).count();
  redisSetTimeout(c, timeval{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)});
  void* raw = nullptr;
  if (redisGetReply(c, &raw) != REDIS_OK) return std::nullopt;
  auto* r = static_cast<redisReply*>(raw);
  std::optional<std::string> out;
  if (r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_STRING) out.emplace(r->str, r->len);
  else out.emplace("(not a status line)");
  freeReplyObject(r);
  return out;
}

bool pause_clients_at(const redis::ConnectionOptions& probe_options, const std::string& host, std::uint16_t port,
                      std::chrono::milliseconds d) {
  redis::Client probe(probe_options);
  if (!probe.wait_connected(std::chrono::milliseconds(2000))) {
    ADD_FAILURE() << "pause_clients: no connection to " << host << ":" << port;
    return false;
  }
  for (int attempt = 1; attempt <= 3; ++attempt) {
    const std::string ok = redis_command_at(host, port, "CLIENT PAUSE " + std::to_string(d.count()) + " ALL");
    if (ok != "OK") {
      ADD_FAILURE() << "CLIENT PAUSE answered " << ok;
      return false;
    }
    redis::CallOptions co;
    co.timeout = std::chrono::milliseconds(100);
    try {
      probe.exec(redis::Command{"PING"}, co);
    } catch (const Error& e) {
      if (e.code() == errc::timeout) return true;  // paused
      ADD_FAILURE() << "pause_clients: the probe failed: " << e.what();
      return false;
    }
  }
  ADD_FAILURE() << "CLIENT PAUSE " << d.count() << " ALL did not hold three times in a row";
  return false;
}

bool RedisTest::pause_clients(std::chrono::milliseconds d) const {
  return pause_clients_at(options(), server->host(), server->port(), d);
}

std::string RedisTest::admin(const std::string& command) const {
  return redis_command_at(server->host(), server->port(), command);
}

}  // namespace jobguard::test
