// Completion records: one typed suite, run against PostgreSQL and Redis.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "backends.hpp"
#include "support/redis_fixture.hpp"
#include "jobguard/error.hpp"

using namespace jobguard;
using namespace jobguard::guard;
using namespace jobguard::test;

template <class B>
class CompletionContract : public PostgresTest {};
using Backends = ::testing::Types<PgBackend, RedisBackend>;
TYPED_TEST_SUITE(CompletionContract, Backends, BackendNames);

TYPED_TEST(CompletionContract, RecordSucceedsOnceAndTheSecondLearnsWhenAndByWhom) {
  auto s = TypeParam::completion();
  const auto entity = this->name("sub");
  const auto first = s->record("charge", entity, "2026-11", "worker-a", "ch_1");
  ASSERT_TRUE(first.recorded);
  const auto second = s->record("charge", entity, "2026-11", "worker-b", "ch_2");
  EXPECT_FALSE(second.recorded);
  EXPECT_EQ(second.record.completed_by, "worker-a");
  EXPECT_EQ(second.record.result, "ch_1");
  EXPECT_EQ(second.record.completed_at, first.record.completed_at);
  const auto age = std::chrono::system_clock::now() - second.record.completed_at;
  EXPECT_LT(std::chrono::abs(age), std::chrono::minutes(1)) << "completed_at is a real timestamp";
}

TYPED_TEST(CompletionContract, FindSeesNothingBeforeAndTheRecordAfter) {
  auto s = TypeParam::completion();
  const auto entity = this->name("sub");
  EXPECT_FALSE(s->find("charge", entity, "r1").has_value());
  s->record("charge", entity, "r1", "me", "ok");
  const auto f = s->find("charge", entity, "r1");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->completed_by, "me");
  EXPECT_EQ(f->result, "ok");
  EXPECT_FALSE(s->find("charge", entity, "r2").has_value()) << "another run of the same entity is separate";
}

TYPED_TEST(CompletionContract, PartsWithSeparatorsNeverCollide) {
  auto s = TypeParam::completion();
  const auto e = this->name("e");
  ASSERT_TRUE(s->record("a:b", e, "c", "w").recorded);
  EXPECT_TRUE(s->record("a", "b:" + e, "c", "w").recorded);
}

TYPED_TEST(CompletionContract, EmptyPartIsRefusedNamingIt) {
  auto s = TypeParam::completion();
  try {
    s->record("charge", "", "r", "w");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
  }
}

TYPED_TEST(CompletionContract, ConcurrentRecordersExactlyOneWins) {
  const auto entity = this->name("sub");
  constexpr int kThreads = 8;
  std::atomic<int> wins{0}, losses{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      auto s = TypeParam::completion();
      const auto r = s->record("charge", entity, "r", "w" + std::to_string(t));
      (r.recorded ? wins : losses)++;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(wins.load(), 1);
  EXPECT_EQ(losses.load(), kThreads - 1);
}

class RedisCompletion : public PostgresTest {};

TEST_F(RedisCompletion, RetentionLetsARecordExpire) {
  RedisCompletionOptions o;
  o.retention = std::chrono::milliseconds(200);
  auto s = RedisBackend::completion(o);
  const auto e = name("e");
  ASSERT_TRUE(s->record("k", e, "r", "w").recorded);
  EXPECT_FALSE(s->record("k", e, "r", "w").recorded);
  EXPECT_TRUE(eventually([&] { return !s->find("k", e, "r").has_value(); }, std::chrono::seconds(3)));
  EXPECT_TRUE(s->record("k", e, "r", "w").recorded);
}
