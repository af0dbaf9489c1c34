// The CPU cost of the Redis core without the network: encoding commands,
// matching a pipeline of replies, and batching queued requests into one write.
// Run: build-*/bench/jobguard_redis_codec_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "jobguard/redis/command.hpp"
#include "redis/multiplexer.hpp"

using jobguard::redis::Command;
using jobguard::redis::Reply;
using jobguard::redis::detail::Clock;
using jobguard::redis::detail::Multiplexer;

namespace {

// The lock acquire command: SET key token NX PX ttl.
void BM_EncodeSetNxPx(benchmark::State& state) {
  const std::string key = "jobguard:lock:invoice:48291";
  const std::string token = "host-1/4242/job-7:0123456789abcdef0123456789abcdef";
  for (auto _ : state) {
    Command c{"SET", key, token, "NX", "PX", "30000"};
    benchmark::DoNotOptimize(c.payload().data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EncodeSetNxPx);

// A value of state.range(0) bytes: encoding cost against payload size.
void BM_EncodeSetValueSize(benchmark::State& state) {
  const std::string value(static_cast<std::size_t>(state.range(0)), 'x');
  for (auto _ : state) {
    Command c{"SET", "k", value};
    benchmark::DoNotOptimize(c.payload().data());
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_EncodeSetValueSize)->Arg(16)->Arg(1024)->Arg(64 * 1024);

std::string pipeline_bytes(int n, const std::string& one) {
  std::string s;
  s.reserve(one.size() * static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) s += one;
  return s;
}

// Matching N replies (all in one read) to N requests in flight: the per-reply
// cost of hiredis parsing plus our in-place Reply building and completion.
// `unit` holds `per_unit` replies; range(0) units are fed per iteration.
void feed_n(benchmark::State& state, const std::string& unit, int per_unit) {
  const int n = static_cast<int>(state.range(0)) * per_unit;
  const std::string wire = pipeline_bytes(static_cast<int>(state.range(0)), unit);
  const std::string payload = Command{"SET", "k", "v", "NX", "PX", "30000"}.payload();
  std::size_t completed = 0;
  Multiplexer m;
  for (auto _ : state) {
    state.PauseTiming();
    for (int i = 0; i < n; ++i) {
      Multiplexer::Request r;
      r.payload = payload;
      r.deadline = Clock::time_point::max();
      r.done = [&completed](std::error_code, Reply) { ++completed; };
      m.enqueue(std::move(r));
    }
    m.prepare_write();
    m.write_done();
    state.ResumeTiming();
    if (m.feed(wire.data(), wire.size())) state.SkipWithError("protocol error");
  }
  benchmark::DoNotOptimize(completed);
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * wire.size()));
}

void BM_FeedStatusReplies(benchmark::State& state) { feed_n(state, "+OK\r\n", 1); }
BENCHMARK(BM_FeedStatusReplies)->Arg(1)->Arg(64)->Arg(1024);

void BM_FeedMixedReplies(benchmark::State& state) {
  // OK, nil (lock busy), an integer (release) and a small array.
  feed_n(state, "+OK\r\n$-1\r\n:1\r\n*2\r\n$5\r\nowner\r\n:30000\r\n", 4);
}
BENCHMARK(BM_FeedMixedReplies)->Arg(16)->Arg(256);

// Moving N queued requests to the in-flight list and concatenating their
// bytes into one write: what automatic pipelining costs per command.
void BM_PrepareWriteBatch(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const std::string payload = Command{"SET", "jobguard:lock:k", "token", "NX", "PX", "30000"}.payload();
  Multiplexer m;
  std::size_t bytes = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (int i = 0; i < n; ++i) {
      Multiplexer::Request r;
      r.payload = payload;
      r.deadline = Clock::time_point::max();
      r.done = [](std::error_code, Reply) {};
      m.enqueue(std::move(r));
    }
    state.ResumeTiming();
    bytes += m.prepare_write().size();
    m.write_done();
    state.PauseTiming();
    // Drop the in-flight entries without timing it (not part of the write).
    m.fail_in_flight(std::error_code{}, {});
    state.ResumeTiming();
  }
  benchmark::DoNotOptimize(bytes);
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_PrepareWriteBatch)->Arg(1)->Arg(64)->Arg(1024);

}  // namespace

BENCHMARK_MAIN();
