#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <future>
#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/metrics.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using Clock = std::chrono::steady_clock;
using jobguard::test::eventually;

#include "fixtures.hpp"

TEST_F(LockTest, AcquireStoresThePlainTokenWithTheTtl) {
  auto l = svc->acquire(resource("a"), LockOptions{.ttl = 5s});
  ASSERT_TRUE(l);
  EXPECT_EQ(l->key(), "jobguard:lock:{" + resource("a") + "}");
  EXPECT_EQ(admin("GET " + l->key()), l->token());
  const long pttl = std::stol(admin("PTTL " + l->key()));
  EXPECT_GT(pttl, 4000);
  EXPECT_LE(pttl, 5000);
  EXPECT_FALSE(svc->acquire(resource("a")).has_value()) << "second acquire must be busy";
  EXPECT_TRUE(l->release());
  EXPECT_EQ(admin("EXISTS " + l->key()), "0");
}

TEST_F(LockTest, ReleaseByNonOwnerLeavesLockHeld) {
  // The expire-then-reacquire race: A's lock expires, B takes it, then A
  // finishes and releases. A must not delete B's lock.
  auto a = svc->acquire(resource("r"), LockOptions{.ttl = 50ms});
  ASSERT_TRUE(a);
  ASSERT_TRUE(eventually([&] { return admin("EXISTS " + a->key()) == "0"; }, 2s));
  auto b = svc->acquire(resource("r"), LockOptions{.ttl = 10s});
  ASSERT_TRUE(b);
  EXPECT_FALSE(a->release()) << "A's release must report the lock was no longer its own";
  EXPECT_EQ(admin("GET " + b->key()), b->token());
  EXPECT_FALSE(a->extend(10s)) << "nor may A extend B's lock";
  EXPECT_TRUE(b->release());
}

TEST_F(LockTest, ScopeExitReleases) {
  std::string key;
  {
    auto l = svc->acquire(resource("scope"));
    ASSERT_TRUE(l);
    key = l->key();
  }
  EXPECT_TRUE(eventually([&] { return admin("EXISTS " + key) == "0"; }, 2s));
}

TEST_F(LockTest, RespectsALockHeldByAnotherClientsPlainToken) {
  // A Node or PHP worker using SET NX PX with its own token value.
  const std::string key = svc->keys().lock_key(resource("foreign"));
  ASSERT_EQ(admin("SET " + key + " node-worker-7f3a NX PX 10000"), "OK");
  EXPECT_FALSE(svc->acquire(resource("foreign")).has_value());
  admin("DEL " + key);
  EXPECT_TRUE(svc->acquire(resource("foreign")).has_value());
}

TEST_F(LockTest, MutualExclusionAcrossThreads) {
  std::atomic<int> inside{0}, overlaps{0}, entries{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        auto l = svc->acquire(resource("mx"), LockOptions{.ttl = 5s, .wait = 10s});
        ASSERT_TRUE(l);
        if (inside.fetch_add(1) != 0) overlaps++;
        entries++;
        std::this_thread::sleep_for(200us);
        inside.fetch_sub(1);
        ASSERT_TRUE(l->release());
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(entries.load(), 200);
}

TEST_F(LockTest, TryOnceReturnsBusyImmediately) {
  auto a = svc->acquire(resource("busy"));
  ASSERT_TRUE(a);
  const auto t0 = Clock::now();
  EXPECT_FALSE(svc->acquire(resource("busy")).has_value());
  EXPECT_LT(Clock::now() - t0, 1s);
}

TEST_F(LockTest, WaitGivesUpAtTheDeadline) {
  auto a = svc->acquire(resource("w"));
  ASSERT_TRUE(a);
  const auto t0 = Clock::now();
  EXPECT_FALSE(svc->acquire(resource("w"), LockOptions{.wait = 300ms}).has_value());
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, 290ms);
  EXPECT_LT(took, 3s);
}

