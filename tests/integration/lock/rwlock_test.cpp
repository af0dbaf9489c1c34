// Read-write locks on a real server (docs/rwlock.md): readers together, a
// writer alone, a waiting writer stops new readers, a stream of readers does
// not starve a writer, fences order a writer after the readers it excluded,
// a crashed holder's place back only once its lease has expired by the
// server's clock, leases, the quarantine gate.
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <future>
#include <iostream>
#include <thread>

#include "fixtures.hpp"
#include "jobguard/async.hpp"
#include "jobguard/error.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/rwlock.hpp"

using namespace std::chrono_literals;
using jobguard::test::eventually;

namespace jobguard {
namespace {

LockOptions rw(LockMode m, std::chrono::milliseconds ttl = 10s, std::chrono::milliseconds wait = 0ms) {
  LockOptions o;
  o.mode = m;
  o.ttl = ttl;
  o.wait = wait;
  o.fence = true;
  return o;
}
LockOptions reader(std::chrono::milliseconds ttl = 10s, std::chrono::milliseconds wait = 0ms) {
  return rw(LockMode::shared, ttl, wait);
}
LockOptions writer(std::chrono::milliseconds ttl = 10s, std::chrono::milliseconds wait = 0ms) {
  return rw(LockMode::exclusive, ttl, wait);
}

class RwLockTest : public LockTest {
 protected:
  std::int64_t zcard(const std::string& key) const { return client->exec(redis::Command{"ZCARD", key}).integer; }
  std::int64_t waiting_writers(const std::string& r) const { return zcard(svc->keys().rw_writers_line_key(r)); }
  std::int64_t line(const std::string& r) const { return zcard(svc->keys().rw_line_key(r)); }
  std::int64_t server_ms() const {
    auto t = client->exec(redis::Command{"TIME"});
    return std::stoll(t.elements[0].str) * 1000 + std::stoll(t.elements[1].str) / 1000;
  }
  bool subscribed(const std::string& r, int n) const {
    return eventually([&] {
      auto s = client->exec(redis::Command{"PUBSUB", "NUMSUB", svc->keys().rw_channel(r)});
      return s.elements.size() == 2 && s.elements[1].integer >= n;
    });
  }
};

TEST_F(RwLockTest, ReadersHoldTogetherAndAWriterHoldsAlone) {
  const auto r = resource("ledger");
  std::vector<Lock> readers;
  for (int i = 0; i < 3; ++i) {
    auto l = svc->acquire(r, reader());
    ASSERT_TRUE(l) << "reader " << i;
    EXPECT_EQ(l->mode(), LockMode::shared);
    EXPECT_EQ(l->key(), svc->keys().rw_readers_key(r));
    readers.push_back(std::move(*l));
  }
  EXPECT_FALSE(svc->acquire(r, writer()));
  auto info = inspect_rwlock(*svc, r);
  EXPECT_EQ(info.readers.size(), 3u);
  EXPECT_FALSE(info.writer);
  for (auto& l : readers) EXPECT_TRUE(l.release());
  auto w = svc->acquire(r, writer());
  ASSERT_TRUE(w);
  EXPECT_EQ(w->mode(), LockMode::exclusive);
  EXPECT_EQ(w->key(), svc->keys().rw_writer_key(r));
  EXPECT_FALSE(svc->acquire(r, reader()));
  EXPECT_FALSE(svc->acquire(r, writer()));
  info = inspect_rwlock(*svc, r);
  ASSERT_TRUE(info.writer);
  EXPECT_EQ(info.writer->token, w->token());
  EXPECT_TRUE(info.readers.empty());
  EXPECT_TRUE(w->release());
  EXPECT_FALSE(w->release());
  EXPECT_TRUE(svc->acquire(r, reader()));
}

// A reader's token is long enough (over zset-max-listpack-value's default)
// that Redis keeps the readers' key as a skiplist (waiter_shell.cpp, new_token).
TEST_F(RwLockTest, TheReadersKeyIsASkiplistFromTheFirstReader) {
  const auto r = resource("encoding");
  auto l = svc->acquire(r, reader());
  ASSERT_TRUE(l);
  EXPECT_GT(l->token().size(), 64u);
  EXPECT_EQ(client->exec(redis::Command{"OBJECT", "ENCODING", svc->keys().rw_readers_key(r)}).str, "skiplist");
  EXPECT_TRUE(l->release());
}

TEST_F(RwLockTest, ListedOnceEachAndTheLongestWaitingWriterIsReported) {
  const auto read = resource("books"), write = resource("stock"), idle = resource("idle");
  auto r1 = svc->acquire(read, reader());
  auto r2 = svc->acquire(read, reader());
  auto w = svc->acquire(write, writer());
  ASSERT_TRUE(r1 && r2 && w);
  auto gone = svc->acquire(idle, reader());
  ASSERT_TRUE(gone && gone->release());  // no live holder: not listed
  EXPECT_EQ(inspect_rwlock(*svc, read).writer_waiting, 0ms);

  const std::int64_t before = server_ms();
  auto waiting = std::async(std::launch::async, [&] { return svc->acquire(read, writer(10s, 10s)); });
  ASSERT_TRUE(eventually([&] { return waiting_writers(read) == 1; }));
  auto info = inspect_rwlock(*svc, read);
  EXPECT_EQ(info.waiting_writers, 1);
  EXPECT_GE(info.writer_waiting, 0ms);
  EXPECT_LE(info.writer_waiting.count(), info.server_time_ms - before);

  const auto all = admin::list_rwlocks(*svc, {.prefix = resource("")});
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].resource, read);  // sorted
  EXPECT_EQ(all[0].readers.size(), 2u);
  EXPECT_EQ(all[0].waiting_writers, 1);
  EXPECT_EQ(all[1].resource, write);
  ASSERT_TRUE(all[1].writer);
  EXPECT_EQ(all[1].writer->token, w->token());
  EXPECT_EQ(admin::list_rwlocks(*svc, {.prefix = resource(""), .limit = 1}).size(), 1u);
  EXPECT_EQ(admin::list_rwlocks(*svc, {.prefix = resource("b")}).size(), 1u);

