// job::StreamWorker against a real redis-server: many jobs in flight on one
// event loop, each unit's effect done once, a slow job holding only its own
// slot, blocking effects on the worker's threads, and the action table
// carried out on the stream (ack, dead letter, left pending). In the
// ThreadSanitizer run: jobs, the reader, the pool and stop() cross threads.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "jobguard/guard/completion.hpp"
#include "jobguard/guard/idempotency.hpp"
#include "jobguard/job/runner.hpp"
#include "jobguard/job/worker.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/semaphore.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
namespace asio = boost::asio;

namespace {

asio::awaitable<void> sleep_for(std::chrono::milliseconds d) {
  asio::steady_timer t(co_await asio::this_coro::executor, d);
  co_await t.async_wait(asio::use_awaitable);
}

class StreamWorkerTest : public test::RedisTest {
 protected:
  void SetUp() override {
    RedisTest::SetUp();
    client = make_client();
    leases = LeaseScheduler::create(LockService::create(*client, KeyBuilder(key("lk"))));
    done.emplace(*client, guard::RedisCompletionOptions{.prefix = key("done:")});
    idem.emplace(*client, guard::IdempotencyOptions{.prefix = key("idem:")});
    stream.stream = key("jobs");
    stream.claim_idle = 500ms;
    stream.max_attempts = 2;
    stream.block = 50ms;
  }
  job::LockClass cls(std::string name, bool long_running = false) const {
    return job::LockClass{.name = std::move(name),
                          .key_pattern = "unit:{id}",
                          .consequence = job::Consequence::moderate,
                          .ttl = long_running ? 300ms : 5s,
                          .long_running = long_running,
                          .hard_timeout = long_running ? 30s : 0s,
                          .owner = "tests",
                          .protects = "a counter per unit"};
  }
  job::RunnerBackends backends() { return {.completions = &*done, .idempotency = &*idem}; }
  void add(job::StreamSource& s, const std::string& id, const std::string& run = "r") {
    s.add({{"id", id}, {"run", run}});
  }

