// Counting semaphores on a real server (docs/semaphore.md): N holders at
// once, the N+1th waits in line and is woken by name, first come first
// served, a crashed holder's permit back only once its lease has expired by
// the server's clock, a lowered count, fencing tokens, the quarantine gate.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <future>
#include <set>
#include <mutex>
#include <thread>

#include "fixtures.hpp"
#include "jobguard/async.hpp"
#include "jobguard/error.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/semaphore.hpp"

using namespace std::chrono_literals;
using jobguard::test::eventually;

namespace jobguard {
namespace {

LockOptions permits(int n, std::chrono::milliseconds ttl = 10s, std::chrono::milliseconds wait = 0ms) {
  LockOptions o;
  o.permits = n;
  o.ttl = ttl;
  o.wait = wait;
  o.fence = true;
  return o;
}

class SemaphoreTest : public LockTest {
 protected:
  std::int64_t line_size(const std::string& r) const {
    return client->exec(redis::Command{"ZCARD", svc->keys().permit_line_key(r)}).integer;
  }
  std::int64_t server_ms() const {
    auto t = client->exec(redis::Command{"TIME"});
    return std::stoll(t.elements[0].str) * 1000 + std::stoll(t.elements[1].str) / 1000;
  }
};

TEST_F(SemaphoreTest, NHoldersAreGrantedDistinctSlotsAndTheNextIsBusy) {
  const auto r = resource("pay");
  std::vector<Lock> held;
  for (int i = 0; i < 3; ++i) {
    auto p = svc->acquire(r, permits(3));
    ASSERT_TRUE(p) << "permit " << i;
    EXPECT_EQ(p->permits(), 3);
    EXPECT_EQ(p->key(), svc->keys().permit_holders_key(r));
    held.push_back(std::move(*p));
  }
  std::set<int> slots;
  for (const auto& p : held) slots.insert(p.permit_slot());
  EXPECT_EQ(slots, (std::set<int>{0, 1, 2}));
  EXPECT_FALSE(svc->acquire(r, permits(3)));
  const auto info = inspect_semaphore(*svc, r);
  ASSERT_EQ(info.holders.size(), 3u);
  EXPECT_EQ(info.holders[2].slot, 2);
  EXPECT_GT(info.holders[0].ttl_left, 0ms);
  // A released slot is the one the next holder gets.
  const int freed = held[1].permit_slot();
  EXPECT_TRUE(held[1].release());
  EXPECT_FALSE(held[1].release());
  auto again = svc->acquire(r, permits(3));
  ASSERT_TRUE(again);
  EXPECT_EQ(again->permit_slot(), freed);
}

// The holders' key (sem_acquire.lua): every slot below its member count has
// exactly one member, a live or expired holder "<token> <slot>" or a
// "free:<slot>", and nothing is above it.
void expect_slots_covered(redis::Client& c, const std::string& key) {
  const auto all = c.exec(redis::Command{"ZRANGE", key, "0", "-1"});
  std::set<int> seen;
  for (const auto& m : all.elements) {
    const auto sp = m.str.rfind(m.str.rfind(' ') == std::string::npos ? ':' : ' ');
    ASSERT_NE(sp, std::string::npos) << m.str;
    const int slot = std::stoi(m.str.substr(sp + 1));
    EXPECT_TRUE(seen.insert(slot).second) << "slot " << slot << " twice in " << key;
  }
  if (!seen.empty()) {
    EXPECT_EQ(*seen.rbegin(), static_cast<int>(all.elements.size()) - 1) << key;
  }
}

TEST_F(SemaphoreTest, SlotsStayDistinctThroughReleasesExpiriesAndALoweredCount) {
  const auto r = resource("slots");
  const auto key = svc->keys().permit_holders_key(r);
  std::vector<Lock> held;
  for (int i = 0; i < 6; ++i) {
    auto p = svc->acquire(r, permits(6));
    ASSERT_TRUE(p);
    held.push_back(std::move(*p));
  }
  // Slots 1 and 4 released, 2 left to expire (a crashed holder), 3 expired
  // and then renewed too late.
  EXPECT_TRUE(held[1].release());
  EXPECT_TRUE(held[4].release());
  expect_slots_covered(*client, key);
  client->exec(redis::Command{"ZADD", key, "XX", "1", held[2].token() + " 2"});
  client->exec(redis::Command{"ZADD", key, "XX", "1", held[3].token() + " 3"});
  EXPECT_FALSE(held[3].extend(10s));
  expect_slots_covered(*client, key);
  EXPECT_EQ(inspect_semaphore(*svc, r).holders.size(), 2u);  // 0 and 5: 2 expired, 3 gone
  // The lowest free slots first: 1, then 2 (swept now), 3, 4, never two alike.
  std::vector<int> got;
  for (int i = 0; i < 3; ++i) {
    auto p = svc->acquire(r, permits(6));
    ASSERT_TRUE(p);
    got.push_back(p->permit_slot());
    held.push_back(std::move(*p));
    expect_slots_covered(*client, key);
  }
  EXPECT_EQ(got, (std::vector<int>{1, 2, 3}));
  // Lowered to 3 with 5 held (0, 1, 2, 3, 5): nothing until fewer than 3,
  // then a slot below 3 (free members 0, 2 and 4; 5, the top, leaves none).
  set_permits(*svc, r, 3);
  EXPECT_FALSE(svc->acquire(r, permits(6)));
  for (auto* l : {&held[0], &held[7], &held[5]}) {
    EXPECT_TRUE(l->release()) << "slot " << l->permit_slot();
  }
  expect_slots_covered(*client, key);
  auto low = svc->acquire(r, permits(6));
  ASSERT_TRUE(low);
  EXPECT_LT(low->permit_slot(), 3);
  expect_slots_covered(*client, key);
  // The last holder out takes the key with it.
  for (auto* l : {&held[6], &held[8], &*low}) {
    EXPECT_TRUE(l->release());
  }
  EXPECT_EQ(client->exec(redis::Command{"EXISTS", key}).integer, 0);
}

// Releases at the top of the slots shorten the key instead of writing free
// members (sem_release.lua); below a slot still in use they write one each.
TEST_F(SemaphoreTest, ReleasesAtTheTopShortenTheKeyAndBelowAHolderLeaveFreeMembers) {
  const auto r = resource("top");
  const auto key = svc->keys().permit_holders_key(r);
  auto got = acquire_in_one_turn(r, std::vector<LockOptions>(5, permits(5)));
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(got[i]) << "attempt " << i;
  std::vector<std::optional<Lock>> by_slot(5);
  for (auto& l : got) by_slot[static_cast<std::size_t>(l->permit_slot())] = std::move(l);
  const auto members = [&] { return client->exec(redis::Command{"ZCARD", key}).integer; };
  const auto free_members = [&] {
    return client->exec(redis::Command{"ZCOUNT", key, "(1000000000000000", "+inf"}).integer;
  };
  // 1, 3 and 4 in one call: 3 and 4 are the top, 1 is below 2.
  EXPECT_EQ(release_in_one_turn(std::vector<const Lock*>{&*by_slot[1], &*by_slot[3], &*by_slot[4]}),
            (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(members(), 3);
  EXPECT_EQ(free_members(), 1);
  expect_slots_covered(*client, key);
  // 2, now the top: the key ends at 0 and the free member of 1 stays below it.
  EXPECT_TRUE(by_slot[2]->release());
  EXPECT_EQ(members(), 2);
  EXPECT_EQ(free_members(), 1);
  expect_slots_covered(*client, key);
  // The next grant takes the free 1, the one after it 2 again.
  auto a = svc->acquire(r, permits(5));
  auto b = svc->acquire(r, permits(5));
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->permit_slot(), 1);
  EXPECT_EQ(b->permit_slot(), 2);
  EXPECT_EQ(free_members(), 0);
  expect_slots_covered(*client, key);
  for (auto* l : {&*by_slot[0], &*a, &*b}) EXPECT_TRUE(l->release());
  EXPECT_EQ(client->exec(redis::Command{"EXISTS", key}).integer, 0);
}

// A call's release finds whether each member was still there without
// reading their expiries when none has expired: one ZREM, and when it
// removed fewer than the call named, the slots tell which (sem_release.lua).
TEST_F(SemaphoreTest, AReleaseOfSeveralWhereSomeAreNoLongerOursAnswersEachByItsOwn) {
  const auto r = resource("gone");
  const auto key = svc->keys().permit_holders_key(r);
  auto got = acquire_in_one_turn(r, std::vector<LockOptions>(5, permits(5)));
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(got[i]) << "attempt " << i;
  std::vector<std::optional<Lock>> by_slot(5);
  for (auto& l : got) by_slot[static_cast<std::size_t>(l->permit_slot())] = std::move(l);
  // Slot 1 force-released (its free member written), slot 4, the top, too
  // (the key shorter by it): neither is ours any more, and nothing expired.
  for (int slot : {1, 4})
    EXPECT_EQ(admin::force_release_permit(*svc, r, {.reason = "test", .slot = slot}).outcome,
              admin::ForceReleaseResult::Outcome::released);
  expect_slots_covered(*client, key);
  EXPECT_EQ(release_in_one_turn(std::vector<const Lock*>{&*by_slot[1], &*by_slot[2], &*by_slot[4], &*by_slot[3]}),
            (std::vector<int>{0, 1, 0, 1}));
  expect_slots_covered(*client, key);
  EXPECT_EQ(inspect_semaphore(*svc, r).holders.size(), 1u);
  // Slot 1 taken by a new holder, then 0 and the old 1 in one call: only
  // the new holder of 1 keeps it.
  auto again = svc->acquire(r, permits(5));
  ASSERT_TRUE(again);
  EXPECT_EQ(again->permit_slot(), 1);
  EXPECT_EQ(release_in_one_turn(std::vector<const Lock*>{&*by_slot[0], &*by_slot[1]}), (std::vector<int>{1, 0}));
  expect_slots_covered(*client, key);
  const auto info = inspect_semaphore(*svc, r);
  ASSERT_EQ(info.holders.size(), 1u);
  EXPECT_EQ(info.holders[0].slot, 1);
  EXPECT_TRUE(again->release());
  EXPECT_EQ(client->exec(redis::Command{"EXISTS", key}).integer, 0);
}

// A permit's token is long enough (over zset-max-listpack-value's default)
// that Redis keeps the holders' key as a skiplist, where each member of a
// call is found by name instead of by a scan (waiter_shell.cpp, new_token).
TEST_F(SemaphoreTest, TheHoldersKeyIsASkiplistFromTheFirstHolder) {
  const auto r = resource("encoding");
  auto p = svc->acquire(r, permits(4));
  ASSERT_TRUE(p);
  EXPECT_GT(p->token().size(), 64u);
  EXPECT_EQ(client->exec(redis::Command{"OBJECT", "ENCODING", svc->keys().permit_holders_key(r)}).str, "skiplist");
  EXPECT_TRUE(p->release());
}

TEST_F(SemaphoreTest, AForceReleaseFreesOnePermitAdvancesTheFenceAndIsListed) {
  const auto r = resource("ops");
  const auto key = svc->keys().permit_holders_key(r);
  auto a = svc->acquire(r, permits(3));
  auto b = svc->acquire(r, permits(3));
  ASSERT_TRUE(a && b);
  const auto sems = admin::list_semaphores(*svc, {.prefix = r});
  ASSERT_EQ(sems.size(), 1u);
  EXPECT_EQ(sems[0].holders.size(), 2u);
  const std::string owner = token_owner(a->token());
  admin::PermitReleaseOptions o{.reason = "test"};
  EXPECT_THROW(admin::force_release_permit(*svc, r, o), Error);  // which permit?
  o.holder = owner;  // this process holds both: ambiguous
  try {
    admin::force_release_permit(*svc, r, o);
    FAIL() << "an owner of two permits released without a slot";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::invalid_argument));
    EXPECT_NE(std::string(e.what()).find("holds 2 permits"), std::string::npos) << e.what();
  }
  o.slot = b->permit_slot();
  const auto res = admin::force_release_permit(*svc, r, o);
  ASSERT_EQ(res.outcome, admin::ForceReleaseResult::Outcome::released);
  EXPECT_EQ(res.permit_slot, b->permit_slot());
  EXPECT_EQ(res.holder, owner);
  EXPECT_GT(res.new_fence, *b->fence());
  EXPECT_FALSE(res.audit_id.empty());
  expect_slots_covered(*client, key);
  EXPECT_FALSE(b->extend(10s));
  EXPECT_FALSE(b->release());
  EXPECT_EQ(admin::force_release_permit(*svc, r, o).outcome, admin::ForceReleaseResult::Outcome::not_held);
  auto c = svc->acquire(r, permits(3));
  ASSERT_TRUE(c);
  EXPECT_EQ(c->permit_slot(), res.permit_slot);
  EXPECT_GT(*c->fence(), res.new_fence);
}

TEST_F(SemaphoreTest, AttemptsAndReleasesOfOneTurnShareOneCallAndKeepTheirOwnAnswers) {
  const auto r = resource("turn");
  ASSERT_TRUE(svc->acquire(r, permits(5))->release());  // the scripts are loaded
  const auto before = script_calls();
  // Eight try-once attempts started in one turn of the loop: one call, the
  // first five granted in order with their own slots and rising fences.
  auto got = acquire_in_one_turn(r, std::vector<LockOptions>(8, permits(5)));
  EXPECT_LE(script_calls() - before, 2);
  std::set<int> slots;
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(got[static_cast<std::size_t>(i)].has_value(), i < 5) << "attempt " << i;
    if (i >= 5) continue;
    slots.insert(got[static_cast<std::size_t>(i)]->permit_slot());
    if (i > 0) {
      EXPECT_GT(*got[static_cast<std::size_t>(i)]->fence(), *got[static_cast<std::size_t>(i - 1)]->fence());
    }
  }
  EXPECT_EQ(slots, (std::set<int>{0, 1, 2, 3, 4}));
  expect_slots_covered(*client, svc->keys().permit_holders_key(r));
  // Five releases (one of a permit whose lease ended) in one turn: one call,
  // each its own answer, the key gone with the last holder.
  client->exec(redis::Command{"ZADD", svc->keys().permit_holders_key(r), "XX", "1",
                              got[4]->token() + " " + std::to_string(got[4]->permit_slot())});  // expired
  const auto before_release = script_calls();
  const auto answers = release_in_one_turn(got);
  EXPECT_LE(script_calls() - before_release, 2);
  EXPECT_EQ(answers, (std::vector<int>{1, 1, 1, 1, 0, -1, -1, -1}));
  EXPECT_EQ(client->exec(redis::Command{"EXISTS", svc->keys().permit_holders_key(r)}).integer, 0);
  for (auto& l : got) {
    if (l) l->detach();
  }
}