  EXPECT_TRUE(r1->release() && r2->release());
  auto granted = waiting.get();
  ASSERT_TRUE(granted);
  EXPECT_EQ(inspect_rwlock(*svc, read).writer_waiting, 0ms);
}

// The four numbers per class (docs/observability.md), counted for readers
// and writers as for locks.
TEST_F(RwLockTest, TheClassNumbersCountReadersAndWritersAsTheyCountLocks) {
  const auto r = resource("book");
  observe::Registry registry;  // before the client: scope-exit releases count into it from the loop
  auto c2 = make_client();
  auto svc2 = LockService::create(*c2, LockServiceOptions{.metrics = &registry});
  auto sched2 = LeaseScheduler::create(svc2);
  LockOptions ro = reader(1s), wo = writer(1s);
  ro.lock_class = wo.lock_class = "book";
  auto& m = registry.lock_class("book");
  auto r1 = svc2->acquire(r, ro);
  auto r2 = svc2->acquire(r, ro);
  ASSERT_TRUE(r1 && r2);
  EXPECT_FALSE(svc2->acquire(r, wo));
  EXPECT_EQ(m.acquisitions_total.value(), 2u);
  EXPECT_EQ(m.busy_total.value(), 1u);
  EXPECT_EQ(m.contended_total.value(), 1u);
  EXPECT_EQ(m.wait_seconds.snapshot().count, 3u);
  EXPECT_TRUE(r1->release() && r2->release());
  ASSERT_TRUE(eventually([&] { return m.releases_total.value() == 2; }));
  EXPECT_EQ(m.hold_seconds.snapshot().count, 2u);
  auto w = svc2->acquire(r, wo);
  ASSERT_TRUE(w);
  Lease lease = sched2->adopt(std::move(*w));
  EXPECT_EQ(force_release_rw(*svc, r, {.reason = "test"}).outcome, admin::ForceReleaseResult::Outcome::released);
  ASSERT_TRUE(eventually([&] { return lease.lost(); }, 5s));
  ASSERT_TRUE(eventually([&] { return m.hold_seconds.snapshot().count == 3; }));
  EXPECT_EQ(m.leases_lost_total.value(), 1u);
  EXPECT_EQ(m.acquisitions_total.value(), 3u);
}

