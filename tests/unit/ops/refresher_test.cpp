// detail::Refresher, the thread behind FleetExporter and RedisWatcher: the
// first-render wait, readers on other threads while it renders, and a stop
// in the middle of a render. Runs under ThreadSanitizer too (label tsan).
#include "ops/refresher.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

namespace jobguard::ops::detail {
namespace {

using namespace std::chrono_literals;

TEST(Refresher, TextWaitsForTheFirstRenderAndThenFollowsTheRenders) {
  std::atomic<int> renders{0};
  Refresher r("initial", 5ms, 10s, [&] { return "render " + std::to_string(++renders); });
  EXPECT_EQ(r.text().rfind("render ", 0), 0u) << "the first scrape waits for the first render";
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (renders.load() < 5 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  ASSERT_GE(renders.load(), 5) << "it renders again every `refresh`";
  const int seen = std::stoi(r.text().substr(7));
  EXPECT_GE(seen, 4);
  EXPECT_LE(seen, renders.load());
}

TEST(Refresher, ASlowFirstRenderShowsTheInitialTextAfterTheWait) {
  std::promise<void> go;
  auto gate = go.get_future().share();
  Refresher r("initial", 1h, 20ms, [gate] {
    gate.wait();
    return std::string("rendered");
  });
  EXPECT_EQ(r.text(), "initial");
  go.set_value();
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  std::string t;
  while ((t = r.text()) != "rendered" && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(t, "rendered");
}

TEST(Refresher, ReadersOnOtherThreadsWhileItRendersAndAStopMidRender) {
  std::atomic<int> renders{0};
  {
    Refresher r("initial", 1ms, 10s, [&] {
      std::this_thread::sleep_for(2ms);
      return std::string(static_cast<std::size_t>(++renders % 64 + 1), 'x');
    });
    std::vector<std::thread> readers;
    std::atomic<int> reads{0};
    for (int i = 0; i < 4; ++i)
      readers.emplace_back([&] {
        for (int n = 0; n < 200; ++n) {
          const auto t = r.text();
          EXPECT_TRUE(t == "initial" || t.find_first_not_of('x') == std::string::npos) << t;
          ++reads;
        }
      });
    for (auto& t : readers) t.join();
    EXPECT_EQ(reads.load(), 800);
  }  // the destructor joins, here most likely inside a render
  const int at_stop = renders.load();
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(renders.load(), at_stop) << "no render after the destructor returned";
}

}  // namespace
}  // namespace jobguard::ops::detail