// A call's attempts share their TTL, fence and wait (sem_acquire.lua's ARGV
// 4-7): attempts of one turn that differ in them go in separate calls, and
// each holder's lease ends at its own TTL, with a fence only when it asked.
TEST_F(SemaphoreTest, AttemptsOfOneTurnWithDifferentTermsKeepTheirOwnTtlAndFence) {
  const auto r = resource("terms");
  ASSERT_TRUE(svc->acquire(r, permits(6))->release());  // the scripts are loaded
  LockOptions short_fenced = permits(6, 5s), long_plain = permits(6, 60s), short_waiting = permits(6, 5s, 10s);
  long_plain.fence = false;
  const auto before = script_calls();
  auto got = acquire_in_one_turn(r, {short_fenced, long_plain, short_waiting, long_plain, short_fenced});
  // Three sets of terms: three calls (and room for one reload).
  EXPECT_GE(script_calls() - before, 3);
  EXPECT_LE(script_calls() - before, 4);
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(got[i]) << "attempt " << i;
  EXPECT_TRUE(got[0]->fence() && got[2]->fence() && got[4]->fence());
  EXPECT_FALSE(got[1]->fence() || got[3]->fence());
  std::set<int> slots;
  for (auto& l : got) slots.insert(l->permit_slot());
  EXPECT_EQ(slots, (std::set<int>{0, 1, 2, 3, 4}));
  expect_slots_covered(*client, svc->keys().permit_holders_key(r));
  const auto now = server_ms();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto member = got[i]->token() + " " + std::to_string(got[i]->permit_slot());
    const auto score = client->exec(redis::Command{"ZSCORE", svc->keys().permit_holders_key(r), member});
    ASSERT_TRUE(score.is_string()) << "attempt " << i << " has no holder entry " << member;
    const auto left = std::stoll(score.str) - now;
    if (i % 2 == 1) EXPECT_GT(left, 50'000) << "attempt " << i;
    else EXPECT_LE(left, 5'000) << "attempt " << i;
  }
  // The key lives as long as its longest lease.
  EXPECT_GT(client->exec(redis::Command{"PTTL", svc->keys().permit_holders_key(r)}).integer, 50'000);
  for (auto& l : got) EXPECT_TRUE(l->release());
}

TEST_F(SemaphoreTest, AWaiterIsWokenByTheReleaseNotByItsPoll) {
  const auto r = resource("pay");
  auto a = svc->acquire(r, permits(2));
  auto b = svc->acquire(r, permits(2));
  ASSERT_TRUE(a && b);
  auto c2 = make_client();
  auto svc2 = LockService::create(*c2);
  // Its polls are 30..60 s apart: only the release's wake can grant it soon.
  LockOptions o = permits(2, 10s, 120s);
  o.backoff_max = 60s;
  auto f = std::async(std::launch::async, [&] { return svc2->acquire(r, o); });
  ASSERT_TRUE(eventually([&] { return line_size(r) == 1; }));
  // The waiter is subscribed once it has looked again after its subscription.
  ASSERT_TRUE(eventually([&] {
    auto n = client->exec(redis::Command{"PUBSUB", "NUMSUB", svc->keys().permit_channel(r)});
    return n.elements.size() == 2 && n.elements[1].integer == 1;
  }));
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(a->release());
  ASSERT_EQ(f.wait_for(20s), std::future_status::ready) << "the waiter was not woken by the release";
  auto p = f.get();
  ASSERT_TRUE(p);
  EXPECT_EQ(line_size(r), 0);
}

TEST_F(SemaphoreTest, WaitersAreServedInArrivalOrder) {
  const auto r = resource("pay");
  auto first = svc->acquire(r, permits(1));
  ASSERT_TRUE(first);
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::future<void>> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.push_back(std::async(std::launch::async, [&, i] {
      auto p = svc->acquire(r, permits(1, 10s, 30s));
      ASSERT_TRUE(p);
      {
        std::lock_guard g(mu);
        order.push_back(i);
      }
      std::this_thread::sleep_for(20ms);
      p->release();
    }));
    // The next one arrives only once this one has its place.
    ASSERT_TRUE(eventually([&] { return line_size(r) == i + 1; })) << "waiter " << i;
  }
  first->release();
  for (auto& w : waiters) w.get();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}

TEST_F(SemaphoreTest, ATryOnceAcquireDoesNotJumpTheLine) {
  const auto r = resource("pay");
  auto a = svc->acquire(r, permits(1));
  ASSERT_TRUE(a);
  auto f = std::async(std::launch::async, [&] { return svc->acquire(r, permits(1, 10s, 30s)); });
  ASSERT_TRUE(eventually([&] { return line_size(r) == 1; }));
  // With the permit free but a waiter ahead, a newcomer is busy: the permit
  // is the waiter's (the release woke it).
  client->exec(redis::Command{"ZREM", svc->keys().permit_holders_key(r), a->token() + " 0"});
  a->detach();
  EXPECT_FALSE(svc->acquire(r, permits(1)));
  auto p = f.get();
  EXPECT_TRUE(p);
}

TEST_F(SemaphoreTest, ACrashedHoldersPermitComesBackWhenItsLeaseExpiresNotBefore) {
  const auto r = resource("pay");
  auto crashed = svc->acquire(r, permits(1, 800ms));
  ASSERT_TRUE(crashed);
  const auto expiry = std::stoll(
      client->exec(redis::Command{"ZSCORE", svc->keys().permit_holders_key(r), crashed->token() + " 0"}).str);
  crashed->detach();  // never released: the process "died"
  int busy = 0;
  std::optional<Lock> next;
  while (!next) {
    const auto before = server_ms();
    next = svc->acquire(r, permits(1));
    if (!next) {
      ++busy;
      continue;
    }
    // Granted by a script that ran after `before`: the lease had ended.
    EXPECT_GE(server_ms(), expiry) << "granted before the crashed holder's lease expired";
    (void)before;
  }
  EXPECT_GT(busy, 0);
  EXPECT_EQ(next->permit_slot(), 0);
}

TEST_F(SemaphoreTest, AWaiterGetsACrashedHoldersPermitAtItsNextPoll) {
  const auto r = resource("pay");
  auto crashed = svc->acquire(r, permits(1, 500ms));
  ASSERT_TRUE(crashed);
  crashed->detach();
  LockOptions o = permits(1, 10s, 30s);
  o.backoff_max = 100ms;
  auto p = svc->acquire(r, o);
  ASSERT_TRUE(p);
}

TEST_F(SemaphoreTest, ALoweredCountGrantsNothingUntilTheHoldersAreFewer) {
  const auto r = resource("pay");
  std::vector<Lock> held;
  for (int i = 0; i < 3; ++i) {
    auto p = svc->acquire(r, permits(3));
    ASSERT_TRUE(p);
    held.push_back(std::move(*p));
  }
  set_permits(*svc, r, 1);
  EXPECT_EQ(inspect_semaphore(*svc, r).stored_permits, 1);
  // The stored count overrides the acquire's own 3.
  EXPECT_TRUE(held[0].release());
  EXPECT_FALSE(svc->acquire(r, permits(3)));
  EXPECT_TRUE(held[1].release());
  EXPECT_FALSE(svc->acquire(r, permits(3)));
  EXPECT_TRUE(held[2].release());
  auto p = svc->acquire(r, permits(3));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->permits(), 1);
  EXPECT_FALSE(svc->acquire(r, permits(3)));
  // Raised again: a waiter is woken by the change.
  LockOptions o = permits(3, 10s, 60s);
  o.backoff_max = 30s;
  auto f = std::async(std::launch::async, [&] { return svc->acquire(r, o); });
  ASSERT_TRUE(eventually([&] { return line_size(r) == 1; }));
  ASSERT_TRUE(eventually([&] {
    auto n = client->exec(redis::Command{"PUBSUB", "NUMSUB", svc->keys().permit_channel(r)});
    return n.elements.size() == 2 && n.elements[1].integer == 1;
  }));
  clear_permits(*svc, r);
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(f.get());
  EXPECT_FALSE(inspect_semaphore(*svc, r).stored_permits);
}