TEST_F(RwLockTest, AWaitingWriterStopsNewReadersAndIsFencedAfterTheReadersItExcluded) {
  const auto r = resource("ledger");
  auto a = svc->acquire(r, reader());
  auto b = svc->acquire(r, reader());
  ASSERT_TRUE(a && b);
  auto c2 = make_client();
  auto svc2 = LockService::create(*c2);
  LockOptions wo = writer(10s, 60s);
  wo.backoff_max = 30s;  // only the last reader's release can grant it soon
  auto fw = std::async(std::launch::async, [&] { return svc2->acquire(r, wo); });
  ASSERT_TRUE(eventually([&] { return waiting_writers(r) == 1; }));
  // Writer preference: a newcomer reader is busy although only readers hold.
  EXPECT_FALSE(svc->acquire(r, reader()));
  // A reader that waits queues behind the writer.
  auto c3 = make_client();
  auto svc3 = LockService::create(*c3);
  LockOptions ro = reader(10s, 60s);
  ro.backoff_max = 30s;
  auto fr = std::async(std::launch::async, [&] { return svc3->acquire(r, ro); });
  ASSERT_TRUE(eventually([&] { return line(r) == 2; }));
  ASSERT_TRUE(subscribed(r, 2));
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(a->release());
  EXPECT_EQ(fw.wait_for(300ms), std::future_status::timeout) << "granted beside a reader";
  EXPECT_TRUE(b->release());
  ASSERT_EQ(fw.wait_for(20s), std::future_status::ready) << "the writer was not woken by the last reader's release";
  auto w = fw.get();
  ASSERT_TRUE(w && w->fence());
  EXPECT_GT(*w->fence(), *a->fence());
  EXPECT_GT(*w->fence(), *b->fence());
  EXPECT_EQ(fr.wait_for(300ms), std::future_status::timeout) << "a reader granted beside the writer";
  EXPECT_TRUE(w->release());
  ASSERT_EQ(fr.wait_for(20s), std::future_status::ready) << "the reader was not woken by the writer's release";
  auto rd = fr.get();
  ASSERT_TRUE(rd && rd->fence());
  EXPECT_GT(*rd->fence(), *w->fence());
  EXPECT_EQ(line(r), 0);
  EXPECT_EQ(waiting_writers(r), 0);
}

