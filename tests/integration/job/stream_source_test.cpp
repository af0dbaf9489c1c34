// StreamSource against a real redis-server: a job a consumer took and never
// acknowledged is reclaimed by another; a job that keeps failing ends in the
// dead-letter stream with its last error.
#include "jobguard/job/stream_source.hpp"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>
#include <fmt/format.h>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "jobguard/redis/client.hpp"
#include "jobguard/error.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using jobguard::job::StreamOptions;
using jobguard::job::StreamSource;
using jobguard::redis::Command;

namespace {

class StreamSourceTest : public jobguard::test::RedisTest {
 protected:
  StreamOptions opts(std::chrono::milliseconds idle, int attempts) {
    StreamOptions o;
    o.stream = key("jobs");
    o.group = "workers";
    o.block = 50ms;
    o.claim_idle = idle;
    o.max_attempts = attempts;
    return o;
  }
};

TEST_F(StreamSourceTest, StalledJobIsReclaimedAfterItsConsumerDiesWithoutAck) {
  auto c = make_client();
  StreamSource src(*c, opts(150ms, 5));
  src.ensure_group();
  src.ensure_group();  // an existing group is fine
  src.add({{"chunk", "7"}});

  auto first = src.next("dead-worker");
  ASSERT_TRUE(first);
  EXPECT_EQ(first->field("chunk"), "7");
  EXPECT_FALSE(first->reclaimed);
  // dead-worker "dies": no ack. Before claim_idle nobody else gets the job:
  // asked through a source whose claim_idle is a minute, so the answer does
  // not depend on landing within 150 ms on a loaded host.
  StreamSource patient(*c, opts(60s, 5));
  EXPECT_FALSE(patient.reclaim("live-worker"));
  EXPECT_FALSE(patient.next("live-worker"));

  std::this_thread::sleep_for(250ms);
  auto again = src.reclaim("live-worker");
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->reclaimed);
  EXPECT_EQ(again->id, first->id);
  EXPECT_EQ(again->field("chunk"), "7");
  EXPECT_EQ(again->deliveries, 2);
  EXPECT_TRUE(src.ack(again->id));
  EXPECT_FALSE(src.ack(again->id));
  EXPECT_EQ(src.pending_count(), 0);
}

TEST_F(StreamSourceTest, NextReclaimsAStalledJobBeforeReadingNewOnes) {
  auto c = make_client();
  StreamSource src(*c, opts(100ms, 5));
  src.ensure_group();
  src.add({{"n", "1"}});
  ASSERT_TRUE(src.next("a"));
  std::this_thread::sleep_for(200ms);
  src.add({{"n", "2"}});
  auto j = src.next("b");
  ASSERT_TRUE(j);
  EXPECT_TRUE(j->reclaimed);
  EXPECT_EQ(j->field("n"), "1");
}

TEST_F(StreamSourceTest, JobGoesToDeadLetterAfterMaxAttemptsWithTheLastError) {
  auto c = make_client();
  StreamSource src(*c, opts(50ms, 3));
  src.ensure_group();
  const auto id = src.add({{"chunk", "9"}});

  auto j = src.next("w");
  ASSERT_TRUE(j);
  EXPECT_FALSE(src.fail(*j, "card declined (attempt 1)"));
  for (int attempt = 2; attempt <= 3; ++attempt) {
    std::this_thread::sleep_for(100ms);
    j = src.reclaim("w");
    ASSERT_TRUE(j) << "attempt " << attempt;
    EXPECT_EQ(j->deliveries, attempt);
    bool dead = src.fail(*j, "card declined (attempt " + std::to_string(attempt) + ")");
    EXPECT_EQ(dead, attempt == 3);
  }
  EXPECT_EQ(src.pending_count(), 0);
  EXPECT_EQ(src.length(src.dead_letter_stream()), 1);
  auto r = c->exec(Command{"XRANGE", src.dead_letter_stream(), "-", "+"});
  ASSERT_EQ(r.elements.size(), 1u);
  const auto& f = r.elements[0].elements[1].elements;
  std::map<std::string, std::string> m;
  for (std::size_t i = 0; i + 1 < f.size(); i += 2) m[f[i].str] = f[i + 1].str;
  EXPECT_EQ(m["source_id"], id);
  EXPECT_EQ(m["attempts"], "3");
  EXPECT_EQ(m["last_error"], "card declined (attempt 3)");
  EXPECT_EQ(m["chunk"], "9");
}

