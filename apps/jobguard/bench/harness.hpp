// The benchmarks' engine (bench.hpp is what the CLI calls): W callers on one
// client, as coroutines on the client's event loop (like async workers in
// Node) or as blocking threads. One Runner keeps one client, so every phase
// of a run uses the same connections.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/fleet.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::bench {

enum class Op {
  raw_set,    // SET key v NX PX 30000 on distinct keys
  raw_pair,   // SET NX PX + EVALSHA compare-and-delete, sent raw
  lock_pair,  // the same pair through jobguard::Lock
};

struct Config {
  int workers = 64;
  std::chrono::duration<double> seconds{3};
  bool threads = false;
  // Publish the fleet numbers every second (observe::FleetPublisher) while
  // measuring, as a library user would: `--no-fleet` measures without.
  bool fleet = true;
};

struct Phase {
  std::uint64_t ops = 0, errors = 0, commands = 0, writes = 0;
  double elapsed_s = 0;
  std::vector<float> latencies_us;
};

// contention(): each worker has its own Client (its own connection and event
// loop) and LockService, as separate worker processes would. All workers are
// threads of this process, so one monotonic clock times the handoff from one
// worker's release to the next worker's grant.
struct ContentionWorker {
  std::uint64_t count = 0, errors = 0;
  std::vector<float> waits_us;  // acquire call -> grant, per critical section
  double longest_wait_us = 0;   // includes a wait cut short by the end of the run
};

struct ContentionResult {
  std::vector<ContentionWorker> workers;
  std::vector<float> handoffs_us;        // release sent -> next grant received
  std::vector<float> other_handoffs_us;  // the same, to a worker other than the releaser
  std::uint64_t self_handoffs = 0;       // the releaser got it back
  std::uint64_t overlaps = 0;            // two holders at once: must stay 0
  double elapsed_s = 0;
  std::string first_error;
};

// Throws Error(redis_unavailable) when a worker cannot connect.
ContentionResult run_contention(const redis::ConnectionOptions& opts, const ContentionConfig& cfg);

// The JSON of jobs() and leases(), without the text.
nlohmann::json run_jobs(const redis::ConnectionOptions& opts, const JobsConfig& cfg);
nlohmann::json run_leases(const redis::ConnectionOptions& opts, const LeasesConfig& cfg);

// The f-quantile (0..1) of `v`; 0 when empty.
double quantile(std::vector<float> v, double f);
// JSON of a phase and of a contention run; the contention run as text.
nlohmann::json summarize(const Phase& p);
nlohmann::json summarize(const ContentionConfig& c, const ContentionResult& r);
std::string contention_text(const ContentionConfig& c, const nlohmann::json& summary, const std::string& where);

class Runner {
 public:
  Runner(const redis::ConnectionOptions& opts, Config cfg);
  ~Runner();
  bool connected() const noexcept { return connected_; }
  Phase run(Op op);

 private:
  Phase run_coro(Op op);
  Phase run_threads(Op op);
  void setup(const redis::ConnectionOptions& opts);
  void shutdown();

  Config cfg_;
  boost::asio::io_context ctx_{1};
  std::unique_ptr<redis::Client> client_;
  std::shared_ptr<LockService> locks_;
  std::unique_ptr<observe::FleetPublisher> fleet_;
  KeyBuilder keys_;
  std::string channel_for(const std::string& resource) const { return keys_.channel(resource); }
  std::thread loop_;
  bool connected_ = false;
  // A Redis Cluster: the raw release publishes as the lock's does (SPUBLISH,
  // release.lua's ARGV[4]), and every node has the script loaded.
  bool cluster_ = false;
  // The raw half's release: the lock's release script sent by hand, on a
  // cluster with the sharded-publish flag the lock's release passes there.
  redis::Command raw_release(const std::string& key, const std::string& token, const std::string& resource) const;
  std::uint64_t generation_ = 0;  // distinct keys across phases
};

// used_cpu_sys + used_cpu_user from INFO cpu: the server's own CPU seconds,
// summed over `nodes` (Client::primaries() on a cluster; empty = the one server).
double server_cpu_seconds(redis::Client& c, const std::vector<std::string>& nodes = {});

}  // namespace jobguard::bench
