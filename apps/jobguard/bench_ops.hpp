// The engine behind `jobguard bench`: W callers on one client, as coroutines
// on the client's event loop (like async workers in Node) or as blocking
// threads. One Runner keeps one client, so every phase of a run uses the
// same connections.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::cli::bench {

enum class Op {
  raw_set,    // SET key v NX PX 30000 on distinct keys
  raw_pair,   // SET NX PX + EVALSHA compare-and-delete, sent raw
  lock_pair,  // the same pair through jobguard::Lock
};

struct Config {
  int workers = 64;
  std::chrono::duration<double> seconds{3};
  bool threads = false;
};

struct Phase {
  std::uint64_t ops = 0, errors = 0, commands = 0, writes = 0;
  double elapsed_s = 0;
  std::vector<float> latencies_us;
};

bool lock_ops_available();

class Runner {
 public:
  Runner(const redis::ConnectionOptions& opts, Config cfg);
  ~Runner();
  bool connected() const noexcept { return connected_; }
  Phase run(Op op);

 private:
  Phase run_coro(Op op);
  Phase run_threads(Op op);

  Config cfg_;
  boost::asio::io_context ctx_{1};
  std::unique_ptr<redis::Client> client_;
  std::shared_ptr<LockService> locks_;
  KeyBuilder keys_;
  std::string channel_for(const std::string& resource) const { return keys_.channel(resource); }
  std::thread loop_;
  bool connected_ = false;
  std::uint64_t generation_ = 0;  // distinct keys across phases
};

}  // namespace jobguard::cli::bench
