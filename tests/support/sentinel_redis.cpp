#include "support/sentinel_redis.hpp"

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <stdexcept>

#include "support/redis_fixture.hpp"

namespace jobguard::test {
namespace {

// `SENTINEL <what> <name>`: how many entries it lists (-1 when it cannot be asked).
int count_listed(std::uint16_t sentinel_port, const std::string& what, const std::string& name) {
  try {
    const std::string r = redis_command_at("127.0.0.1", sentinel_port, fmt::format("SENTINEL {} {}", what, name));
    if (r.rfind("(array of ", 0) != 0) return -1;
    return std::stoi(r.substr(10));
  } catch (const std::exception&) {
    return -1;
  }
}

// The flags of every replica sentinel `port` lists for `name`.
std::vector<std::string> replica_flags(std::uint16_t port, const std::string& name) {
  std::vector<std::string> out;
  timeval tv{2, 0};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (c == nullptr || c->err) {
    if (c) redisFree(c);
    return out;
  }
  redisSetTimeout(c, tv);
  auto* r = static_cast<redisReply*>(redisCommand(c, "SENTINEL REPLICAS %s", name.c_str()));
  if (r != nullptr && r->type == REDIS_REPLY_ARRAY) {
    for (std::size_t i = 0; i < r->elements; ++i) {
      const redisReply* e = r->element[i];
      for (std::size_t k = 0; e->type == REDIS_REPLY_ARRAY && k + 1 < e->elements; k += 2)
        if (std::string(e->element[k]->str, e->element[k]->len) == "flags")
          out.emplace_back(e->element[k + 1]->str, e->element[k + 1]->len);
    }
  }
  if (r) freeReplyObject(r);
  redisFree(c);
  return out;
}

}  // namespace

SentinelRedis::SentinelRedis(int replicas, int sentinels, std::string master)
    : master_(std::move(master)), data_(std::make_unique<ReplicatedRedis>(replicas)) {
  for (int i = 0; i < sentinels; ++i) sentinels_.push_back(nullptr);
}

// The sentinels die first (they would otherwise start a failover while the
// data nodes go), then the data nodes.
SentinelRedis::~SentinelRedis() { sentinels_.clear(); }

void SentinelRedis::start(std::chrono::milliseconds timeout) {
  data_->start();
  const std::uint16_t primary = data_->tls() ? data_->primary().tls_port() : data_->primary().port();
  for (auto& s : sentinels_) {
    EmbeddedRedisOptions o = sentinel_base_;
    // down-after 1 s (down_after()), failover-timeout 2 s: the production
    // defaults (30 s, 3 min) would make a test of a failover last minutes.
    o.config_text = fmt::format(
        "sentinel monitor {0} 127.0.0.1 {1} 2\n"
        "sentinel down-after-milliseconds {0} {2}\n"
        "sentinel failover-timeout {0} 2000\n"
        "sentinel parallel-syncs {0} 2\n",
        master_, primary, down_after_.count());
    o.extra_args = {"--sentinel"};
    if (data_->tls()) o.extra_args.insert(o.extra_args.end(), {"--tls-replication", "yes"});
    s = std::make_unique<EmbeddedRedis>(o);
    s->start();
    // With TLS the sentinels tell each other their TLS ports (as a TLS-only
    // deployment, port 0, would): a client learns the others from SENTINEL
    // sentinels and must reach them over TLS too.
    if (s->tls_port() != 0) {
      const auto r = redis_command_at("127.0.0.1", s->port(),
                                      fmt::format("SENTINEL CONFIG SET announce-port {}", s->tls_port()));
      if (r != "OK") throw std::runtime_error("SENTINEL CONFIG SET announce-port: " + r);
    }
  }
  const int replicas = static_cast<int>(data_->replica_count());
  const int others = static_cast<int>(sentinels_.size()) - 1;
  for (auto& s : sentinels_) {
    // Replicas are learned from the primary's INFO (at once when they are
    // attached before the sentinel starts, else on its 10 s poll); other
    // sentinels from the hello channel, every 2 s.
    const bool ok = eventually(
        [&] {
          if (count_listed(s->port(), "replicas", master_) != replicas) return false;
          if (count_listed(s->port(), "sentinels", master_) != others) return false;
          for (const auto& f : replica_flags(s->port(), master_))
            if (f != "slave") return false;
          return true;
        },
        timeout);
    if (!ok)
      throw std::runtime_error(fmt::format("sentinel 127.0.0.1:{} never saw {} replicas and {} other sentinels (see {})",
                                           s->port(), replicas, others, s->dir()));
  }
}

std::string SentinelRedis::url(const std::string& query) const {
  std::string list;
  for (const auto& s : sentinels_) list += fmt::format("{}127.0.0.1:{}", list.empty() ? "" : ",", s->port());
  return fmt::format("redis+sentinel://{}/{}{}{}", list, master_, query.empty() ? "" : "?", query);
}

void SentinelRedis::sentinel_tls(std::string cert_file, std::string key_file, std::string ca_file) {
  sentinel_base_.tls_cert_file = std::move(cert_file);
  sentinel_base_.tls_key_file = std::move(key_file);
  sentinel_base_.tls_ca_file = std::move(ca_file);
}

std::string SentinelRedis::tls_list() const {
  std::string list;
  for (const auto& s : sentinels_) list += fmt::format("{}127.0.0.1:{}", list.empty() ? "" : ",", s->tls_port());
  return list;
}

std::string SentinelRedis::tls_url(const std::string& query) const {
  return fmt::format("redis+sentinel://{}/{}?sentinel_tls=yes{}{}", tls_list(), master_, query.empty() ? "" : "&",
                     query);
}

void SentinelRedis::tls_everywhere(const std::string& cert_file, const std::string& key_file,
                                   const std::string& ca_file) {
  sentinel_tls(cert_file, key_file, ca_file);
  data_->tls(cert_file, key_file, ca_file);
}

std::string SentinelRedis::tls_everywhere_url(const std::string& query) const {
  return fmt::format("rediss+sentinel://{}/{}{}{}", tls_list(), master_, query.empty() ? "" : "?", query);
}

std::uint16_t SentinelRedis::primary_port(std::size_t i) {
  timeval tv{2, 0};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", sentinels_.at(i)->port(), tv);
  if (c == nullptr || c->err) {
    if (c) redisFree(c);
    throw std::runtime_error("cannot reach sentinel");
  }
  redisSetTimeout(c, tv);
  auto* r = static_cast<redisReply*>(redisCommand(c, "SENTINEL get-master-addr-by-name %s", master_.c_str()));
  std::uint16_t port = 0;
  if (r != nullptr && r->type == REDIS_REPLY_ARRAY && r->elements == 2)
    port = static_cast<std::uint16_t>(std::stoi(std::string(r->element[1]->str, r->element[1]->len)));
  if (r) freeReplyObject(r);
  redisFree(c);
  if (port == 0) throw std::runtime_error("sentinel does not name a primary");
  return port;
}

EmbeddedRedis& SentinelRedis::node(std::uint16_t port) {
  auto is = [port](EmbeddedRedis& r) { return r.port() == port || r.tls_port() == port; };
  if (is(data_->primary())) return data_->primary();
  for (std::size_t i = 0; i < data_->replica_count(); ++i)
    if (is(data_->replica(i))) return data_->replica(i);
  throw std::runtime_error(fmt::format("no data node on port {}", port));
}

std::uint16_t SentinelRedis::failover(std::chrono::milliseconds timeout, std::chrono::steady_clock::time_point* named_at) {
  const std::uint16_t old = primary_port(0);
  const std::string r =
      redis_command_at("127.0.0.1", sentinels_.front()->port(), fmt::format("SENTINEL FAILOVER {}", master_));
  if (r != "OK") throw std::runtime_error("SENTINEL FAILOVER: " + r);
  std::uint16_t now = 0;
  const bool moved = eventually(
      [&] {
        try {
          now = primary_port(0);
          if (now == old) return false;
          if (named_at && *named_at == std::chrono::steady_clock::time_point{}) *named_at = std::chrono::steady_clock::now();
          for (std::size_t i = 1; i < sentinels_.size(); ++i)
            if (primary_port(i) != now) return false;
          // Asked in plain: `now` is a TLS port with tls_everywhere().
          return redis_command_at("127.0.0.1", node(now).port(), "INFO replication").find("role:master") !=
                 std::string::npos;
        } catch (const std::exception&) {
          return false;
        }
      },
      timeout);
  if (!moved) throw std::runtime_error(fmt::format("the failover from 127.0.0.1:{} did not complete", old));
  return now;
}

}  // namespace jobguard::test
