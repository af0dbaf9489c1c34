#include <gtest/gtest.h>

#include <thread>

#include "support/redis_fixture.hpp"

using namespace jobguard;
using namespace jobguard::redis;

class RedisClient : public jobguard::test::RedisTest {};

TEST_F(RedisClient, SetAndGetRoundTrip) {
  auto c = make_client();
  EXPECT_TRUE(c->exec(Command{"SET", key("a"), "1"}).is_ok());
  EXPECT_EQ(c->exec(Command{"GET", key("a")}).str, "1");
  EXPECT_TRUE(c->exec(Command{"GET", key("missing")}).is_nil());
}

TEST_F(RedisClient, ManyThreadsPipelineOverOneConnection) {
  auto c = make_client();
  constexpr int kThreads = 8, kPerThread = 2000;
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      std::vector<std::future<Reply>> fs;
      for (int i = 0; i < kPerThread; ++i) fs.push_back(c->exec_future(Command{"INCR", key(std::to_string(t))}));
      for (int i = 0; i < kPerThread; ++i)
        if (fs[i].get().integer == i + 1) ok++;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), kThreads * kPerThread);
  const auto s = c->stats();
  EXPECT_LT(s.writes, s.commands / 4) << "commands issued concurrently must share writes";
}