TEST_F(SemaphoreTest, AnAcquireAskingFewerPermitsThanAreHeldIsBusy) {
  const auto r = resource("pay");
  auto a = svc->acquire(r, permits(3));
  auto b = svc->acquire(r, permits(3));
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(svc->acquire(r, permits(2)));
  EXPECT_TRUE(svc->acquire(r, permits(3)));
}

TEST_F(SemaphoreTest, FencesIncreaseAcrossPermitsAndShareTheMutexCounter) {
  const auto r = resource("pay");
  std::int64_t last = 0;
  for (int i = 0; i < 5; ++i) {
    auto p = svc->acquire(r, permits(2));
    ASSERT_TRUE(p && p->fence());
    EXPECT_GT(*p->fence(), last);
    last = *p->fence();
  }
  LockOptions m;
  m.fence = true;
  auto mutex = svc->acquire(r, m);
  ASSERT_TRUE(mutex && mutex->fence());
  EXPECT_GT(*mutex->fence(), last);
  EXPECT_EQ(inspect_semaphore(*svc, r).fence, mutex->fence());
}

TEST_F(SemaphoreTest, AWaiterThatGivesUpLeavesTheLine) {
  const auto r = resource("pay");
  auto a = svc->acquire(r, permits(1));
  ASSERT_TRUE(a);
  EXPECT_FALSE(svc->acquire(r, permits(1, 10s, 300ms)));
  ASSERT_TRUE(eventually([&] { return line_size(r) == 0; }));
  a->release();
  EXPECT_TRUE(svc->acquire(r, permits(1)));
}

