// Unique jobs (job/unique.hpp) against a real redis-server: each strategy's
// lock from enqueue to the phase that releases it, the conflict choices, the
// lock held by its own job only, and the reaper freeing orphans.
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/guard/completion.hpp"
#include "jobguard/guard/idempotency.hpp"
#include "jobguard/job/runner.hpp"
#include "jobguard/job/unique.hpp"
#include "jobguard/job/worker.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
namespace asio = boost::asio;
using Result = job::UniqueAdd::Result;

namespace {

asio::awaitable<void> sleep_for(std::chrono::milliseconds d) {
  asio::steady_timer t(co_await asio::this_coro::executor, d);
  co_await t.async_wait(asio::use_awaitable);
}

class UniqueJobsTest : public test::RedisTest {
 protected:
  void SetUp() override {
    RedisTest::SetUp();
    client = make_client();
    leases = LeaseScheduler::create(LockService::create(*client, KeyBuilder(key("lk"))));
    done.emplace(*client, guard::RedisCompletionOptions{.prefix = key("done:")});
    idem.emplace(*client, guard::IdempotencyOptions{.prefix = key("idem:")});
    stream.stream = key("jobs");
    stream.claim_idle = 400ms;
    stream.max_attempts = 2;
    stream.block = 50ms;
    source.emplace(*client, stream);
    source->ensure_group();
    runner.emplace(leases, job::LockClass{.name = "uniq",
                                          .key_pattern = "unit:{id}",
                                          .consequence = job::Consequence::moderate,
                                          .ttl = 5s,
                                          .owner = "tests",
                                          .protects = "a counter per unit"},
                   job::RunnerBackends{.completions = &*done, .idempotency = &*idem});
  }
  job::UniqueAdd add(const std::string& id, job::UniqueOptions u) {
    return source->add_unique({{"id", id}, {"run", "r-" + std::to_string(++adds)}}, u);
  }
  std::string holder(const std::string& lock) {
    const auto v = admin("GET " + lock);
    return v == "(nil)" ? "" : v;
  }
  job::WorkerStats work(job::AsyncJobEffect effect, job::WorkerOptions wo) {
    job::StreamWorker worker(*client, stream, *runner, std::move(effect), std::move(wo));
    worker.run();
    return worker.stats();
  }

