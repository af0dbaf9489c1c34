// Many threads sharing one GuardedRunner on the same units: every unit's
// effect runs exactly once. In the ThreadSanitizer run (no fork here).
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <thread>

#include "jobguard/guard/completion.hpp"
#include "jobguard/job/runner.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;

class RunnerConcurrency : public test::RedisTest {};

TEST_F(RunnerConcurrency, ThreadsRacingOnTheSameUnitsRunEachEffectOnce) {
  auto client = make_client();
  auto leases = LeaseScheduler::create(LockService::create(*client, KeyBuilder("jgc")));
  guard::RedisCompletionStore done(*client, {.prefix = key("done:")});
  for (bool long_running : {false, true}) {
    job::LockClass cls{.name = long_running ? "conc-lease" : "conc-lock",
                       .key_pattern = "unit:{id}",
                       .consequence = job::Consequence::low,
                       .ttl = 5s,
                       .wait = 3s,  // racers wait for the holder, then find the record
                       .long_running = long_running,
                       .hard_timeout = long_running ? 30s : 0s,
                       .owner = "tests",
                       .protects = "a counter per unit"};
    job::GuardedRunner runner(leases, cls, {.completions = &done});
    constexpr int kUnits = 40, kThreads = 6;
    std::array<std::atomic<int>, kUnits> runs{};
    std::array<std::atomic<int>, kUnits> inside{};
    std::atomic<int> overlaps{0}, not_ok{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kUnits; ++i) {
          const int u = (i + t * 7) % kUnits;  // threads meet on units in different orders
          auto r = runner.run({.id = std::to_string(u), .run_id = "r", .chunks = long_running ? 2 : 0},
                              [&](job::JobContext& ctx) {
                                if (inside[static_cast<std::size_t>(u)].fetch_add(1) != 0) ++overlaps;
                                if (ctx.chunk() <= 0) ++runs[static_cast<std::size_t>(u)];
                                std::this_thread::sleep_for(1ms);
                                inside[static_cast<std::size_t>(u)].fetch_sub(1);
                                return std::string();
                              });
          if (!r.ok()) ++not_ok;
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(overlaps.load(), 0) << cls.name;
    EXPECT_EQ(not_ok.load(), 0) << cls.name;
    for (int u = 0; u < kUnits; ++u) EXPECT_EQ(runs[static_cast<std::size_t>(u)].load(), 1) << cls.name << " unit " << u;
  }
}