TEST_F(StreamSourceTest, ARetriedDeadLetterIsDeliveredAgainWithItsFieldsAndLeavesTheDeadLetters) {
  auto c = make_client();
  StreamSource src(*c, opts(50ms, 1));
  src.ensure_group();
  const auto id = src.add({{"chunk", "9"}, {"attempts", "job's own field"}});
  auto j = src.next("w");
  ASSERT_TRUE(j);
  ASSERT_TRUE(src.fail(*j, "card declined"));
  const auto dead = src.dead_letters(10);
  ASSERT_EQ(dead.size(), 1u);
  const auto one = src.dead_letter_entry(dead[0].id);
  ASSERT_TRUE(one);
  EXPECT_EQ(one->source_id, id);
  EXPECT_EQ(one->last_error, "card declined");
  EXPECT_FALSE(src.dead_letter_entry("1-1"));

  const auto again = src.retry_dead_letter(dead[0].id);
  ASSERT_TRUE(again);
  EXPECT_NE(*again, id);
  EXPECT_EQ(src.length(src.dead_letter_stream()), 0);
  EXPECT_FALSE(src.retry_dead_letter(dead[0].id)) << "a dead letter is retried once";
  j = src.next("w");
  ASSERT_TRUE(j);
  EXPECT_EQ(j->id, *again);
  EXPECT_EQ(j->fields, (std::vector<std::pair<std::string, std::string>>{{"chunk", "9"}, {"attempts", "job's own field"}}));
  EXPECT_EQ(j->deliveries, 1);
}

TEST_F(StreamSourceTest, JobThatKeepsStallingItsConsumersIsDeadLettered) {
  auto c = make_client();
  StreamSource src(*c, opts(50ms, 2));
  src.ensure_group();
  src.add({{"chunk", "3"}});
  ASSERT_TRUE(src.next("w1"));
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(src.reclaim("w2"));  // delivery 2, stalls again
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(src.reclaim("w3"));  // delivery 3 > max: dead-lettered instead
  EXPECT_EQ(src.pending_count(), 0);
  EXPECT_EQ(src.length(src.dead_letter_stream()), 1);
}

namespace {
// async_ack_gathered for every id, all started in one turn of the client's
// loop; waits for them all. Returns how many threw.
int ack_gathered_in_one_turn(jobguard::redis::Client& c, StreamSource& src, const std::vector<std::string>& ids) {
  auto left = std::make_shared<std::atomic<int>>(static_cast<int>(ids.size()));
  auto threw = std::make_shared<std::atomic<int>>(0);
  auto all = std::make_shared<std::promise<void>>();
  boost::asio::post(c.context(), [&] {
    for (const auto& id : ids)
      boost::asio::co_spawn(c.get_executor(), src.async_ack_gathered(id), [left, threw, all](std::exception_ptr e) {
        if (e) ++*threw;
        if (left->fetch_sub(1) == 1) all->set_value();
      });
  });
  all->get_future().wait();
  return threw->load();
}

std::string xack_calls(const std::string& commandstats) {
  const auto at = commandstats.find("cmdstat_xack:calls=");
  if (at == std::string::npos) return "0";
  const auto from = at + std::string("cmdstat_xack:calls=").size();
  return commandstats.substr(from, commandstats.find(',', from) - from);
}
}  // namespace