TEST_F(LockTest, WaiterIsWokenByTheReleaseNotBackoff) {
  auto a = svc->acquire(resource("wake"));
  ASSERT_TRUE(a);
  std::optional<Lock> b;
  Clock::time_point got;
  // A huge backoff: only the release message can wake the waiter in time.
  std::thread t([&] {
    b = svc->acquire(resource("wake"),
                     LockOptions{.wait = 20s, .backoff_min = 10s, .backoff_max = 10s});
    got = Clock::now();
  });
  std::this_thread::sleep_for(300ms);
  const auto released = Clock::now();
  ASSERT_TRUE(a->release());
  t.join();
  ASSERT_TRUE(b);
  EXPECT_LT(got - released, 2s) << "the waiter slept through the release notification";
}

TEST_F(LockTest, WaitersOfOneServiceShareTheChannelAndEachIsWokenByARelease) {
  // B subscribes; C joins B's confirmed channel and so skips the look-again
  // attempt. Huge backoffs: only release messages can wake them in time.
  const std::string r = resource("shared");
  auto a = svc->acquire(r);
  ASSERT_TRUE(a);
  const LockOptions slow{.wait = 20s, .backoff_min = 10s, .backoff_max = 10s};
  std::optional<Lock> b, c;
  std::atomic<bool> b_got{false}, c_got{false};
  std::thread tb([&] {
    b = svc->acquire(r, slow);
    b_got = b.has_value();
  });
  const std::string channel = svc->keys().channel(r);
  ASSERT_TRUE(eventually([&] {
    auto n = client->exec(redis::Command{"PUBSUB", "NUMSUB", channel});
    return n.is_array() && n.elements.size() == 2 && n.elements[1].integer == 1;
  }, 5s));
  std::this_thread::sleep_for(100ms);
  std::thread tc([&] {
    c = svc->acquire(r, slow);
    c_got = c.has_value();
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(b_got || c_got);
  const auto t0 = Clock::now();
  ASSERT_TRUE(a->release());
  const bool one = eventually([&] { return b_got || c_got; }, 2s);
  if (one) {
    // Whichever won releases: the other must wake for that release too.
    EXPECT_TRUE((b_got ? b : c)->release());
  }
  tb.join();
  tc.join();
  ASSERT_TRUE(one) << "nobody woke for the first release";
  EXPECT_TRUE(b_got && c_got);
  EXPECT_LT(Clock::now() - t0, 5s) << "a waiter slept through a release";
}

TEST_F(LockTest, LostNotificationCostsOneBackoffNotAHang) {
  auto a = svc->acquire(resource("lost"));
  ASSERT_TRUE(a);
  std::optional<Lock> b;
  std::thread t([&] {
    b = svc->acquire(resource("lost"), LockOptions{.wait = 10s, .backoff_min = 20ms, .backoff_max = 100ms});
  });
  std::this_thread::sleep_for(200ms);
  // Delete behind jobguard's back: no release message is ever published.
  admin("DEL " + a->key());
  a->detach();
  t.join();
  EXPECT_TRUE(b.has_value());
}

// Default mode: a release wakes the waiter that has waited longest, not the
// herd (release.lua, acquire.lua). Waiters in three services (three clients,
// as three processes would be), in line one after the other, with backoffs
// so long that only a wake message can reach them in time: each release
// grants the next one in the line's order, and the others sleep on in line.
TEST_F(LockTest, DefaultModeReleaseWakesTheLongestWaitingWaiterOnly) {
  const std::string r = resource("line");
  const std::string line = svc->keys().waiters_key(r);
  auto a = svc->acquire(r);
  ASSERT_TRUE(a);
  const LockOptions slow{.ttl = 10s, .wait = 20s, .backoff_min = 10s, .backoff_max = 10s};
  // Each service counts its busy answers in a registry of its own.
  std::vector<std::unique_ptr<observe::Registry>> registries;
  std::vector<std::unique_ptr<redis::Client>> clients;
  std::vector<std::shared_ptr<LockService>> services;
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::optional<Lock>> held(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    registries.push_back(std::make_unique<observe::Registry>());
    clients.push_back(make_client());
    services.push_back(LockService::create(*clients.back(), LockServiceOptions{.metrics = registries.back().get()}));
    threads.emplace_back([&, i] {
      auto l = services[i]->acquire(r, slow);
      std::lock_guard g(mu);
      order.push_back(i);
      held[i] = std::move(l);
    });
    // In line, and asleep, before the next one comes: the first busy answer
    // puts it in line, and once subscribed it looks again (the second busy
    // answer). A look-again still on its way at the release would find the
    // lock free and take it before the woken waiter.
    ASSERT_TRUE(eventually([&] { return admin("ZCARD " + line) == std::to_string(i + 1); }, 5s));
    ASSERT_TRUE(eventually([&] { return registries[i]->lock_class("default").busy_total.value() >= 2; }, 5s))
        << "waiter " << i << " did not look again after subscribing";
  }
  // The line's order, reversed by hand: Redis hands a message to a channel's
  // subscribers in the order they subscribed, so a herd would be granted in
  // arrival order too; the reversed line tells the two apart.
  auto in_line = client->exec(redis::Command{"ZRANGE", line, "0", "-1", "WITHSCORES"});
  ASSERT_TRUE(in_line.is_array() && in_line.elements.size() == 6);
  client->exec(redis::Command{"ZADD", line, "XX", in_line.elements[1].str, in_line.elements[4].str,
                              in_line.elements[5].str, in_line.elements[0].str});
  auto granted = [&] {
    std::lock_guard g(mu);
    return order.size();
  };
  ASSERT_TRUE(a->release());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(eventually([&] { return granted() == static_cast<std::size_t>(i + 1); }, 5s))
        << "release " << i << " woke nobody in time";
    // Nobody else woke and won meanwhile; the rest are still in line.
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(granted(), static_cast<std::size_t>(i + 1));
    EXPECT_EQ(admin("ZCARD " + line), std::to_string(2 - i));
    std::lock_guard g(mu);
    ASSERT_TRUE(held[order.back()]);
    ASSERT_TRUE(held[order.back()]->release());
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(order, (std::vector<int>{2, 1, 0}));
  // A Lock shares its service, and a service must go before its client.
  held.clear();
  services.clear();
  clients.clear();
}

// Woken, but a newcomer took the free lock first: the woken waiter is back
// at the front of the line at its first arrival, so the next release wakes
// it again (not the waiter behind it, nor the newcomer).
TEST_F(LockTest, AWokenWaiterThatLosesTheRaceKeepsItsPlace) {
  const std::string r = resource("race");
  const std::string line = svc->keys().waiters_key(r);
  auto a = svc->acquire(r);
  ASSERT_TRUE(a);
  const LockOptions slow{.ttl = 10s, .wait = 20s, .backoff_min = 10s, .backoff_max = 10s};
  std::atomic<int> first{-1};
  std::optional<Lock> lb, lc;
  std::thread tb([&] {
    lb = svc->acquire(r, slow);
    int none = -1;
    first.compare_exchange_strong(none, 1);
  });
  ASSERT_TRUE(eventually([&] { return admin("ZCARD " + line) == "1"; }, 5s));
  std::thread tc([&] {
    lc = svc->acquire(r, slow);
    int none = -1;
    first.compare_exchange_strong(none, 2);
  });
  ASSERT_TRUE(eventually([&] { return admin("ZCARD " + line) == "2"; }, 5s));
  auto head = client->exec(redis::Command{"ZRANGE", line, "0", "0", "WITHSCORES"});
  ASSERT_TRUE(head.is_array() && head.elements.size() == 2);
  const std::string b_id = head.elements[0].str, b_arrival = head.elements[1].str;
  // The release and the newcomer, by hand, in one step: the lock passes to a
  // stranger and B is woken to find it busy.
  a->detach();
  client->exec(redis::Command{"SET", a->key(), "stranger#1", "PX", "10000"});
  client->exec(redis::Command{"ZPOPMIN", line});
  client->exec(redis::Command{"PUBLISH", svc->keys().channel(r), "wake " + b_id});
  ASSERT_TRUE(eventually([&] { return admin("ZSCORE " + line + " " + b_id) == b_arrival; }, 5s))
      << "the woken waiter did not come back to its place";
  EXPECT_EQ(first.load(), -1);
  // The stranger's release wakes the head of the line: B again.
  bool released = false;
  std::promise<void> done;
  svc->async_release(r, "stranger#1", [&](const Error&, bool ours) {
    released = ours;
    done.set_value();
  });
  done.get_future().wait();
  EXPECT_TRUE(released);
  ASSERT_TRUE(eventually([&] { return first.load() != -1; }, 5s));
  EXPECT_EQ(first.load(), 1) << "the release woke the waiter behind the one that lost the race";
  tb.join();
  ASSERT_TRUE(lb);
  ASSERT_TRUE(lb->release());
  tc.join();
  ASSERT_TRUE(lc);
  EXPECT_TRUE(lc->release());
}

// A waiter that gives up leaves the line (or the next release would wake
// nobody); a dead waiter's place (it cannot leave) costs the next waiter one
// poll, not its wait.
TEST_F(LockTest, AWaiterThatGivesUpLeavesTheLineAndADeadOnesPlaceCostsOnePoll) {
  const std::string r = resource("leave");
  const std::string line = svc->keys().waiters_key(r);
  auto a = svc->acquire(r);
  ASSERT_TRUE(a);
  EXPECT_FALSE(svc->acquire(r, LockOptions{.wait = 300ms}));
  EXPECT_TRUE(eventually([&] { return admin("ZCARD " + line) == "0"; }, 5s)) << "the waiter that gave up is still in line";
  admin("ZADD " + line + " 1 dead-waiter#0");
  std::optional<Lock> b;
  std::thread t([&] { b = svc->acquire(r, LockOptions{.wait = 20s, .backoff_min = 50ms, .backoff_max = 300ms}); });
  ASSERT_TRUE(eventually([&] { return admin("ZCARD " + line) == "2"; }, 5s));
  ASSERT_TRUE(a->release());  // wakes the dead waiter, who never comes
  t.join();
  ASSERT_TRUE(b) << "the waiter behind a dead one never got the lock";
  EXPECT_EQ(admin("ZCARD " + line), "0");
  EXPECT_TRUE(b->release());
}

TEST_F(LockTest, FairModeHandsOffInArrivalOrder) {
  const std::string r = resource("fair");
  LockOptions fair{.ttl = 10s, .wait = 10s, .fair = true};
  auto a = svc->acquire(r, fair);
  ASSERT_TRUE(a);
  std::vector<int> order;
  std::mutex mu;
  auto waiter = [&](int id) {
    auto l = svc->acquire(r, fair);
    ASSERT_TRUE(l);
    {
      std::lock_guard<std::mutex> g(mu);
      order.push_back(id);
    }
    std::this_thread::sleep_for(20ms);
    l->release();
  };
  // B queues first, then C: each is in line (and listening for its grant)
  // before the next comes, whatever a sanitizer does to their threads.
  std::thread b(waiter, 1);
  const bool b_queued = fair_queue_ready(r, 1);
  std::thread c(waiter, 2);
  const bool c_queued = b_queued && fair_queue_ready(r, 2);
  ASSERT_TRUE(a->release());
  if (!c_queued) {
    b.join();
    c.join();
    FAIL() << "the fair waiters never queued: B " << b_queued << ", C " << c_queued;
  }
  // The releaser comes straight back: it must queue behind B and C.
  auto again = svc->acquire(r, fair);
  ASSERT_TRUE(again);
  {
    std::lock_guard<std::mutex> g(mu);
    order.push_back(0);
  }
  again->release();
  b.join();
  c.join();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 0}));
}

