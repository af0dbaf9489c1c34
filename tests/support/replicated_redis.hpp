// A primary and its replicas, each a private redis-server (EmbeddedRedis) on a
// free loopback port in its own temporary directory, replicating over
// loopback. Every process is killed when the object dies, a failed test
// included. For the replica-confirmed grant and Sentinel tests.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "jobguard/testing/embedded_redis.hpp"

namespace jobguard::test {

class ReplicatedRedis {
 public:
  explicit ReplicatedRedis(int replicas = 1, std::vector<std::string> extra_args = {});
  ~ReplicatedRedis();
  ReplicatedRedis(const ReplicatedRedis&) = delete;
  ReplicatedRedis& operator=(const ReplicatedRedis&) = delete;

  // Before start(): every server also listens with TLS (--tls-port) on this
  // certificate, and the replicas replicate over TLS (--tls-replication yes,
  // REPLICAOF to the primary's TLS port).
  void tls(const std::string& cert_file, const std::string& key_file, const std::string& ca_file);
  bool tls() const noexcept { return tls_; }

  // Starts every server, points each replica at the primary and waits until
  // every link is up and in sync. Throws std::runtime_error naming the
  // server that did not get there.
  void start(std::chrono::milliseconds timeout = std::chrono::seconds(10));

  EmbeddedRedis& primary() { return *primary_; }
  EmbeddedRedis& replica(std::size_t i) { return *replicas_.at(i); }
  std::size_t replica_count() const { return replicas_.size(); }

  // True once replica i reports master_link_status:up (and, with
  // `caught_up`, its offset equals the primary's).
  bool linked(std::size_t i, bool caught_up = true);

 private:
  EmbeddedRedisOptions options_;
  int replica_count_ = 0;
  bool tls_ = false;
  std::unique_ptr<EmbeddedRedis> primary_;
  std::vector<std::unique_ptr<EmbeddedRedis>> replicas_;
  void make();
};

// The value of `field` in an INFO reply ("" when absent).
std::string info_field(const std::string& info, const std::string& field);

}  // namespace jobguard::test