TEST_F(SemaphoreTest, BadOptionsAreRefusedBeforeAnythingIsSent) {
  LockOptions o = permits(2);
  o.fair = true;
  EXPECT_THROW(svc->acquire(resource("x"), o), Error);
  EXPECT_THROW(svc->acquire(resource("x"), permits(LockOptions::kMaxPermits + 1)), Error);
  EXPECT_THROW(svc->acquire(resource("x"), permits(-1)), Error);
  EXPECT_THROW(set_permits(*svc, resource("x"), 0), Error);
}

TEST_F(SemaphoreTest, EveryKeyOfASemaphoreIsInTheResourcesSlot) {
  const auto& k = svc->keys();
  for (const auto& key : {k.permit_holders_key("inv:1"), k.permit_line_key("inv:1"), k.permit_line_expiry_key("inv:1"),
                          k.permit_count_key("inv:1"), k.permit_channel("inv:1"), k.fence_key("inv:1")})
    EXPECT_NE(key.find("{inv:1}"), std::string::npos) << key;
}

// The four numbers per class (docs/observability.md), counted for permits as
// for locks: grants, busy answers and contended calls, holds, lost leases.
TEST_F(SemaphoreTest, TheClassNumbersCountPermitsAsTheyCountLocks) {
  const auto r = resource("psp");
  observe::Registry registry;  // before the client: scope-exit releases count into it from the loop
  auto c2 = make_client();
  auto svc2 = LockService::create(*c2, LockServiceOptions{.metrics = &registry});
  auto sched2 = LeaseScheduler::create(svc2);
  LockOptions o = permits(2, 1s);
  o.lock_class = "psp";
  auto& m = registry.lock_class("psp");
  auto p1 = svc2->acquire(r, o);
  auto p2 = svc2->acquire(r, o);
  ASSERT_TRUE(p1 && p2);
  EXPECT_FALSE(svc2->acquire(r, o));
  EXPECT_EQ(m.acquisitions_total.value(), 2u);
  EXPECT_EQ(m.busy_total.value(), 1u);
  EXPECT_EQ(m.contended_total.value(), 1u);
  EXPECT_EQ(m.wait_seconds.snapshot().count, 3u);
  EXPECT_TRUE(p1->release());
  ASSERT_TRUE(eventually([&] { return m.releases_total.value() == 1; }));
  EXPECT_EQ(m.hold_seconds.snapshot().count, 1u);
  Lease lease = sched2->adopt(std::move(*p2));
  const auto freed = admin::force_release_permit(*svc, r, {.reason = "test", .slot = lease.lock_at(0).permit_slot()});
  EXPECT_EQ(freed.outcome, admin::ForceReleaseResult::Outcome::released);
  ASSERT_TRUE(eventually([&] { return lease.lost(); }, 5s));
  ASSERT_TRUE(eventually([&] { return m.hold_seconds.snapshot().count == 2; }));
  EXPECT_EQ(m.leases_lost_total.value(), 1u);
}

