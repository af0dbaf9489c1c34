#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "jobguard/observe/event_log.hpp"
#include "jobguard/observe/exposition.hpp"
#include "jobguard/observe/metrics.hpp"

using namespace jobguard::observe;
using namespace std::chrono_literals;

TEST(ObserveConcurrency, IncrementsFromManyThreadsAreAllCounted) {
  Registry r;
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20000;
  std::atomic<bool> stop_reader{false};
  // A scraper reading while writers write: the snapshot must stay coherent
  // (_count == +Inf bucket) at every moment, not only at the end.
  std::thread reader([&] {
    while (!stop_reader.load()) {
      for (const auto& c : r.snapshot()) {
        ASSERT_EQ(c.hold_seconds.count, c.hold_seconds.cumulative.back());
        ASSERT_LE(c.hold_seconds.count, std::uint64_t{kThreads} * kPerThread);
      }
      (void)to_prometheus(r);
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&r, t] {
      // Half the threads look the class up each time (the shared-lock path),
      // half keep the reference, and each also creates its own class.
      auto& own = r.lock_class("thread-" + std::to_string(t));
      for (int i = 0; i < kPerThread; ++i) {
        auto& m = (t % 2 == 0) ? r.lock_class("billing") : r.lock_class(std::string("billing"));
        m.acquisitions_total.inc();
        m.hold_seconds.observe(std::chrono::microseconds(50 + (i % 7) * 1000));
        m.releases_total.inc();
        own.busy_total.inc();
      }
    });
  }
  for (auto& w : writers) w.join();
  stop_reader = true;
  reader.join();

  const auto billing = r.snapshot("billing");
  ASSERT_TRUE(billing.has_value());
  const std::uint64_t total = std::uint64_t{kThreads} * kPerThread;
  EXPECT_EQ(billing->acquisitions_total, total);
  EXPECT_EQ(billing->releases_total, total);
  EXPECT_EQ(billing->hold_seconds.count, total);
  // Exact sum: integer nanoseconds do not drift under concurrent adds.
  std::uint64_t expected_ns = 0;
  for (int i = 0; i < kPerThread; ++i) expected_ns += static_cast<std::uint64_t>(50 + (i % 7) * 1000) * 1000;
  EXPECT_DOUBLE_EQ(billing->hold_seconds.sum_seconds, static_cast<double>(expected_ns * kThreads) / 1e9);
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(r.snapshot("thread-" + std::to_string(t))->busy_total, std::uint64_t{kPerThread});
  EXPECT_EQ(r.snapshot().size(), std::size_t{kThreads} + 1);
}

TEST(ObserveConcurrency, LogLinesFromManyThreadsNeverInterleave) {
  std::string all;  // appended by the sink, which EventLog serialises
  EventLog log(LogFormat::json, [&](std::string_view l) {
    all += l;
    all += '\n';
  });
  constexpr int kThreads = 6;
  constexpr int kPerThread = 500;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&log, t] {
      const std::string job = "job-" + std::to_string(t);
      for (int i = 0; i < kPerThread; ++i)
        log.emit(Event{.event = "renewed", .lock_key = "jobguard:lock:{tenant:alpha:sync}", .job_id = job,
                       .lock_class = "sync", .outcome = "ok", .elapsed_ms = i * 0.5});
    });
  }
  for (auto& t : ts) t.join();
  std::size_t lines = 0, start = 0;
  while (start < all.size()) {
    const auto nl = all.find('\n', start);
    ASSERT_NE(nl, std::string::npos);
    const auto j = nlohmann::json::parse(all.substr(start, nl - start));
    EXPECT_EQ(j.at("event"), "renewed");
    ++lines;
    start = nl + 1;
  }
  EXPECT_EQ(lines, std::size_t{kThreads} * kPerThread);
}
