// A Redis Cluster for tests: 3 primaries and 3 replicas, each a private
// redis-server (`--cluster-enabled yes`, its bus on a free port of its own)
// in its own temporary directory, joined by `redis-cli --cluster create`.
// Every process is killed when the object dies.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "jobguard/testing/embedded_redis.hpp"

namespace jobguard::test {

class ClusterRedis {
 public:
  // `env[i]`: extra environment of node i (an LD_PRELOAD shim), if given.
  explicit ClusterRedis(int primaries = 3, int replicas_each = 1, std::vector<std::vector<std::string>> env = {});
  ~ClusterRedis();
  ClusterRedis(const ClusterRedis&) = delete;
  ClusterRedis& operator=(const ClusterRedis&) = delete;

  // Starts the nodes, creates the cluster and waits until every node says
  // cluster_state:ok. Throws std::runtime_error naming what did not happen.
  void start(std::chrono::milliseconds timeout = std::chrono::seconds(30));

  // Waits until CLUSTER SLOTS lists every shard's replicas (they join a few
  // seconds after start() returns). Throws std::runtime_error.
  void wait_replicated(std::chrono::milliseconds timeout = std::chrono::seconds(30));

  std::size_t size() const { return nodes_.size(); }
  EmbeddedRedis& node(std::size_t i) { return *nodes_.at(i); }
  // redis://127.0.0.1:<first node>/0?cluster=yes, plus "&query".
  std::string url(const std::string& query = {}) const;
  // The port of the primary serving `slot`, from CLUSTER SLOTS on node 0.
  std::uint16_t primary_of(std::uint16_t slot);
  // A replica of the primary on `primary_port` (its port).
  std::uint16_t replica_of(std::uint16_t primary_port);
  // Runs `command` on node `port`.
  std::string on(std::uint16_t port, const std::string& command);

 private:
  std::vector<std::string> env_for(std::size_t i) const;
  int primaries_, replicas_each_;
  std::vector<std::vector<std::string>> env_;
  std::vector<std::unique_ptr<EmbeddedRedis>> nodes_;
};

// A fixture whose tests share one cluster of 3 primaries without replicas,
// started before the suite's first test and stopped after its last: for
// tests that do not fail nodes over (those make a cluster each).
class SharedClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster = new ClusterRedis(3, 0);
    cluster->start();
  }
  static void TearDownTestSuite() {
    delete cluster;
    cluster = nullptr;
  }
  static inline ClusterRedis* cluster = nullptr;
};

}  // namespace jobguard::test