  std::unique_ptr<redis::Client> client;
  std::shared_ptr<LeaseScheduler> leases;
  std::optional<guard::RedisCompletionStore> done;
  std::optional<guard::RedisIdempotencyStore> idem;
  job::StreamOptions stream;
  std::optional<job::StreamSource> source;
  std::optional<job::GuardedRunner> runner;
  int adds = 0;
};

const job::AsyncJobEffect quick = [](job::WorkItem&) -> asio::awaitable<std::string> { co_return ""; };

TEST_F(UniqueJobsTest, UntilExecutedHoldsUntilTheJobIsDoneThenAcceptsTheNext) {
  const job::UniqueOptions u{.strategy = job::UniqueStrategy::until_executed};
  const auto first = add("48291", u);
  ASSERT_EQ(first.result, Result::added);
  EXPECT_EQ(first.lock_key, job::unique_lock_key(stream.stream, "48291"));
  EXPECT_EQ(holder(first.lock_key), first.id) << "the lock is held by the job's own entry id";
  for (int i = 0; i < 3; ++i) {
    const auto again = add("48291", u);
    EXPECT_EQ(again.result, Result::conflict);
    EXPECT_EQ(again.holder, first.id);
    EXPECT_EQ(again.holder_state, "waiting");
    EXPECT_TRUE(again.id.empty());
  }
  EXPECT_EQ(admin("XLEN " + stream.stream), "1");
  EXPECT_EQ(add("other", u).result, Result::added) << "another value is another lock";

  const auto st = work(quick, {.max_jobs = 2, .exit_when_idle = 3s});
  EXPECT_EQ(st.completed, 2);
  EXPECT_EQ(st.unique_released, 2);
  EXPECT_EQ(holder(first.lock_key), "") << "released when the job left the queue";
  EXPECT_EQ(admin("SCARD " + job::unique_registry_key(stream.stream)), "0");
  EXPECT_EQ(add("48291", u).result, Result::added);
}

TEST_F(UniqueJobsTest, UntilExecutedKeepsItsLockThroughAFailedAttemptAndFreesItWhenDeadLettered) {
  const auto first = add("poison", {.strategy = job::UniqueStrategy::until_executed});
  std::atomic<int> attempts{0};
  job::AsyncJobEffect fails = [&](job::WorkItem&) -> asio::awaitable<std::string> {
    ++attempts;
    throw std::runtime_error("exit status 3");
    co_return "";
  };
  job::WorkerOptions wo{.max_jobs = 1, .exit_when_idle = 3s};
  std::atomic<bool> held_between{false};
  wo.on_job = [&](const job::JobReport& r) {
    // After the first (failed, retried) attempt the job is still queued:
    // its lock must still be its own.
    if (!r.dead_lettered) held_between = holder(first.lock_key) == first.id;
  };
  const auto st = work(fails, wo);
  EXPECT_EQ(attempts.load(), 2);
  EXPECT_TRUE(held_between.load());
  EXPECT_EQ(st.dead_lettered, 1);
  EXPECT_EQ(st.unique_released, 1);
  EXPECT_EQ(holder(first.lock_key), "") << "a dead-lettered job no longer blocks its value";
}

TEST_F(UniqueJobsTest, UntilAndWhileExecutingAcceptsACopyOnceTheRunStartsAndRunsStayOnePerUnit) {
  const job::UniqueOptions u{.strategy = job::UniqueStrategy::until_and_while_executing};
  const auto first = add("7", u);
  ASSERT_EQ(first.result, Result::added);
  std::atomic<int> inside{0}, most{0}, runs{0};
  std::atomic<bool> second_added{false};
  job::AsyncJobEffect slow = [&](job::WorkItem&) -> asio::awaitable<std::string> {
    most = std::max(most.load(), ++inside);
    ++runs;
    if (runs == 1) {
      // The copy is accepted while the first runs (its lock was given up at
      // the grant), and must wait for this run, not overlap it: this run
      // outlasts claim_idle, so the copy is delivered meanwhile.
      for (int i = 0; i < 300 && !second_added; ++i) co_await sleep_for(10ms);
      co_await sleep_for(600ms);
    }
    --inside;
    co_return "";
  };
  std::thread producer([&] {
    // Blocking calls stay off the worker's event loop.
    for (int i = 0; i < 300 && !second_added; ++i) {
      if (runs.load() >= 1 && add("7", u).result == Result::added) second_added = true;
      else std::this_thread::sleep_for(10ms);
    }
  });
  const auto st = work(slow, {.concurrency = 4, .max_jobs = 2, .exit_when_idle = 3s});
  producer.join();
  EXPECT_TRUE(second_added.load());
  EXPECT_EQ(runs.load(), 2);
  EXPECT_EQ(most.load(), 1) << "two runs of one unit overlapped";
  EXPECT_EQ(st.completed, 2);
  EXPECT_EQ(st.dead_lettered, 0);
  EXPECT_EQ(holder(first.lock_key), "");
}

TEST_F(UniqueJobsTest, UntilExpiredHoldsForItsTtlWhateverTheJobDid) {
  const job::UniqueOptions u{.strategy = job::UniqueStrategy::until_expired, .unique_for = 1500ms};
  const auto first = add("report", u);
  ASSERT_EQ(first.result, Result::added);
  const auto st = work(quick, {.max_jobs = 1, .exit_when_idle = 3s});
  EXPECT_EQ(st.completed, 1);
  EXPECT_EQ(st.unique_released, 0);
  const auto again = add("report", u);
  EXPECT_EQ(again.result, Result::conflict) << "done, but still inside --unique-for";
  EXPECT_EQ(again.holder_state, "gone");
  EXPECT_TRUE(test::eventually([&] { return add("report", u).result == Result::added; }, 5s));
}

TEST_F(UniqueJobsTest, WhileExecutingRejectsACopyDeliveredWhileItsUnitRunsAndLogDropsIt) {
  for (const auto conflict : {job::UniqueConflict::reject, job::UniqueConflict::log}) {
    SCOPED_TRACE(std::string(job::to_string(conflict)));
    const job::UniqueOptions u{.strategy = job::UniqueStrategy::while_executing, .on_conflict = conflict};
    const std::string unit = std::string("w-") + std::string(job::to_string(conflict));
    EXPECT_EQ(add(unit, u).result, Result::added);
    EXPECT_EQ(add(unit, u).result, Result::added) << "nothing is held at enqueue";
    std::atomic<int> runs{0};
    job::AsyncJobEffect slow = [&](job::WorkItem&) -> asio::awaitable<std::string> {
      ++runs;
      co_await sleep_for(300ms);
      co_return "";
    };
    const auto before = admin("XLEN " + source->dead_letter_stream());
    const auto st = work(slow, {.concurrency = 2, .max_jobs = 2, .exit_when_idle = 3s});
    EXPECT_EQ(runs.load(), 1);
    EXPECT_EQ(st.unique_conflicts, 1);
    EXPECT_EQ(st.completed, 1);
    if (conflict == job::UniqueConflict::reject) {
      EXPECT_EQ(st.dead_lettered, 1);
      const auto letters = source->dead_letters(1);
      ASSERT_EQ(letters.size(), 1u);
      EXPECT_NE(letters[0].last_error.find("while-executing"), std::string::npos) << letters[0].last_error;
    } else {
      EXPECT_EQ(st.skipped, 1);
      EXPECT_EQ(admin("XLEN " + source->dead_letter_stream()), before);
    }
  }
}

TEST_F(UniqueJobsTest, ReplaceDeletesAHolderNotYetDeliveredAndRejectsOneThatWas) {
  const job::UniqueOptions u{.strategy = job::UniqueStrategy::until_executed,
                             .on_conflict = job::UniqueConflict::replace};
  const auto first = add("9", u);
  const auto second = add("9", u);
  ASSERT_EQ(second.result, Result::replaced);
  EXPECT_EQ(second.holder, first.id);
  EXPECT_EQ(holder(second.lock_key), second.id);
  EXPECT_EQ(admin("XLEN " + stream.stream), "1") << "the replaced entry was deleted";
  // Delivered (a consumer has it): it may be running, so it stays.
  admin("XREADGROUP GROUP " + stream.group + " someone COUNT 1 STREAMS " + stream.stream + " >");
  const auto third = add("9", u);
  EXPECT_EQ(third.result, Result::conflict);
  EXPECT_EQ(third.holder_state, "delivered");
}

TEST_F(UniqueJobsTest, TheReaperFreesALockWhoseJobLeftWithoutReleasingItAndAnEnqueueTakesOneOver) {
  const job::UniqueOptions u{.strategy = job::UniqueStrategy::until_executed};
  const auto a = add("a", u);
  const auto b = add("b", u);
  // A worker killed between its XACK and the release: both acknowledged,
  // both locks left behind.
  admin("XREADGROUP GROUP " + stream.group + " killed COUNT 2 STREAMS " + stream.stream + " >");
  admin("XACK " + stream.stream + " " + stream.group + " " + a.id + " " + b.id);
  const auto taken = add("a", u);
  EXPECT_EQ(taken.result, Result::added) << "an orphan does not block an enqueue";
  EXPECT_EQ(taken.holder, a.id);
  EXPECT_EQ(taken.holder_state, "gone");
  // "b" is freed by the worker's reaper when it starts; "a"'s new job runs.
  const auto st = work(quick, {.max_jobs = 1, .exit_when_idle = 3s});
  EXPECT_EQ(st.unique_reaped, 1);
  EXPECT_EQ(holder(b.lock_key), "");
  EXPECT_EQ(st.unique_released, 1);
  EXPECT_EQ(admin("SCARD " + job::unique_registry_key(stream.stream)), "0");
  EXPECT_TRUE(source->reap_unique().empty()) << "nothing left to reap";
}

TEST_F(UniqueJobsTest, ALockTakenOverSinceIsNotReleasedByTheJobThatLostIt) {
  const job::UniqueOptions u{.strategy = job::UniqueStrategy::until_executed,
                             .on_conflict = job::UniqueConflict::replace};
  const auto first = add("z", u);
  // Another (live) job took the value over, here by hand; the first one's
  // finish must leave it alone.
  const std::string other = source->add({{"id", "not-z"}, {"run", "r"}});
  admin("SET " + first.lock_key + " " + other);
  const auto st = work(quick, {.max_jobs = 2, .exit_when_idle = 3s});
  EXPECT_EQ(st.completed, 2);
  EXPECT_EQ(st.unique_released, 0);
  EXPECT_EQ(holder(first.lock_key), other);
}

TEST_F(UniqueJobsTest, OptionsThatDoNotFitTheStrategyAreRefusedByName) {
  auto refused = [&](job::UniqueOptions u, const std::string& words) {
    try {
      add("x", u);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::invalid_argument));
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused({.strategy = job::UniqueStrategy::until_expired}, "until-expired needs unique_for");
  refused({.strategy = job::UniqueStrategy::while_executing, .unique_for = 1s}, "while-executing takes no unique_for");
  refused({.strategy = job::UniqueStrategy::while_executing, .on_conflict = job::UniqueConflict::replace},
          "cannot replace");
  refused({.strategy = job::UniqueStrategy::until_executed, .by = {"customer"}}, "no field \"customer\"");
  EXPECT_EQ(admin("XLEN " + stream.stream), "0");
}

TEST(UniqueKeys, ShareTheStreamsClusterSlot) {
  EXPECT_EQ(job::unique_lock_key("jobs", "7"), "{jobs}:unique:7");
  EXPECT_EQ(job::unique_registry_key("jobs"), "{jobs}:unique");
  EXPECT_EQ(job::unique_lock_key("{q}:jobs", "7"), "{q}:jobs:unique:7") << "the stream's own tag is kept";
  EXPECT_EQ(job::unique_lock_key("a{}b", "7"), "{a{}b}:unique:7") << "an empty tag is no tag";
  EXPECT_EQ(job::parse_unique_strategy("until-and-while-executing"), job::UniqueStrategy::until_and_while_executing);
  EXPECT_FALSE(job::parse_unique_strategy("until_executed").has_value());
  EXPECT_EQ(job::parse_unique_conflict("log"), job::UniqueConflict::log);
}

}  // namespace
