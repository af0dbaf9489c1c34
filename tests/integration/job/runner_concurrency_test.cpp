// Many threads sharing one GuardedRunner on the same units: every unit's
// effect runs exactly once — for a low class with a lock and with a lease, and
// for a moderate class with an idempotency key (whose one-call claim leaves the
// key to the finish). In the ThreadSanitizer run (no fork here).
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <thread>

#include "jobguard/guard/completion.hpp"
#include "jobguard/guard/idempotency.hpp"
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
  guard::RedisIdempotencyStore idem(*client, {.prefix = key("idem:")});
  struct Variant {
    const char* name;
    bool long_running, moderate;
  };
  for (const Variant v : {Variant{"conc-lock", false, false}, Variant{"conc-lease", true, false},
                          Variant{"conc-moderate", false, true}}) {
    const bool long_running = v.long_running;
    job::LockClass cls{.name = v.name,
                       .key_pattern = "unit:{id}",
                       .consequence = v.moderate ? job::Consequence::moderate : job::Consequence::low,
                       .ttl = 5s,
                       .wait = 3s,  // racers wait for the holder, then find the record
                       .long_running = long_running,
                       .hard_timeout = long_running ? 30s : 0s,
                       .owner = "tests",
                       .protects = "a counter per unit"};
    job::GuardedRunner runner(leases, cls, {.completions = &done, .idempotency = v.moderate ? &idem : nullptr});
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
    for (int u = 0; u < kUnits; ++u) {
      EXPECT_EQ(runs[static_cast<std::size_t>(u)].load(), 1) << cls.name << " unit " << u;
      if (v.moderate) {  // written once, by the one run that did the effect
        EXPECT_EQ(idem.begin(cls.name + "/unit:" + std::to_string(u) + "/r", "r", 1s).status,
                  guard::BeginStatus::completed)
            << "unit " << u;
      }
    }
  }
}