TEST_F(LockTest, FairReleaseHandsTheLockToTheQueueHead) {
  const std::string r = resource("grant");
  LockOptions fair{.ttl = 10s, .wait = 10s, .fair = true};
  auto a = svc->acquire(r, fair);
  ASSERT_TRUE(a);
  std::optional<Lock> b;
  std::thread t([&] {
    LockOptions o = fair;
    o.job_id = "waiter-b";
    b = svc->acquire(r, o);
  });
  ASSERT_TRUE(fair_queue_ready(r, 1));
  ASSERT_TRUE(a->release());
  const auto released = Clock::now();
  // The release itself made B the holder: no attempt of B's ran in between.
  const std::string holder = admin("GET " + a->key());
  t.join();
  ASSERT_TRUE(b);
  EXPECT_EQ(holder, b->token());
  EXPECT_EQ(token_owner(holder).substr(token_owner(holder).rfind('/') + 1), "waiter-b");
  EXPECT_EQ(admin("LLEN " + svc->keys().queue_key(r)), "0");
  // B's TTL is counted from before the grant (the send of an attempt the
  // server answered before the release granted it), never after: so before
  // the release returned. Not before the release was sent: B may still send
  // an attempt then (the look again after it subscribed), and a busy one is
  // as safe a start as the first.
  EXPECT_LT(b->acquired_at(), released);
  EXPECT_GT(std::stol(admin("PTTL " + b->key())), 9000);
  EXPECT_TRUE(b->release());
  EXPECT_EQ(admin("EXISTS " + b->key()), "0");
}

