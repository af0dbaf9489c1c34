// `jobguard bench --jobs M --rate N/PERIOD`: what a rate limit costs the
// stream worker and how closely it holds, the peer of BullMQ's limiter run
// by bench/peers/bullmq-bench.js --rate in bench/compare.sh --rate.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "jobguard/job/limits.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::bench {

struct RateConfig {
  // Overhead: M guarded no-op jobs at each concurrency, unlimited, under one
  // budget far above what the worker reaches, and under a budget per key of
  // 16 keys just as high (each run twice, in the order A B C C B A): the
  // limiter's own cost, its waits never taken.
  int jobs = 20000;
  std::vector<int> concurrency{64};
  // Accuracy: at the last concurrency, a backlog of limit.count x k + 1 jobs
  // (k whole periods covering `window_s`) under `limit`; the starts' rate
  // over the k periods and the most starts in any one period (and tenth).
  job::RateLimit limit{};
  double window_s = 10;
};

// Throws Error(invalid_argument) for an accuracy run over 10,000,000 jobs,
// Error(redis_unavailable) when it cannot connect.
nlohmann::json run_rate(const redis::ConnectionOptions& opts, const RateConfig& cfg);
// The same as text, one line a figure.
std::string rate_text(const nlohmann::json& j);

}  // namespace jobguard::bench