// A job its consumer holds but has not started (it waits for a limit):
// touched, it is not stalled for claim_idle more and its delivery count does
// not move; once another consumer took it over, a touch is false and leaves
// it with that one.
TEST_F(StreamSourceTest, ATouchedJobIsNotReclaimedAndATakenOverOneIsNotTakenBack) {
  auto c = make_client();
  StreamSource src(*c, opts(1000ms, 5));
  src.ensure_group();
  src.add({{"n", "1"}});
  const auto job = src.next("waiter");
  ASSERT_TRUE(job);
  const auto touch = [&](const std::string& consumer) {
    return boost::asio::co_spawn(c->get_executor(), src.async_touch(consumer, job->id), boost::asio::use_future).get();
  };
  // Touched every 100 ms for two seconds: never idle for claim_idle.
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(touch("waiter"));
    EXPECT_FALSE(src.reclaim("other")) << "a touched job was reclaimed";
  }
  EXPECT_EQ(src.deliveries(job->id), 1);
  std::this_thread::sleep_for(1200ms);
  ASSERT_TRUE(src.reclaim("other"));
  EXPECT_FALSE(touch("waiter"));
  EXPECT_EQ(admin(fmt::format("XPENDING {} workers - + 10 other", key("jobs"))), "(array of 1)");
  EXPECT_EQ(admin(fmt::format("XPENDING {} workers - + 10 waiter", key("jobs"))), "(array of 0)");
  EXPECT_TRUE(src.ack(job->id));
  EXPECT_FALSE(touch("other")) << "an acknowledged job is nobody's";
}

TEST_F(StreamSourceTest, AcksOfOneTurnLeaveAsOneXackThatAcknowledgesEveryJob) {
  auto c = make_client();
  StreamSource src(*c, opts(10s, 5));
  src.ensure_group();
  std::vector<std::string> ids;
  for (int i = 0; i < 20; ++i) {
    src.add({{"n", std::to_string(i)}});
    auto j = src.next("w");
    ASSERT_TRUE(j);
    ids.push_back(j->id);
  }
  ASSERT_EQ(src.pending_count(), 20);
  ASSERT_EQ(admin("CONFIG RESETSTAT"), "OK");
  EXPECT_EQ(ack_gathered_in_one_turn(*c, src, ids), 0);
  EXPECT_EQ(xack_calls(admin("INFO commandstats")), "1");
  EXPECT_EQ(src.pending_count(), 0);
  for (const auto& id : ids) EXPECT_FALSE(src.ack(id)) << id << " was acknowledged already";
}

TEST_F(StreamSourceTest, AGatheredAckWhoseBatchFailsIsRetriedAloneAndReportsItsOwnError) {
  auto c = make_client();
  StreamSource src(*c, opts(10s, 5));
  src.ensure_group();
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(src.add({{"n", std::to_string(i)}}));
  // The key is no stream any more: the batch's XACK fails, then each id is
  // acknowledged alone and fails with the server's error, as an ack alone
  // always did: three errors for three callers, none swallowed.
  ASSERT_EQ(admin("DEL " + key("jobs")), "1");
  ASSERT_EQ(admin("SET " + key("jobs") + " text"), "OK");
  ASSERT_EQ(admin("CONFIG RESETSTAT"), "OK");
  EXPECT_EQ(ack_gathered_in_one_turn(*c, src, ids), 3);
  EXPECT_EQ(xack_calls(admin("INFO commandstats")), "4") << "one batch, then each id alone";
}

TEST_F(StreamSourceTest, BadOptionsAreRejectedWithTheirName) {
  auto c = make_client();
  auto o = opts(100ms, 3);
  o.block = 2s;
  try {
    StreamSource s(*c, o);
    FAIL() << "accepted block of 2s";
  } catch (const jobguard::Error& e) {
    EXPECT_NE(std::string(e.what()).find("block"), std::string::npos) << e.what();
  }
  o = opts(100ms, 0);
  EXPECT_THROW(StreamSource(*c, o), jobguard::Error);
}

}  // namespace