TEST_F(LockTest, FairGrantCarriesAFreshFence) {
  const std::string r = resource("grant-fence");
  LockOptions o{.ttl = 10s, .wait = 10s, .fence = true, .fair = true};
  auto a = svc->acquire(r, o);
  ASSERT_TRUE(a && a->fence());
  std::optional<Lock> b;
  std::thread t([&] { b = svc->acquire(r, o); });
  ASSERT_TRUE(fair_queue_ready(r, 1));
  ASSERT_TRUE(a->release());
  t.join();
  ASSERT_TRUE(b && b->fence());
  EXPECT_GT(*b->fence(), *a->fence());
  EXPECT_EQ(admin("GET " + svc->keys().fence_key(r)), std::to_string(*b->fence()));
}

TEST_F(LockTest, FairGrantAfterALongQuietWaitRestartsTheTtl) {
  // B's only busy attempt is its first one (no refresh for 10 s): a TTL
  // counted from then would be spent, so B asks once more and counts from that.
  const std::string r = resource("grant-stale");
  auto a = svc->acquire(r, LockOptions{.ttl = 10s, .fair = true});
  ASSERT_TRUE(a);
  std::optional<Lock> b;
  std::thread t([&] {
    b = svc->acquire(r, LockOptions{.ttl = 400ms, .wait = 10s, .fair = true, .backoff_max = 10s});
  });
  ASSERT_TRUE(fair_queue_ready(r, 1));
  std::this_thread::sleep_for(300ms);
  const auto released = Clock::now();
  ASSERT_TRUE(a->release());
  t.join();
  ASSERT_TRUE(b);
  EXPECT_GT(b->acquired_at(), released);
  EXPECT_LE(std::stol(admin("PTTL " + b->key())), 400);
  EXPECT_TRUE(b->release());
}

