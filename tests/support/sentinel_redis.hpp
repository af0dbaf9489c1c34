// A Sentinel deployment for tests: a primary, its replicas (ReplicatedRedis)
// and redis-sentinel processes (`redis-server <conf> --sentinel`), each on a
// free loopback port in its own temporary directory, all killed when the
// object dies. Sentinel timeouts are lowered so a failover takes about a
// second, not the production default of half a minute.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "jobguard/testing/embedded_redis.hpp"
#include "support/replicated_redis.hpp"

namespace jobguard::test {

class SentinelRedis {
 public:
  explicit SentinelRedis(int replicas = 2, int sentinels = 3, std::string master = "mymaster");
  ~SentinelRedis();
  SentinelRedis(const SentinelRedis&) = delete;
  SentinelRedis& operator=(const SentinelRedis&) = delete;

  // Starts the data nodes, then the sentinels, and waits until every
  // sentinel knows every replica and every other sentinel (a failover asked
  // for before that is refused: NOGOODSLAVE). Throws std::runtime_error.
  void start(std::chrono::milliseconds timeout = std::chrono::seconds(20));

  // redis+sentinel://127.0.0.1:A,127.0.0.1:B,.../mymaster, plus "?query".
  std::string url(const std::string& query = {}) const;
  // The same with the sentinels' TLS ports and sentinel_tls=yes (the data
  // nodes stay plain), plus "&query". Needs sentinel_tls() before start().
  std::string tls_url(const std::string& query = {}) const;
  // Before start(): the sentinels also listen with TLS (--tls-port) on this
  // certificate; they still talk to the data nodes and each other in plain.
  void sentinel_tls(std::string cert_file, std::string key_file, std::string ca_file);
  // Before start(): how long the primary may not answer before the sentinels
  // fail it over (1 s by default, so failover tests are quick). A test that
  // fails nothing over sets more: on a loaded host a primary starved of the
  // CPU for a second is failed over, and the test then meets a new primary.
  void down_after(std::chrono::milliseconds d) { down_after_ = d; }
  // Before start(): TLS everywhere. The sentinels as sentinel_tls(), the data
  // nodes listen with TLS and replicate over it, and the sentinels reach the
  // data nodes and each other over TLS (--tls-replication yes), so every
  // address a sentinel names is a TLS port.
  void tls_everywhere(const std::string& cert_file, const std::string& key_file, const std::string& ca_file);
  // rediss+sentinel://<the sentinels' TLS ports>/mymaster, plus "?query".
  std::string tls_everywhere_url(const std::string& query = {}) const;
  const std::string& master_name() const noexcept { return master_; }
  ReplicatedRedis& data() { return *data_; }
  EmbeddedRedis& sentinel(std::size_t i) { return *sentinels_.at(i); }
  std::size_t sentinel_count() const { return sentinels_.size(); }

  // The primary's port as sentinel `i` names it (its TLS port with
  // tls_everywhere()).
  std::uint16_t primary_port(std::size_t i = 0);
  // The data node (primary or replica) listening on `port`, plain or TLS.
  EmbeddedRedis& node(std::uint16_t port);

  // SENTINEL FAILOVER, then waits until every sentinel names the new primary,
  // that server says ROLE master and the other nodes replicate from it.
  // Returns the new primary's port; `named_at`, when given, gets the moment
  // the first sentinel named it (the promotion happened before).
  std::uint16_t failover(std::chrono::milliseconds timeout = std::chrono::seconds(20),
                         std::chrono::steady_clock::time_point* named_at = nullptr);

 private:
  std::string tls_list() const;  // "127.0.0.1:A,127.0.0.1:B,...", the sentinels' TLS ports
  std::string master_;
  EmbeddedRedisOptions sentinel_base_;
  std::chrono::milliseconds down_after_{1000};
  std::unique_ptr<ReplicatedRedis> data_;
  std::vector<std::unique_ptr<EmbeddedRedis>> sentinels_;
};

}  // namespace jobguard::test