// A continuous stream of readers (kReaders threads, each re-entering as soon
// as it leaves, so the readers' holds always overlap) and one writer. The
// bound: once the writer has its place in the line no reader is granted, so
// at most kReaders readers (those granted before the writer's place, whose
// entry was not yet counted) enter between its arrival and its grant.
TEST_F(RwLockTest, AStreamOfReadersDoesNotStarveAWriter) {
  const auto r = resource("ledger");
  constexpr int kReaders = 6;
  std::atomic<bool> stop{false};
  std::atomic<int> entered{0}, inside{0}, writer_inside{0}, overlaps{0};
  std::vector<std::unique_ptr<redis::Client>> clients;
  std::vector<std::shared_ptr<LockService>> services;
  for (int i = 0; i < kReaders + 1; ++i) {
    clients.push_back(make_client());
    services.push_back(LockService::create(*clients.back()));
  }
  std::vector<std::future<void>> readers;
  for (int i = 0; i < kReaders; ++i)
    readers.push_back(std::async(std::launch::async, [&, i] {
      LockOptions o = reader(10s, 60s);
      o.backoff_max = 50ms;
      while (!stop) {
        auto l = services[i]->acquire(r, o);
        ASSERT_TRUE(l);
        ++entered;
        ++inside;
        if (writer_inside) ++overlaps;
        // Long enough that the writer stays in the line for a while once it
        // joins it: the probe below polls, and on a loaded host it missed a
        // writer that waited only a few tens of milliseconds.
        std::this_thread::sleep_for(120ms);
        --inside;
        l->release();
      }
    }));
  // The stream is flowing: readers hold together, never all gone at once
  // for long.
  ASSERT_TRUE(eventually([&] { return entered >= 3 * kReaders; }));
  LockOptions wo = writer(10s, 60s);
  wo.backoff_max = 50ms;
  wo.lock_class = "starved-writer";
  std::atomic<int> at_arrival{-1};
  std::thread arrival([&] {
    if (eventually([&] { return waiting_writers(r) == 1; }, 30s)) at_arrival = entered.load();
  });
  auto w = services[kReaders]->acquire(r, wo);
  const int at_grant = entered;
  arrival.join();
  ASSERT_TRUE(w) << "the writer was not granted within its 60 s wait";
  ++writer_inside;
  if (inside) ++overlaps;
  std::this_thread::sleep_for(30ms);
  --writer_inside;
  w->release();
  // The readers go on after the writer.
  const int after = entered;
  EXPECT_TRUE(eventually([&] { return entered > after + kReaders; }));
  stop = true;
  for (auto& f : readers) f.get();
  // The writer met readers and waited in the line (the probe saw it there).
  EXPECT_EQ(services[kReaders]->class_metrics("starved-writer").contended_total.value(), 1u);
  ASSERT_GE(at_arrival.load(), 0) << "the writer was never seen in the line";
  const int before_grant = at_grant - at_arrival;
  std::cout << "readers entered before the writer joined the line: " << at_arrival.load()
            << "; between its arrival and its grant: " << before_grant << " (bound " << kReaders << ")"
            << std::endl;
  EXPECT_LE(before_grant, kReaders) << "readers kept entering while a writer waited";
  EXPECT_EQ(overlaps, 0) << "a reader and the writer were inside together";
}

TEST_F(RwLockTest, ACrashedReadersPlaceComesBackWhenItsLeaseExpiresNotBefore) {
  const auto r = resource("ledger");
  auto crashed = svc->acquire(r, reader(800ms));
  ASSERT_TRUE(crashed);
  const auto expiry =
      std::stoll(client->exec(redis::Command{"ZSCORE", svc->keys().rw_readers_key(r), crashed->token()}).str);
  crashed->detach();  // never released: the process "died"
  int busy = 0;
  std::optional<Lock> w;
  while (!w) {
    w = svc->acquire(r, writer());
    if (!w) ++busy;
  }
  EXPECT_GE(server_ms(), expiry) << "granted before the crashed reader's lease expired";
  EXPECT_GT(busy, 0);
}

TEST_F(RwLockTest, AWaitingReaderGetsACrashedWritersPlaceAtItsNextPoll) {
  const auto r = resource("ledger");
  auto crashed = svc->acquire(r, writer(500ms));
  ASSERT_TRUE(crashed);
  crashed->detach();
  LockOptions o = reader(10s, 30s);
  o.backoff_max = 100ms;
  EXPECT_TRUE(svc->acquire(r, o));
}

TEST_F(RwLockTest, AWriterThatGivesUpLeavesTheLineAndReadersEnterAgain) {
  const auto r = resource("ledger");
  auto a = svc->acquire(r, reader());
  ASSERT_TRUE(a);
  EXPECT_FALSE(svc->acquire(r, writer(10s, 300ms)));
  ASSERT_TRUE(eventually([&] { return line(r) == 0 && waiting_writers(r) == 0; }));
  EXPECT_TRUE(svc->acquire(r, reader()));
}