TEST_F(LockTest, GrantToAWaiterThatGaveUpIsPassedOn) {
  const std::string r = resource("grant-abandoned");
  const std::string key = svc->keys().lock_key(r);
  auto a = svc->acquire(r, LockOptions{.ttl = 10s, .fair = true});
  ASSERT_TRUE(a);
  std::string entry;
  std::thread t([&] { EXPECT_FALSE(svc->acquire(r, LockOptions{.ttl = 10s, .wait = 600ms, .fair = true})); });
  ASSERT_TRUE(fair_queue_ready(r, 1));
  entry = admin("LINDEX " + svc->keys().queue_key(r) + " 0");
  t.join();
  const std::string channel = entry_channel(entry);
  ASSERT_FALSE(channel.empty()) << entry;
  const std::string gone = entry.substr(entry.rfind(' ') + 1);

  // A release that handed B the lock just as B gave up (its leave came
  // second): B's service passes the lock on instead of letting it block.
  a->detach();
  ASSERT_EQ(admin("SET " + key + " " + gone + " PX 60000"), "OK");
  client->exec(redis::Command{"PUBLISH", channel, gone + " -1 " + r});
  EXPECT_TRUE(eventually([&] { return admin("EXISTS " + key) == "0"; }, 3s));

  // A grant naming a token the service does not know as given up is left
  // alone: that waiter may already be using the lock.
  const std::string other = make_token("someone");
  ASSERT_EQ(admin("SET " + key + " " + other + " PX 60000"), "OK");
  client->exec(redis::Command{"PUBLISH", channel, other + " -1 " + r});
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(admin("GET " + key), other);
}