TEST_F(SemaphoreTest, TheAsyncFormsGrantAndReleaseAPermit) {
  const auto r = resource("pay");
  std::promise<std::optional<Lock>> p;
  svc->async_acquire(r, permits(1), [&](const Error& e, std::optional<Lock> l) {
    EXPECT_FALSE(e) << e.what();
    p.set_value(std::move(l));
  });
  auto l = p.get_future().get();
  ASSERT_TRUE(l);
  std::promise<bool> rel;
  boost::asio::co_spawn(
      client->get_executor(),
      [&]() -> boost::asio::awaitable<void> {
        auto second = co_await async_acquire(*svc, r, permits(1), boost::asio::use_awaitable);
        EXPECT_FALSE(second);
        const bool ours = co_await async_release(*l, boost::asio::use_awaitable);
        rel.set_value(ours);
      },
      boost::asio::detached);
  EXPECT_TRUE(rel.get_future().get());
  EXPECT_TRUE(svc->acquire(r, permits(1)));
}

class SemaphoreLeaseTest : public LeaseTest {};

TEST_F(SemaphoreLeaseTest, APermitsLeaseRenewsAndIsLostWhenItsEntryGoes) {
  const auto r = resource("pay");
  auto lease = sched->acquire(r, permits(2, 300ms));
  ASSERT_TRUE(lease);
  std::this_thread::sleep_for(1s);  // three TTLs: only renewals keep it
  EXPECT_FALSE(lease->lost()) << lease->reason();
  EXPECT_GT(lease->renewals(), 0u);
  auto info = inspect_semaphore(*svc, r);
  ASSERT_EQ(info.holders.size(), 1u);
  // Taken away (an operator, or a server that lost it): the lease is lost.
  client->exec(redis::Command{"DEL", svc->keys().permit_holders_key(r)});
  ASSERT_TRUE(eventually([&] { return lease->lost(); }));
  EXPECT_EQ(lease->state(), LeaseState::token_gone);
}

TEST_F(SemaphoreLeaseTest, ALeaseReleasesItsPermit) {
  const auto r = resource("pay");
  auto lease = sched->acquire(r, permits(1, 5s));
  ASSERT_TRUE(lease);
  EXPECT_FALSE(svc->acquire(r, permits(1)));
  EXPECT_TRUE(lease->release());
  EXPECT_TRUE(svc->acquire(r, permits(1)));
}

class SemaphoreQuarantineTest : public test::RedisTest {
 protected:
  void SetUp() override {
    trust_new_server_ = false;
    RedisTest::SetUp();
  }
};

TEST_F(SemaphoreQuarantineTest, AServerThatLostLockStateIsRefusedPermits) {
  auto c = make_client();
  auto svc = LockService::create(*c, KeyBuilder(), QuarantineOptions{.max_ttl = 2s});
  try {
    auto p = svc->acquire("pay", permits(2, 1s));
    FAIL() << "granted a permit by a server without a lock-state record";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::server_busy));
    EXPECT_NE(std::string(e.what()).find("server lost lock state"), std::string::npos) << e.what();
  }
  // Nothing was written.
  EXPECT_EQ(admin("EXISTS jobguard:sem:{pay}"), "0");
}

}  // namespace
}  // namespace jobguard