// The line is three sets that must agree (rw_line.lua). An entry left in one
// without the others, which nobody refreshes, must not stop the line: each
// case below kept the waiter out for its whole wait before the scripts
// repaired it.
TEST_F(RwLockTest, ALineEntryWithoutItsPlaceOrLivenessDoesNotStopTheLine) {
  const auto r = resource("ledger");
  const auto& k = svc->keys();
  const std::string line = k.rw_line_key(r), live = k.rw_line_expiry_key(r), writers = k.rw_writers_line_key(r);
  const auto us = [&](std::int64_t delta_ms) { return std::to_string((server_ms() + delta_ms) * 1000); };
  auto has = [&](const std::string& key, const std::string& id) {
    return client->exec(redis::Command{"ZSCORE", key, id}).is_string();
  };
  // A writer among the writers with no place and no liveness (a leave cut
  // short after its first two removals): readers arrive behind it.
  client->exec(redis::Command{"ZADD", writers, us(-1000), "ghost-writer"});
  client->exec(redis::Command{"PEXPIRE", writers, "60000"});
  auto a = svc->acquire(r, reader(10s, 3s));
  ASSERT_TRUE(a) << "a reader waited behind a writer with no place in the line";
  EXPECT_FALSE(has(writers, "ghost-writer"));
  a->release();

  // A place at the head with no liveness entry (so never found dead): a
  // writer arrives behind it.
  client->exec(redis::Command{"ZADD", line, us(-1000), "ghost-head"});
  client->exec(redis::Command{"PEXPIRE", line, "60000"});
  auto w = svc->acquire(r, writer(10s, 3s));
  ASSERT_TRUE(w) << "a writer waited behind a place with no liveness";
  EXPECT_FALSE(has(line, "ghost-head"));
  w->release();

  // A live writer whose arrival among the writers is older than its place
  // (re-added after its place's key expired): readers that arrived before
  // its place are ahead of it.
  client->exec(redis::Command{"ZADD", line, us(10000), "late-writer"});
  client->exec(redis::Command{"ZADD", live, std::to_string(server_ms() + 60000), "late-writer"});
  client->exec(redis::Command{"ZADD", writers, us(-1000), "late-writer"});
  for (const auto& key : {line, live, writers}) client->exec(redis::Command{"PEXPIRE", key, "60000"});
  auto b = svc->acquire(r, reader(10s, 3s));
  ASSERT_TRUE(b) << "a reader that arrived before the writer's place waited behind it";
  EXPECT_EQ(client->exec(redis::Command{"ZSCORE", writers, "late-writer"}).str,
            client->exec(redis::Command{"ZSCORE", line, "late-writer"}).str);
  b->release();
}

TEST_F(RwLockTest, WritersAreServedInArrivalOrder) {
  const auto r = resource("ledger");
  auto first = svc->acquire(r, writer());
  ASSERT_TRUE(first);
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::future<void>> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.push_back(std::async(std::launch::async, [&, i] {
      auto l = svc->acquire(r, writer(10s, 30s));
      ASSERT_TRUE(l);
      {
        std::lock_guard g(mu);
        order.push_back(i);
      }
      std::this_thread::sleep_for(20ms);
      l->release();
    }));
    ASSERT_TRUE(eventually([&] { return waiting_writers(r) == i + 1; })) << "writer " << i;
  }
  first->release();
  for (auto& f : waiters) f.get();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
}

TEST_F(RwLockTest, FencesShareTheMutexCounter) {
  const auto r = resource("ledger");
  auto a = svc->acquire(r, reader());
  ASSERT_TRUE(a && a->fence());
  a->release();
  LockOptions m;
  m.fence = true;
  auto mutex = svc->acquire(r, m);
  ASSERT_TRUE(mutex && mutex->fence());
  EXPECT_GT(*mutex->fence(), *a->fence());
  auto w = svc->acquire(r, writer());
  ASSERT_TRUE(w && w->fence());
  EXPECT_GT(*w->fence(), *mutex->fence());
  EXPECT_EQ(inspect_rwlock(*svc, r).fence, w->fence());
}

TEST_F(RwLockTest, BadOptionsAreRefusedBeforeAnythingIsSent) {
  LockOptions o = reader();
  o.permits = 2;
  EXPECT_THROW(svc->acquire(resource("x"), o), Error);
  o = writer();
  o.fair = true;
  EXPECT_THROW(svc->acquire(resource("x"), o), Error);
  o = reader();
  o.mode = static_cast<LockMode>(7);
  EXPECT_THROW(svc->acquire(resource("x"), o), Error);
  EXPECT_EQ(admin("EXISTS jobguard:rwr:{" + resource("x") + "} jobguard:rww:{" + resource("x") + "}"), "0");
}