TEST_F(LockTest, RejectsBadArgumentsWithOneLineErrors) {
  EXPECT_THROW(svc->acquire(""), Error);
  EXPECT_THROW(svc->acquire("a b"), Error);
  EXPECT_THROW(svc->acquire("x", LockOptions{.ttl = 1ms}), Error);
}

TEST_F(LockTest, RedisDownIsAnErrorNotBusy) {
  server->kill();
  try {
    svc->acquire(resource("down"), LockOptions{.wait = 0ms});
    FAIL() << "acquire succeeded with Redis down";
  } catch (const Error& e) {
    EXPECT_EQ(next_step_for(e.code()), next_step::retry_call) << e.what();
  }
}

// With the connection known to be down, a try-once acquire answers at once.
// The client's command timeout is ten minutes, so an acquire that waited for
// it would hang the test (ctest's timeout fails it) instead of returning.
TEST_F(LockTest, TryOnceOnAClientKnownDownAnswersAtOnceNamingServerAndResource) {
  auto o = options();
  o.command_timeout = std::chrono::minutes(10);
  redis::Client c(o);
  ASSERT_TRUE(c.wait_connected(5s));
  auto locks = LockService::create(c);
  EXPECT_FALSE(c.down_error());
  const std::string address = c.address();
  server->kill();
  ASSERT_TRUE(eventually([&] { return static_cast<bool>(c.down_error()); }, 10s));
  const std::string r = resource("down-fast");
  try {
    locks->acquire(r, LockOptions{.wait = 0ms});
    FAIL() << "acquire succeeded with Redis down";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::not_connected) << e.what();
    EXPECT_EQ(e.source(), error_source::redis);
    EXPECT_EQ(e.next(), next_step::retry_call);
    const std::string what = e.what();
    EXPECT_NE(what.find(address), std::string::npos) << what;
    EXPECT_NE(what.find(locks->keys().lock_key(r)), std::string::npos) << what;
  }
  // A call that asks to fail fast does too; one that does not would wait.
  std::promise<std::error_code> p;
  c.async_exec(redis::Command{"PING"}, [&p](std::error_code ec, redis::Reply) { p.set_value(ec); },
               redis::CallOptions{.fail_if_down = true});
  EXPECT_EQ(p.get_future().get(), errc::not_connected);
}

// Every failure of an acquire, a release or an extend names the server it
// talked to and the lock's key.
TEST_F(LockTest, RedisErrorsNameTheServerAndTheKey) {
  const std::string r = resource("named");
  auto lock = svc->acquire(r, LockOptions{.ttl = 30s});
  ASSERT_TRUE(lock);
  auto other = svc->acquire(resource("named-2"), LockOptions{.ttl = 30s});
  ASSERT_TRUE(other);
  const std::string address = client->address();
  server->kill();
  auto check = [&](const char* what_call, const std::string& key, auto&& call) {
    try {
      call();
      ADD_FAILURE() << what_call << " succeeded with Redis down";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.source(), error_source::redis) << what;
      EXPECT_NE(what.find(address), std::string::npos) << what_call << ": " << what;
      EXPECT_NE(what.find(key), std::string::npos) << what_call << ": " << what;
    }
  };
  check("extend", lock->key(), [&] { lock->extend(); });
  check("release", lock->key(), [&] { lock->release(); });
  check("acquire", svc->keys().lock_key(r), [&] { svc->acquire(r, LockOptions{.wait = 0ms}); });
  other->detach();
}