  std::unique_ptr<redis::Client> client;
  std::shared_ptr<LeaseScheduler> leases;
  std::optional<guard::RedisCompletionStore> done;
  std::optional<guard::RedisIdempotencyStore> idem;
  job::StreamOptions stream;
};

TEST_F(StreamWorkerTest, ManyJobsInFlightOnOneLoopRunEachUnitsEffectOnce) {
  job::GuardedRunner runner(leases, cls("w-conc"), backends());
  job::StreamSource producer(*client, stream);
  producer.ensure_group();
  constexpr int kUnits = 60, kCopies = 3;  // every unit delivered three times
  for (int c = 0; c < kCopies; ++c)
    for (int u = 0; u < kUnits; ++u) add(producer, std::to_string(u));

  std::mutex mu;
  std::map<std::string, int> runs;
  std::set<std::thread::id> threads;
  int inside = 0, most_inside = 0;
  job::AsyncJobEffect effect = [&](job::WorkItem& item) -> asio::awaitable<std::string> {
    const std::string id = item.context().unit().id;
    {
      std::lock_guard lk(mu);
      ++runs[id];
      threads.insert(std::this_thread::get_id());
      most_inside = std::max(most_inside, ++inside);
    }
    co_await sleep_for(5ms);
    {
      std::lock_guard lk(mu);
      --inside;
    }
    co_return "ok-" + id;
  };
  job::StreamWorker worker(*client, stream, runner, effect,
                           {.concurrency = 32, .max_jobs = kUnits * kCopies, .exit_when_idle = 3s});
  admin("CONFIG RESETSTAT");
  worker.run();
  // A unit's first claim is no script (SET NX PX and EXISTS: composed.hpp's
  // plain form); a copy's claim is granted the same way and finds the record,
  // and its grant is given back by one release call. The finishes of jobs in
  // flight together went as batches (src/job/fused.hpp). So the server ran
  // fewer scripts than the 120 releases and 60 finishes one by one would make.
  const std::string cmdstats = admin("INFO commandstats");
  auto stat = [&](const std::string& name, const std::string& field) -> std::int64_t {
    const auto line = cmdstats.find("cmdstat_" + name + ":");
    if (line == std::string::npos) return 0;
    const auto at = cmdstats.find(field + "=", line);
    return at == std::string::npos ? 0 : std::stoll(cmdstats.substr(at + field.size() + 1));
  };
  // NOSCRIPT answers (a script's first calls) are sent again as EVAL: not runs.
  const std::int64_t script_runs =
      stat("evalsha", "calls") - stat("evalsha", "failed_calls") + stat("eval", "calls");
  EXPECT_GT(script_runs, 0) << cmdstats;
  EXPECT_LT(script_runs, 180) << "finishes went one script call each: " << cmdstats;

  const auto st = worker.stats();
  EXPECT_EQ(st.finished(), kUnits * kCopies);
  EXPECT_EQ(st.completed + st.skipped, kUnits * kCopies);
  EXPECT_EQ(st.completed, kUnits);  // the copies found the completion record
  EXPECT_EQ(st.dead_lettered, 0);
  std::lock_guard lk(mu);
  ASSERT_EQ(runs.size(), static_cast<std::size_t>(kUnits));
  for (const auto& [id, n] : runs) EXPECT_EQ(n, 1) << "unit " << id;
  EXPECT_GT(most_inside, 1) << "jobs ran one at a time";
  EXPECT_EQ(threads.size(), 1u) << "async effects run on the one event loop";
  EXPECT_EQ(producer.pending_count(), 0);
  // A copy that found its twin still running was not charged for it: under
  // load such a copy can be delivered more than max_attempts (2) times.
  EXPECT_EQ(admin("XLEN " + producer.dead_letter_stream()), "0");
}

// A job whose unit another holder keeps longer than claim_idle is delivered
// again and again, finding the lock held each time; none of those deliveries
// is charged, so it is not dead-lettered as stalled, and it completes once
// the holder lets go.
TEST_F(StreamWorkerTest, DeliveriesThatFindTheUnitHeldAreNotChargedToTheJob) {
  job::GuardedRunner runner(leases, cls("w-held"), backends());
  job::StreamSource producer(*client, stream);
  producer.ensure_group();
  // Another holder's key, expiring by itself after four claim_idles.
  admin("SET " + runner.lock_key_for("held") + " someone-else PX 2000");
  add(producer, "held");
  std::atomic<int> ran{0};
  job::AsyncJobEffect effect = [&](job::WorkItem&) -> asio::awaitable<std::string> {
    ++ran;
    co_return "";
  };
  job::StreamWorker worker(*client, stream, runner, effect, {.max_jobs = 1, .exit_when_idle = 5s});
  worker.run();
  const auto st = worker.stats();
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(st.completed, 1);
  EXPECT_EQ(st.dead_lettered, 0);
  EXPECT_GT(st.left_pending, static_cast<std::int64_t>(stream.max_attempts))
      << "the job was not delivered more often than max_attempts while held";
  EXPECT_EQ(admin("XLEN " + producer.dead_letter_stream()), "0");
  EXPECT_EQ(producer.pending_count(), 0);
}

// A job whose consumer died max_attempts times is dead-lettered by the
// reclaim scan, not run: the worker counts it (toward max_jobs too, or a
// worker told to take one job would wait for ever) and reports it.
TEST_F(StreamWorkerTest, StalledJobsDeadLetteredByTheReclaimScanAreCounted) {
  job::GuardedRunner runner(leases, cls("w-stalled"), backends());
  job::StreamSource producer(*client, stream);
  producer.ensure_group();
  const std::string id = producer.add({{"id", "stalled"}, {"run", "r"}});
  // Delivered to a consumer that died, as often as max_attempts allows.
  admin("XREADGROUP GROUP " + stream.group + " ghost COUNT 1 STREAMS " + stream.stream + " >");
  admin("XCLAIM " + stream.stream + " " + stream.group + " ghost 0 " + id + " RETRYCOUNT " +
        std::to_string(stream.max_attempts) + " IDLE 60000 JUSTID");
  std::vector<job::JobReport> reports;
  job::AsyncJobEffect effect = [&](job::WorkItem&) -> asio::awaitable<std::string> { co_return ""; };
  job::StreamWorker worker(*client, stream, runner, effect, {.max_jobs = 1, .exit_when_idle = 3s});
  worker.run();
  const auto st = worker.stats();
  EXPECT_EQ(st.jobs, 0) << "a stalled job past max_attempts was run";
  EXPECT_EQ(st.dead_lettered, 1);
  EXPECT_EQ(st.failed, 1);
  EXPECT_EQ(st.finished(), 1);
  const auto letters = producer.dead_letters(10);
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(letters[0].last_error, "stalled: not acknowledged after 2 deliveries");
  EXPECT_EQ(producer.pending_count(), 0);
}

// At concurrency 1 the slot is free once the effect is over: the next job's
// claim goes out with this job's finish, before this job's XACK (which waits
// for the finish's reply). That is an order of commands at the server, which
// the worker fixes; it is read from MONITOR. The order in which replies
// resume the jobs (the next effect against this job's report) is a race
// between round trips and the loop's own hops, and is not asserted: it failed
// CI twice, once under each sanitizer.
TEST_F(StreamWorkerTest, AtConcurrencyOneEffectsNeverOverlapAndTheNextClaimGoesBeforeTheAck) {
  job::GuardedRunner runner(leases, cls("w-one"), backends());
  job::StreamSource producer(*client, stream);
  producer.ensure_group();
  std::vector<std::string> entry;
  for (int u = 0; u < 3; ++u) entry.push_back(producer.add({{"id", "one-" + std::to_string(u)}, {"run", "r"}}));
  std::mutex mu;
  std::vector<std::string> events;
  int inside = 0, most_inside = 0;
  job::AsyncJobEffect effect = [&](job::WorkItem& item) -> asio::awaitable<std::string> {
    {
      std::lock_guard lk(mu);
      events.push_back("effect " + item.context().unit().id);
      most_inside = std::max(most_inside, ++inside);
    }
    co_await sleep_for(1ms);
    {
      std::lock_guard lk(mu);
      --inside;
    }
    co_return "ok";
  };
  job::WorkerOptions wo{.concurrency = 1, .max_jobs = 3, .exit_when_idle = 3s};
  wo.on_job = [&](const job::JobReport& r) {
    std::lock_guard lk(mu);
    events.push_back("report " + (r.unit ? r.unit->id : std::string("?")));
  };
  test::RedisMonitor monitor(server->host(), server->port());
  job::StreamWorker worker(*client, stream, runner, effect, wo);
  worker.run();
  EXPECT_EQ(worker.stats().completed, 3);
  {
    std::lock_guard lk(mu);
    EXPECT_EQ(most_inside, 1) << "concurrency 1 ran two effects at once";
    ASSERT_EQ(events.size(), 6u);
    auto at = [&](const std::string& e) {
      return static_cast<std::size_t>(std::find(events.begin(), events.end(), e) - events.begin());
    };
    for (int u = 0; u < 3; ++u) {
      const std::string id = "one-" + std::to_string(u);
      ASSERT_LT(at("effect " + id), events.size()) << id;
      ASSERT_LT(at("report " + id), events.size()) << id;
      EXPECT_LT(at("effect " + id), at("report " + id)) << id;
      if (u > 0) {
        const std::string before = "one-" + std::to_string(u - 1);
        EXPECT_LT(at("effect " + before), at("effect " + id)) << id;
        EXPECT_LT(at("report " + before), at("report " + id)) << id;
      }
    }
  }
  EXPECT_EQ(producer.pending_count(), 0);

  // The server's order. one-1 came in the worker's first read, with one-0,
  // so it is waiting when one-0's effect ends: its claim (the first command
  // the client sends that names one-1's keys: lock, record or idempotency
  // key) must reach the server before one-0's XACK. (one-2 comes in a later
  // read, which may land after one-1's finish; its claim's place is a race
  // and is not asserted.)
  const std::string first_entry = "\"" + entry[0] + "\"";
  auto is_ack_of_first = [&](const std::string& l) {
    return l.find("\"XACK\"") != std::string::npos && l.find(first_entry) != std::string::npos;
  };
  const auto& lines = monitor.read_until(is_ack_of_first);
  auto first = [&](auto pred) {
    return static_cast<std::size_t>(std::find_if(lines.begin(), lines.end(), pred) - lines.begin());
  };
  const std::size_t ack = first(is_ack_of_first);
  const std::size_t claim = first([](const std::string& l) {
    const bool from_client = l.find(" lua]") == std::string::npos;
    return from_client && (l.find("unit:one-1") != std::string::npos || l.find("unit%3Aone-1") != std::string::npos);
  });
  std::string seen;
  for (const auto& l : lines) seen += l.substr(0, 200) + "\n";
  ASSERT_LT(ack, lines.size()) << "no XACK of one-0 in MONITOR:\n" << seen;
  EXPECT_LT(claim, ack) << "one-1's claim waited for one-0's ack:\n" << seen;
}

TEST_F(StreamWorkerTest, ASlowJobHoldsOnlyItsSlotAndItsLeaseIsRenewed) {
  job::GuardedRunner runner(leases, cls("w-slow", /*long_running=*/true), backends());
  job::StreamSource producer(*client, stream);
  producer.ensure_group();
  add(producer, "slow");
  constexpr int kQuick = 40;
  for (int u = 0; u < kQuick; ++u) add(producer, "q" + std::to_string(u));

  std::atomic<int> quick_done{0};
  std::atomic<int> quick_done_when_slow_ended{-1};
  std::atomic<std::uint64_t> slow_renewals{0};
  job::AsyncJobEffect effect = [&](job::WorkItem& item) -> asio::awaitable<std::string> {
    if (item.context().unit().id == "slow") {
      // Several TTLs (300 ms): only renewals on the shared loop keep it.
      // It ends once the quick jobs are done (or after 30 s, when they
      // waited for it), not at a fixed time a slow build may not meet.
      co_await sleep_for(1500ms);
      for (int i = 0; i < 3000 && quick_done.load() < kQuick; ++i) co_await sleep_for(10ms);
      item.context().ensure();
      quick_done_when_slow_ended = quick_done.load();
      co_return "slow";
    }
    co_await sleep_for(2ms);
    ++quick_done;
    co_return "quick";
  };
  job::StreamWorker worker(*client, stream, runner, effect,
                           {.concurrency = 4, .max_jobs = kQuick + 1, .exit_when_idle = 5s});
  worker.run();
  slow_renewals = leases->stats().renewals_sent;
  const auto st = worker.stats();
  EXPECT_EQ(st.completed, kQuick + 1) << "left pending: " << st.left_pending << ", failed: " << st.failed;
  EXPECT_EQ(quick_done_when_slow_ended.load(), kQuick) << "quick jobs waited for the slow one";
  EXPECT_GE(slow_renewals.load(), 3u);
  EXPECT_EQ(leases->stats().lost, 0u);
}

TEST_F(StreamWorkerTest, BlockingEffectsRunOnTheWorkersThreadsNotTheLoop) {
  job::GuardedRunner runner(leases, cls("w-blocking"), backends());
  job::StreamSource producer(*client, stream);
  producer.ensure_group();
  for (int u = 0; u < 12; ++u) add(producer, std::to_string(u));
  std::atomic<int> inside{0}, most_inside{0}, on_loop{0};
  job::JobEffect effect = [&](job::WorkItem& item) {
    if (client->running_in_loop_thread()) ++on_loop;
    const int now = ++inside;
    for (int m = most_inside.load(); now > m && !most_inside.compare_exchange_weak(m, now);) {
    }
    std::this_thread::sleep_for(30ms);  // blocks its pool thread only
    --inside;
    return item.job().id;
  };
  job::StreamWorker worker(*client, stream, runner, effect, {.concurrency = 4, .max_jobs = 12, .exit_when_idle = 3s});
  worker.run();
  EXPECT_EQ(worker.stats().completed, 12);
  EXPECT_EQ(on_loop.load(), 0);
  EXPECT_GT(most_inside.load(), 1);
  EXPECT_LE(most_inside.load(), 4);
}

TEST_F(StreamWorkerTest, OutcomesBecomeActionsOnTheStream) {
  job::GuardedRunner runner(leases, cls("w-actions"), backends());
  job::StreamSource producer(*client, stream);
  producer.ensure_group();
  add(producer, "ok");
  add(producer, "fails");
  producer.add({{"name", "no id here"}});
  add(producer, "crashes");
  std::atomic<int> crashes{0};
  job::AsyncJobEffect effect = [&](job::WorkItem& item) -> asio::awaitable<std::string> {
    const auto& id = item.context().unit().id;
    if (id == "fails") throw std::runtime_error("exit status 3");
    if (id == "crashes" && crashes++ == 0) {
      // As a worker that died mid-effect: no ack, no failed attempt.
      item.leave_pending("worker killed");
      throw std::runtime_error("killed");
    }
    co_return "fine";
  };
  std::mutex mu;
  std::map<std::string, std::vector<job::Action>> actions;
  std::map<std::string, bool> dead;
  // "fails" and "crashes" come back after claim_idle (500 ms): "fails" is
  // dead-lettered at its second delivery (max_attempts 2), "crashes" then
  // completes; the job without an id is dead-lettered at once.
  job::WorkerOptions wo{.concurrency = 2, .max_jobs = 4, .exit_when_idle = 5s};
  wo.on_job = [&](const job::JobReport& r) {
    std::lock_guard lk(mu);
    const std::string id = r.unit ? r.unit->id : "(none)";
    actions[id].push_back(r.decision.action);
    dead[id] = dead[id] || r.dead_lettered;
  };
  job::StreamWorker worker(*client, stream, runner, effect, wo);
  worker.run();
  const auto st = worker.stats();
  EXPECT_EQ(st.completed, 2);
  EXPECT_EQ(st.dead_lettered, 2);
  EXPECT_EQ(st.failed, 3);  // two attempts of "fails", one malformed job
  EXPECT_EQ(st.left_pending, 1);
  std::lock_guard lk(mu);
  using A = job::Action;
  EXPECT_EQ(actions["ok"], std::vector<A>{A::ack});
  EXPECT_EQ(actions["fails"], (std::vector<A>{A::fail, A::fail}));
  EXPECT_TRUE(dead["fails"]);
  EXPECT_EQ(actions["(none)"], std::vector<A>{A::dead_letter});
  EXPECT_TRUE(dead["(none)"]);
  EXPECT_EQ(actions["crashes"], (std::vector<A>{A::leave_pending, A::ack}));
  EXPECT_FALSE(dead["crashes"]);
  const auto letters = producer.dead_letters(10);
  ASSERT_EQ(letters.size(), 2u);
  std::set<std::string> errors{letters[0].last_error, letters[1].last_error};
  EXPECT_TRUE(errors.count("exit status 3")) << letters[0].last_error << " / " << letters[1].last_error;
  EXPECT_TRUE(errors.count("job has no field \"id\"")) << letters[0].last_error << " / " << letters[1].last_error;
  EXPECT_EQ(producer.pending_count(), 0);
}

TEST_F(StreamWorkerTest, StopFromAnotherThreadReachesTheEffectsInFlight) {
  job::GuardedRunner runner(leases, cls("w-stop"), backends());
  job::StreamSource producer(*client, stream);
  producer.ensure_group();
  for (int u = 0; u < 3; ++u) add(producer, std::to_string(u));
  std::atomic<int> started{0}, saw_shutdown{0};
  job::AsyncJobEffect effect = [&](job::WorkItem& item) -> asio::awaitable<std::string> {
    ++started;
    for (int i = 0; i < 1000 && !item.shutdown().stop_requested(); ++i) co_await sleep_for(5ms);
    if (item.shutdown().stop_requested()) {
      ++saw_shutdown;
      item.leave_pending("shutdown");
      throw std::runtime_error("interrupted");
    }
    co_return "";
  };
  job::StreamWorker worker(*client, stream, runner, effect, {.concurrency = 3});
  std::thread stopper([&] {
    ASSERT_TRUE(test::eventually([&] { return started.load() == 3; }, 10s));
    worker.stop();
  });
  worker.run();  // returns once the three effects gave up
  stopper.join();
  EXPECT_EQ(saw_shutdown.load(), 3);
  EXPECT_EQ(worker.stats().left_pending, 3);
  EXPECT_EQ(producer.pending_count(), 3);
}

// While its slots are busy a worker reads as many jobs again ahead. A
// stopping worker does not start those (they would be told to shut down at
// once): they go back to the group as idle as stalled jobs, and the next
// worker's first reclaim scan takes them over instead of one claim_idle later.
TEST_F(StreamWorkerTest, ReadAheadJobsAreHandedBackOnStopAndTakenOverAtOnce) {
  stream.claim_idle = 60s;  // without the hand-back, nobody could take them for a minute
  job::GuardedRunner runner(leases, cls("w-ahead"), backends());
  job::StreamSource producer(*client, stream);
  producer.ensure_group();
  for (int u = 0; u < 6; ++u) add(producer, std::to_string(u));
  std::atomic<int> started{0};
  job::AsyncJobEffect slow = [&](job::WorkItem& item) -> asio::awaitable<std::string> {
    ++started;
    while (!item.shutdown().stop_requested()) co_await sleep_for(5ms);
    item.leave_pending("shutdown");
    throw std::runtime_error("interrupted");
  };
  job::StreamWorker first(*client, stream, runner, slow, {.consumer = "first", .concurrency = 2});
  std::thread stopper([&] {
    // Two running, two more read ahead (four delivered to "first").
    ASSERT_TRUE(test::eventually([&] { return started.load() == 2 && producer.pending_count() == 4; }, 10s));
    std::this_thread::sleep_for(100ms);
    first.stop();
  });
  first.run();
  stopper.join();
  EXPECT_EQ(started.load(), 2) << "a read-ahead job started after stop()";
  EXPECT_EQ(first.stats().jobs, 2);
  EXPECT_EQ(producer.pending_count(), 4);

  // The two read ahead are taken over at once; the two interrupted ones were
  // delivered 100 ms ago and stay with "first" until claim_idle.
  std::mutex mu;
  std::vector<std::string> second_ran;
  job::AsyncJobEffect quick = [&](job::WorkItem& item) -> asio::awaitable<std::string> {
    std::lock_guard lk(mu);
    second_ran.push_back(item.context().unit().id);
    co_return "";
  };
  job::StreamWorker second(*client, stream, runner, quick,
                           {.consumer = "second", .concurrency = 2, .max_jobs = 4, .exit_when_idle = 1500ms});
  second.run();
  std::lock_guard lk(mu);
  std::set<std::string> ran(second_ran.begin(), second_ran.end());
  EXPECT_EQ(ran, (std::set<std::string>{"2", "3", "4", "5"})) << "the handed-back pair and the two never read";
}

// Per-key concurrency (WorkerOptions::concurrency_per): the second job of a
// key waits in its slot for the permit the first holds, a job without the
// field runs beside them, and a stop while it waits leaves it pending, not
// failed; every permit is given back.
TEST_F(StreamWorkerTest, AJobWaitingForItsKeysPermitIsLeftPendingOnStopNeverFailed) {
  job::GuardedRunner runner(leases, cls("w-per"), backends());
  job::StreamSource producer(*client, stream);
  producer.ensure_group();
  producer.add({{"id", "1"}, {"customer", "a b"}});
  producer.add({{"id", "2"}, {"customer", "a b"}});
  producer.add({{"id", "3"}});
  std::mutex mu;
  std::set<std::string> started;
  job::AsyncJobEffect effect = [&](job::WorkItem& item) -> asio::awaitable<std::string> {
    const std::string id = item.context().unit().id;
    {
      std::lock_guard lk(mu);
      started.insert(id);
    }
    if (id == "3") co_return "";
    while (!item.shutdown().stop_requested()) co_await sleep_for(5ms);
    item.leave_pending("shutdown");
    throw std::runtime_error("interrupted");
  };
  job::WorkerOptions wo{.concurrency = 3};
  wo.concurrency_per = {job::parse_concurrency("customer=1")};
  job::StreamWorker worker(*client, stream, runner, effect, wo);
  const std::string resource = "concurrency:customer=a%20b";
  SemaphoreInfo during;
  std::thread stopper([&] {
    EXPECT_TRUE(test::eventually([&] {
      std::lock_guard lk(mu);
      return started == std::set<std::string>{"1", "3"};
    }, 10s));
    EXPECT_TRUE(test::eventually([&] { return inspect_semaphore(leases->service(), resource).waiters == 1; }, 10s));
    during = inspect_semaphore(leases->service(), resource);
    worker.stop();
  });
  worker.run();
  stopper.join();
  EXPECT_EQ(started, (std::set<std::string>{"1", "3"})) << "job 2 ran beside job 1";
  EXPECT_EQ(during.holders.size(), 1u);
  const auto st = worker.stats();
  EXPECT_EQ(st.failed, 0);
  EXPECT_EQ(st.completed, 1);
  EXPECT_EQ(st.left_pending, 2);
  EXPECT_EQ(st.concurrency_limited, 1);
  EXPECT_EQ(producer.pending_count(), 2);
  EXPECT_TRUE(inspect_semaphore(leases->service(), resource).holders.empty()) << "a permit was not given back";
  EXPECT_EQ(runner.metrics().concurrency_limited_total.value(), 1u);
}

// A job waiting for its rate turn is touched, so it is not reclaimed as
// stalled however long it waits past claim_idle; when another consumer takes
// it over all the same (an operator's XCLAIM here), the waiter lets it go:
// left pending with the new holder, not run, not failed.
TEST_F(StreamWorkerTest, AJobWaitingForItsTurnStaysOursAndIsLetGoWhenTakenOver) {
  job::GuardedRunner runner(leases, cls("w-turn"), backends());
  job::StreamSource producer(*client, stream);  // claim_idle 500 ms
  producer.ensure_group();
  producer.add({{"id", "1"}, {"k", "x"}});
  producer.add({{"id", "2"}, {"k", "x"}});
  std::atomic<int> ran{0};
  job::AsyncJobEffect effect = [&](job::WorkItem&) -> asio::awaitable<std::string> {
    ++ran;
    co_return "";
  };
  job::WorkerOptions wo{.consumer = "waiter", .concurrency = 2};
  wo.rates = {job::parse_rate("k=1/30s")};
  job::StreamWorker worker(*client, stream, runner, effect, wo);
  std::thread watcher([&] {
    EXPECT_TRUE(test::eventually([&] { return ran.load() == 1; }, 10s));
    // Job 2 waits 30 s for its turn; three claim_idles later it is still ours.
    std::this_thread::sleep_for(1500ms);
    const auto pending = producer.pending(10);
    EXPECT_EQ(pending.size(), 1u);
    if (pending.size() == 1) {
      EXPECT_EQ(pending[0].consumer, "waiter");
      EXPECT_EQ(pending[0].deliveries, 1) << "a touch counted a delivery";
      admin(fmt::format("XCLAIM {} {} other 0 {} JUSTID", stream.stream, stream.group, pending[0].id));
    }
    EXPECT_TRUE(test::eventually([&] { return worker.stats().left_pending == 1; }, 5s));
    worker.stop();
  });
  worker.run();
  watcher.join();
  EXPECT_EQ(ran.load(), 1);
  const auto st = worker.stats();
  EXPECT_EQ(st.failed, 0);
  EXPECT_EQ(st.completed, 1);
  EXPECT_EQ(st.left_pending, 1);
  const auto pending = producer.pending(10);
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].consumer, "other") << "the waiter took its job back";
}

TEST_F(StreamWorkerTest, BadOptionsAreRefusedByName) {
  job::GuardedRunner runner(leases, cls("w-bad"), backends());
  job::AsyncJobEffect effect = [](job::WorkItem&) -> asio::awaitable<std::string> { co_return ""; };
  try {
    job::StreamWorker w(*client, stream, runner, effect, {.concurrency = 0});
    FAIL() << "concurrency 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("concurrency 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(job::StreamWorker(*client, stream, runner, job::AsyncJobEffect{}), Error);
  job::WorkerOptions twice;
  twice.concurrency_per = {{"customer", 1}, {"customer", 2}};
  EXPECT_THROW(job::StreamWorker(*client, stream, runner, effect, twice), Error);
  job::WorkerOptions zero;
  zero.concurrency_per = {{"customer", 0}};
  EXPECT_THROW(job::StreamWorker(*client, stream, runner, effect, zero), Error);
}

}  // namespace