TEST_F(RwLockTest, EveryKeyOfAReadWriteLockIsInTheResourcesSlot) {
  const auto& k = svc->keys();
  for (const auto& key : {k.rw_readers_key("inv:1"), k.rw_writer_key("inv:1"), k.rw_line_key("inv:1"),
                          k.rw_line_expiry_key("inv:1"), k.rw_writers_line_key("inv:1"), k.rw_channel("inv:1")})
    EXPECT_NE(key.find("{inv:1}"), std::string::npos) << key;
}

TEST_F(RwLockTest, TheAsyncFormsGrantAndRelease) {
  const auto r = resource("ledger");
  std::promise<std::optional<Lock>> p;
  svc->async_acquire(r, reader(), [&](const Error& e, std::optional<Lock> l) {
    EXPECT_FALSE(e) << e.what();
    p.set_value(std::move(l));
  });
  auto l = p.get_future().get();
  ASSERT_TRUE(l);
  std::promise<bool> rel;
  boost::asio::co_spawn(
      client->get_executor(),
      [&]() -> boost::asio::awaitable<void> {
        auto w = co_await async_acquire(*svc, r, writer(), boost::asio::use_awaitable);
        EXPECT_FALSE(w);
        const bool ours = co_await async_release(*l, boost::asio::use_awaitable);
        rel.set_value(ours);
      },
      boost::asio::detached);
  EXPECT_TRUE(rel.get_future().get());
  EXPECT_TRUE(svc->acquire(r, writer()));
}

// Attempts and releases of one mode made in one turn of the loop share one
// script call (coalesced, as a semaphore's are): each keeps its own answer
// and fence, and writer preference and the fences' order hold across calls.
TEST_F(RwLockTest, AttemptsAndReleasesOfOneTurnShareOneCallAndKeepTheirOwnAnswers) {
  const auto r = resource("turn");
  for (const auto& o : {reader(), writer()}) {  // the scripts are loaded
    auto l = svc->acquire(r, o);
    ASSERT_TRUE(l);
    ASSERT_TRUE(l->release());
  }
  auto before = script_calls();
  auto readers = acquire_in_one_turn(r, std::vector<LockOptions>(8, reader()));
  EXPECT_LE(script_calls() - before, 2);
  for (std::size_t i = 0; i < readers.size(); ++i) {
    ASSERT_TRUE(readers[i] && readers[i]->fence()) << "reader " << i;
    if (i > 0) {
      EXPECT_GT(*readers[i]->fence(), *readers[i - 1]->fence());
    }
  }
  EXPECT_EQ(inspect_rwlock(*svc, r).readers.size(), 8u);
  // Try-once writers while readers hold: busy, and out of the line.
  for (const auto& w : acquire_in_one_turn(r, std::vector<LockOptions>(3, writer()))) EXPECT_FALSE(w);
  EXPECT_EQ(line(r), 0);
  // A waiting writer (its polls far apart: only a release's wake grants it
  // soon) stops a whole turn of newcomer readers.
  auto c2 = make_client();
  auto svc2 = LockService::create(*c2);
  LockOptions wo = writer(10s, 60s);
  wo.backoff_max = 30s;
  auto fw = std::async(std::launch::async, [&] { return svc2->acquire(r, wo); });
  ASSERT_TRUE(eventually([&] { return waiting_writers(r) == 1; }));
  ASSERT_TRUE(subscribed(r, 1));
  for (const auto& l : acquire_in_one_turn(r, std::vector<LockOptions>(4, reader())))
    EXPECT_FALSE(l) << "a reader entered past a waiting writer";
  // The readers' releases in one turn, one of a lease that already ended:
  // each its own answer, and the call that leaves no reader wakes the writer.
  client->exec(redis::Command{"ZADD", svc->keys().rw_readers_key(r), "XX", "1", readers[7]->token()});
  before = script_calls();
  EXPECT_EQ(release_in_one_turn(readers), (std::vector<int>{1, 1, 1, 1, 1, 1, 1, 0}));
  ASSERT_EQ(fw.wait_for(20s), std::future_status::ready) << "the writer was not woken by the readers' release";
  auto w = fw.get();
  ASSERT_TRUE(w && w->fence());
  for (const auto& l : readers) EXPECT_GT(*w->fence(), *l->fence());
  // Writers of one turn: none beside the writer that holds; once it is gone,
  // the first of the call alone, fenced after it.
  for (const auto& l : acquire_in_one_turn(r, std::vector<LockOptions>(3, writer()))) EXPECT_FALSE(l);
  EXPECT_TRUE(w->release());
  auto next = acquire_in_one_turn(r, std::vector<LockOptions>(3, writer()));
  ASSERT_TRUE(next[0] && next[0]->fence());
  EXPECT_FALSE(next[1]);
  EXPECT_FALSE(next[2]);
  EXPECT_GT(*next[0]->fence(), *w->fence());
  // One holder released twice in one call: its first release only.
  EXPECT_EQ(release_in_one_turn(std::vector<const Lock*>{&*next[0], &*next[0]}), (std::vector<int>{1, 0}));
  next[0]->detach();
  for (auto& l : readers) l->detach();
}

class RwLeaseTest : public LeaseTest {};

TEST_F(RwLeaseTest, EachReadersLeaseRenewsAndOneIsLostWhenItsEntryGoes) {
  const auto r = resource("ledger");
  auto a = sched->acquire(r, reader(300ms));
  auto b = sched->acquire(r, reader(300ms));
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->token(), b->token());
  std::this_thread::sleep_for(1s);  // three TTLs: only renewals keep them
  EXPECT_FALSE(a->lost()) << a->reason();
  EXPECT_FALSE(b->lost()) << b->reason();
  EXPECT_GT(a->renewals(), 0u);
  // One reader taken away (an operator, a server that lost it): that lease
  // alone is lost.
  client->exec(redis::Command{"ZREM", svc->keys().rw_readers_key(r), a->token()});
  ASSERT_TRUE(eventually([&] { return a->lost(); }));
  EXPECT_EQ(a->state(), LeaseState::token_gone);
  std::this_thread::sleep_for(400ms);
  EXPECT_FALSE(b->lost()) << b->reason();
}

TEST_F(RwLeaseTest, AWritersLeaseIsLostWhenItsEntryGoesAndReleasesOtherwise) {
  const auto r = resource("ledger");
  auto w = sched->acquire(r, writer(300ms));
  ASSERT_TRUE(w);
  std::this_thread::sleep_for(700ms);
  EXPECT_FALSE(w->lost()) << w->reason();
  EXPECT_FALSE(svc->acquire(r, reader()));
  EXPECT_TRUE(w->release());
  auto rd = svc->acquire(r, reader());
  EXPECT_TRUE(rd);
  EXPECT_FALSE(sched->acquire(r, writer(300ms)));
}

class RwQuarantineTest : public test::RedisTest {
 protected:
  void SetUp() override {
    trust_new_server_ = false;
    RedisTest::SetUp();
  }
};

TEST_F(RwQuarantineTest, AServerThatLostLockStateIsRefusedReadersAndWriters) {
  auto c = make_client();
  auto svc = LockService::create(*c, KeyBuilder(), QuarantineOptions{.max_ttl = 2s});
  for (auto mode : {LockMode::shared, LockMode::exclusive}) {
    try {
      auto l = svc->acquire("ledger", rw(mode, 1s));
      FAIL() << "granted by a server without a lock-state record";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::server_busy));
      EXPECT_NE(std::string(e.what()).find("server lost lock state"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(admin("EXISTS jobguard:rwr:{ledger} jobguard:rww:{ledger}"), "0");
}

}  // namespace
}  // namespace jobguard
