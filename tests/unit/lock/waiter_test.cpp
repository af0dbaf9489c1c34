// The lock waiter's state machine on a fake clock, no server: every race of
// docs/lock-safety.md "Waiting" / "Direct handoff" and tests/integration/lock,
// including the ones a real server cannot be made to produce on demand (a
// grant landing while the head's own attempt is on the wire, a grant during
// the gate's check, a grant followed by a reply from an unchecked connection).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lock/waiter.hpp"

using namespace std::chrono_literals;
using jobguard::detail::WaiterMachine;
using Kind = WaiterMachine::Action::Kind;
using Reply = WaiterMachine::Reply;
using Heard = WaiterMachine::Heard;
using Result = WaiterMachine::Result;
using T = WaiterMachine::time_point;

namespace {

const T t0 = T(std::chrono::hours(1000));

std::string name(Kind k) {
  switch (k) {
    case Kind::send_attempt: return "send_attempt";
    case Kind::arm_timer: return "arm_timer";
    case Kind::cancel_timer: return "cancel_timer";
    case Kind::subscribe: return "subscribe";
    case Kind::unsubscribe: return "unsubscribe";
    case Kind::discard_grant: return "discard_grant";
    case Kind::leave_queue: return "leave_queue";
    case Kind::abandon: return "abandon";
    case Kind::pass_on_grant: return "pass_on_grant";
    case Kind::complete: return "complete";
  }
  return "?";
}

// Action kinds as words, so a failure reads as the sequence it got.
std::vector<std::string> kinds(const WaiterMachine::Actions& a) {
  std::vector<std::string> out;
  for (const auto& x : a) out.push_back(name(x.kind));
  return out;
}
using V = std::vector<std::string>;

const WaiterMachine::Action& last(const WaiterMachine::Actions& a) { return a[a.size() - 1]; }

WaiterMachine::Config plain(std::chrono::milliseconds wait = 10s) {
  return {.ttl = 30s, .wait = wait, .fair = false, .backoff_min = 5ms, .backoff_max = 200ms};
}
WaiterMachine::Config fair(std::chrono::milliseconds wait = 10s, std::chrono::milliseconds ttl = 10s) {
  return {.ttl = ttl, .wait = wait, .fair = true, .backoff_min = 5ms, .backoff_max = 200ms};
}

WaiterMachine machine(WaiterMachine::Config c, std::uint64_t seed) {
  WaiterMachine m(c);
  m.seed(seed);
  return m;
}

// Starts `m` at t0, sends its attempt at t0 + 1 ms and answers busy; the
// waiter subscribes and hears `h`. Returns what it did then.
WaiterMachine::Actions queue_up(WaiterMachine& m, Heard h = Heard::yes) {
  EXPECT_EQ(kinds(m.start(t0)), V{"send_attempt"});
  m.sent(t0 + 1ms);
  EXPECT_EQ(kinds(m.reply(t0 + 2ms, Reply::busy)), V{"subscribe"});
  return m.subscribed(t0 + 2ms, h);
}

// The list ends the acquire with the lock, its TTL counted from `ttl_from`.
void expect_granted(const WaiterMachine::Actions& a, T ttl_from, std::optional<std::int64_t> fence) {
  ASSERT_FALSE(a.empty());
  const auto& c = a[a.size() - 1];
  EXPECT_EQ(c.kind, Kind::complete);
  EXPECT_EQ(c.result, Result::granted);
  EXPECT_EQ(c.at, ttl_from);
  EXPECT_EQ(c.fence(), fence);
}

// A queued waiter whose refresh (its backoff timer fired at t0 + 150 ms) is
// on the wire, sent at t0 + 150 ms.
void refresh_on_the_wire(WaiterMachine& m) {
  ASSERT_EQ(kinds(queue_up(m)), V{"arm_timer"});
  ASSERT_EQ(kinds(m.timer_fired(t0 + 150ms)), V{"send_attempt"});
  m.sent(t0 + 150ms);
}

}  // namespace

// --- trying once -------------------------------------------------------------

TEST(WaiterMachine, TryOnceGrantedCountsTheTtlFromTheSendNotTheReply) {
  WaiterMachine m = machine(plain(0ms), 1);
  EXPECT_EQ(kinds(m.start(t0)), V{"send_attempt"});
  m.sent(t0 + 1ms);
  const auto a = m.reply(t0 + 40ms, Reply::granted, 7);
  ASSERT_EQ(kinds(a), V{"complete"});
  EXPECT_EQ(a[0].result, Result::granted);
  EXPECT_EQ(a[0].at, t0 + 1ms);
  EXPECT_EQ(a[0].fence(), 7);
  EXPECT_TRUE(m.done());
  EXPECT_FALSE(m.saw_busy());
}

TEST(WaiterMachine, TryOnceBusyGivesUpWithoutListening) {
  WaiterMachine m = machine(plain(0ms), 1);
  m.start(t0);
  m.sent(t0);
  const auto a = m.reply(t0 + 1ms, Reply::busy);
  ASSERT_EQ(kinds(a), V{"complete"});
  EXPECT_EQ(a[0].result, Result::busy);
  EXPECT_TRUE(m.saw_busy());
}

TEST(WaiterMachine, ARedisErrorFailsTheAcquire) {
  WaiterMachine m = machine(plain(), 1);
  m.start(t0);
  m.sent(t0);
  const auto a = m.reply(t0 + 1ms, Reply::error);
  ASSERT_EQ(kinds(a), V{"complete"});
  EXPECT_EQ(a[0].result, Result::failed);
}

// --- plain waiting -------------------------------------------------------------

TEST(WaiterMachine, PlainWaiterListensOnlyAfterItsFirstBusyAttempt) {
  WaiterMachine m = machine(plain(), 1);
  EXPECT_EQ(kinds(m.start(t0)), V{"send_attempt"});
  m.sent(t0);
  EXPECT_EQ(kinds(m.reply(t0 + 1ms, Reply::busy)), V{"subscribe"});
  EXPECT_EQ(kinds(m.subscribed(t0 + 1ms, Heard::yes)), V{"arm_timer"});
  // A second busy attempt does not subscribe again.
  EXPECT_EQ(kinds(m.timer_fired(t0 + 10ms)), V{"send_attempt"});
  m.sent(t0 + 10ms);
  EXPECT_EQ(kinds(m.reply(t0 + 11ms, Reply::busy)), V{"arm_timer"});
}

TEST(WaiterMachine, AChannelConfirmedWhileTheBusyAttemptFlewMeansLookingAgain) {
  // The release may have been published between the attempt and the
  // confirmation, where nobody heard it.
  WaiterMachine m = machine(plain(), 1);
  EXPECT_EQ(kinds(queue_up(m, Heard::look_again)), V{"send_attempt"});
}

TEST(WaiterMachine, AChannelNotYetConfirmedWakesTheWaiterWithItsConfirmation) {
  WaiterMachine m = machine(plain(), 1);
  EXPECT_EQ(kinds(queue_up(m, Heard::on_ready)), V{"arm_timer"});
  // The shell reports the confirmation as a wake.
  EXPECT_EQ(kinds(m.release_message(t0 + 3ms)), (V{"cancel_timer", "send_attempt"}));
}

TEST(WaiterMachine, WaiterIsWokenByTheReleaseNotBackoff) {
  WaiterMachine m = machine(WaiterMachine::Config{.ttl = 30s, .wait = 20s, .backoff_min = 10s, .backoff_max = 10s}, 3);
  const auto armed = queue_up(m);
  ASSERT_EQ(kinds(armed), V{"arm_timer"});
  EXPECT_EQ(kinds(m.release_message(t0 + 300ms)), (V{"cancel_timer", "send_attempt"}));
  m.sent(t0 + 300ms);
  const auto a = m.reply(t0 + 301ms, Reply::granted);
  EXPECT_EQ(kinds(a), (V{"unsubscribe", "complete"}));
  EXPECT_EQ(last(a).result, Result::granted);
  EXPECT_EQ(last(a).at, t0 + 300ms);
}

TEST(WaiterMachine, AReleaseHeardWhileAnAttemptIsInFlightMeansOneMoreAttemptAtOnce) {
  // The attempt on the wire may have run before the release: its busy reply
  // must not put the waiter to sleep through the release.
  WaiterMachine m = machine(plain(), 1);
  ASSERT_EQ(kinds(queue_up(m)), V{"arm_timer"});
  ASSERT_EQ(kinds(m.timer_fired(t0 + 50ms)), V{"send_attempt"});
  m.sent(t0 + 50ms);
  EXPECT_TRUE(m.release_message(t0 + 51ms).empty());
  EXPECT_EQ(kinds(m.reply(t0 + 52ms, Reply::busy)), V{"send_attempt"});
}

TEST(WaiterMachine, AReleaseHeardDuringTheGateCheckAlsoMeansLookingAgain) {
  WaiterMachine m = machine(plain(), 1);
  ASSERT_EQ(kinds(queue_up(m)), V{"arm_timer"});
  ASSERT_EQ(kinds(m.timer_fired(t0 + 50ms)), V{"send_attempt"});
  EXPECT_TRUE(m.release_message(t0 + 51ms).empty());  // the gate is still checking
  m.sent(t0 + 60ms);
  EXPECT_EQ(kinds(m.reply(t0 + 61ms, Reply::busy)), V{"send_attempt"});
}

TEST(WaiterMachine, LostNotificationCostsOneBackoffNotAHang) {
  // The lock was deleted behind our back (a plain DEL, a reconnecting
  // subscriber): no message comes, the backoff timer finds the free lock.
  WaiterMachine m = machine(plain(), 1);
  const auto armed = queue_up(m);
  ASSERT_EQ(kinds(armed), V{"arm_timer"});
  EXPECT_LE(armed[0].at, t0 + 2ms + 5ms);  // the first backoff is at most backoff_min
  ASSERT_EQ(kinds(m.timer_fired(armed[0].at)), V{"send_attempt"});
  m.sent(armed[0].at);
  EXPECT_EQ(last(m.reply(armed[0].at + 1ms, Reply::granted)).result, Result::granted);
}

TEST(WaiterMachine, PlainBackoffIsFullJitterUnderADoublingCap) {
  // [0, min(max, min * 2^n)]: 5, 10, 20, ... 160, then 200 ms for good.
  const std::vector<long long> caps = {5, 10, 20, 40, 80, 160, 200, 200, 200};
  std::vector<std::vector<long long>> drawn(caps.size());
  for (std::uint64_t seed = 0; seed < 3000; ++seed) {
    WaiterMachine m = machine(plain(1h), seed);
    auto a = queue_up(m);
    T now = t0 + 2ms;
    for (std::size_t n = 0; n < caps.size(); ++n) {
      ASSERT_EQ(kinds(a), V{"arm_timer"});
      const auto slept = std::chrono::duration_cast<std::chrono::milliseconds>(a[0].at - now).count();
      ASSERT_GE(slept, 0);
      ASSERT_LE(slept, caps[n]) << "sleep " << n;
      drawn[n].push_back(slept);
      now = a[0].at;
      m.timer_fired(now);
      m.sent(now);
      a = m.reply(now, Reply::busy);
    }
  }
  // Jitter, not a fixed schedule: both ends of the range occur.
  for (std::size_t n = 0; n < caps.size(); ++n) {
    EXPECT_EQ(*std::min_element(drawn[n].begin(), drawn[n].end()), 0) << n;
    EXPECT_EQ(*std::max_element(drawn[n].begin(), drawn[n].end()), caps[n]) << n;
  }
}

TEST(WaiterMachine, BackoffNeverSleepsPastTheDeadlineAndTheWaitEndsThere) {
  WaiterMachine m = machine(WaiterMachine::Config{.ttl = 30s, .wait = 300ms, .backoff_min = 10s, .backoff_max = 10s}, 1);
  const auto a = queue_up(m);
  ASSERT_EQ(kinds(a), V{"arm_timer"});
  EXPECT_EQ(a[0].at, t0 + 300ms);
  ASSERT_EQ(kinds(m.timer_fired(t0 + 300ms)), V{"send_attempt"});
  m.sent(t0 + 300ms);
  const auto end = m.reply(t0 + 301ms, Reply::busy);
  EXPECT_EQ(kinds(end), (V{"unsubscribe", "complete"}));
  EXPECT_EQ(last(end).result, Result::busy);
}

TEST(WaiterMachine, AStaleTimerWhileAnAttemptIsInFlightIsIgnored) {
  WaiterMachine m = machine(plain(), 1);
  ASSERT_EQ(kinds(queue_up(m)), V{"arm_timer"});
  ASSERT_EQ(kinds(m.release_message(t0 + 3ms)), (V{"cancel_timer", "send_attempt"}));
  EXPECT_TRUE(m.timer_fired(t0 + 4ms).empty());
  m.sent(t0 + 4ms);
  EXPECT_TRUE(m.timer_fired(t0 + 5ms).empty());
}

TEST(WaiterMachine, EventsAfterTheEndAreIgnored) {
  WaiterMachine m = machine(plain(0ms), 1);
  m.start(t0);
  m.sent(t0);
  m.reply(t0, Reply::granted);
  ASSERT_TRUE(m.done());
  EXPECT_TRUE(m.timer_fired(t0 + 1s).empty());
  EXPECT_TRUE(m.release_message(t0 + 1s).empty());
  EXPECT_TRUE(m.grant_message(t0 + 1s, std::nullopt).empty());
  EXPECT_TRUE(m.reply(t0 + 1s, Reply::granted).empty());
  EXPECT_TRUE(m.cancel(t0 + 1s).empty());
}

// --- the gate (quarantine) -----------------------------------------------------

TEST(WaiterMachine, AQuarantineEndingWithinTheWaitIsWaitedOut) {
  WaiterMachine m = machine(plain(2s), 1);
  m.start(t0);
  const auto a = m.refused(t0 + 1ms, 500ms);
  ASSERT_EQ(kinds(a), V{"arm_timer"});
  EXPECT_EQ(a[0].at, t0 + 501ms);
  EXPECT_EQ(kinds(m.timer_fired(t0 + 501ms)), V{"send_attempt"});
}

TEST(WaiterMachine, AQuarantineOutlastingTheWaitFailsTheAcquire) {
  WaiterMachine m = machine(plain(2s), 1);
  m.start(t0);
  const auto a = m.refused(t0 + 1ms, 5s);
  ASSERT_EQ(kinds(a), V{"complete"});
  EXPECT_EQ(a[0].result, Result::failed);
}

TEST(WaiterMachine, AGrantFromAnUncheckedConnectionIsHandedBackAndAskedAgain) {
  WaiterMachine m = machine(plain(), 1);
  m.start(t0);
  m.sent(t0);
  EXPECT_EQ(kinds(m.reply(t0 + 1ms, Reply::unchecked_grant)), (V{"discard_grant", "send_attempt"}));
  m.sent(t0 + 2ms);
  const auto a = m.reply(t0 + 3ms, Reply::granted);
  EXPECT_EQ(last(a).result, Result::granted);
  EXPECT_EQ(last(a).at, t0 + 2ms);
}

TEST(WaiterMachine, AnEvictionSeenByTheScriptAsksAgainAfterTheGate) {
  WaiterMachine m = machine(plain(0ms), 1);
  m.start(t0);
  m.sent(t0);
  EXPECT_EQ(kinds(m.reply(t0 + 1ms, Reply::retry)), V{"send_attempt"});
  EXPECT_FALSE(m.saw_busy());
}

// --- fair waiting and direct handoff -------------------------------------------

TEST(WaiterMachine, AQueuedFairWaiterOnlyRefreshesItsPlaceEveryHalfToFullBackoffMax) {
  for (std::uint64_t seed = 0; seed < 100; ++seed) {
    WaiterMachine m = machine(fair(1h), seed);
    auto a = queue_up(m);
    T now = t0 + 2ms;
    for (int n = 0; n < 5; ++n) {
      ASSERT_EQ(kinds(a), V{"arm_timer"});
      EXPECT_GE(a[0].at - now, 100ms);
      EXPECT_LE(a[0].at - now, 200ms);
      now = a[0].at;
      m.timer_fired(now);
      m.sent(now);
      a = m.reply(now, Reply::busy);
    }
  }
}

// A default-mode waiter the server put in line is woken by name when its
// turn comes: like a queued fair waiter it polls only every half to full
// backoff_max (a faster poll would take the lock from the waiter woken
// ahead of it), and a release message still wakes it at once.
TEST(WaiterMachine, APlainWaiterInLinePollsLikeAQueuedFairWaiterAndIsWokenAtOnce) {
  for (std::uint64_t seed = 0; seed < 100; ++seed) {
    WaiterMachine m = machine(plain(1h), seed);
    EXPECT_EQ(kinds(m.start(t0)), V{"send_attempt"});
    m.sent(t0 + 1ms);
    m.in_line();
    EXPECT_EQ(kinds(m.reply(t0 + 2ms, Reply::busy)), V{"subscribe"});
    auto a = m.subscribed(t0 + 2ms, Heard::yes);
    T now = t0 + 2ms;
    for (int n = 0; n < 5; ++n) {
      ASSERT_EQ(kinds(a), V{"arm_timer"});
      EXPECT_GE(a[0].at - now, 100ms) << seed;
      EXPECT_LE(a[0].at - now, 200ms) << seed;
      now = a[0].at;
      m.timer_fired(now);
      m.sent(now);
      a = m.reply(now, Reply::busy);
    }
    EXPECT_EQ(kinds(m.release_message(now + 1ms)), (V{"cancel_timer", "send_attempt"}));
  }
}

// --- the releaser's yield (default mode) -------------------------------------------

TEST(WaiterMachine, AWaitAfterOurReleaseWokeAWaiterHoldsItsFirstAttemptUntilTheYieldEnds) {
  WaiterMachine m = machine(plain(), 1);
  m.yield_until(t0 + 1ms);
  const auto a = m.start(t0);
  ASSERT_EQ(kinds(a), V{"arm_timer"});
  EXPECT_EQ(a[0].at, t0 + 1ms);
  EXPECT_FALSE(m.attempt_in_flight());
  // Not listening yet (no subscribe was asked for): the timer ends the
  // yield, then it asks as usual.
  EXPECT_EQ(kinds(m.timer_fired(t0 + 1ms)), V{"send_attempt"});
  m.sent(t0 + 1ms);
  // The TTL counts from the attempt, not from the start of the yield.
  expect_granted(m.reply(t0 + 2ms, Reply::granted), t0 + 1ms, std::nullopt);
}

TEST(WaiterMachine, AYieldEndedByTheWokenWaitersGrantLeadsIntoTheLineAsUsual) {
  WaiterMachine m = machine(plain(), 1);
  m.yield_until(t0 + 1ms);
  m.start(t0);
  ASSERT_EQ(kinds(m.timer_fired(t0 + 1ms)), V{"send_attempt"});
  m.sent(t0 + 1ms);
  EXPECT_EQ(kinds(m.reply(t0 + 2ms, Reply::busy)), V{"subscribe"});
}

TEST(WaiterMachine, TryOnceFairAndPastDeadlineYieldsAreIgnored) {
  {
    WaiterMachine m = machine(plain(0ms), 1);
    m.yield_until(t0 + 1ms);
    EXPECT_EQ(kinds(m.start(t0)), V{"send_attempt"});
  }
  {
    WaiterMachine m = machine(fair(), 1);
    m.yield_until(t0 + 1ms);
    EXPECT_EQ(kinds(m.start(t0)), V{"send_attempt"});
  }
  {
    WaiterMachine m = machine(plain(2ms), 1);
    m.yield_until(t0 + 3ms);  // would outlast the wait
    EXPECT_EQ(kinds(m.start(t0)), V{"send_attempt"});
  }
  {
    WaiterMachine m = machine(plain(), 1);
    m.yield_until(t0);  // already over
    EXPECT_EQ(kinds(m.start(t0)), V{"send_attempt"});
  }
}

TEST(WaiterMachine, CancelDuringTheYieldEndsAtOnceWithoutAnAttempt) {
  WaiterMachine m = machine(plain(), 1);
  m.yield_until(t0 + 1ms);
  m.start(t0);
  const auto a = m.cancel(t0 + 500us);
  EXPECT_EQ(kinds(a), (V{"cancel_timer", "complete"}));
  EXPECT_EQ(last(a).result, Result::cancelled);
  EXPECT_TRUE(m.timer_fired(t0 + 1ms).empty());
}

TEST(WaiterMachine, FairReleaseHandsTheLockToTheQueueHeadWithTheTtlFromItsLastBusyAttempt) {
  // FairReleaseHandsTheLockToTheQueueHead / FairGrantCarriesAFreshFence: the
  // grant ran after our last busy attempt was sent, so that send time is a
  // start of the TTL no later than the server's.
  WaiterMachine m = machine(fair(), 1);
  ASSERT_EQ(kinds(queue_up(m)), V{"arm_timer"});
  const auto a = m.grant_message(t0 + 50ms, 42);
  EXPECT_EQ(kinds(a), (V{"cancel_timer", "unsubscribe", "complete"}));
  expect_granted(a, t0 + 1ms, 42);
}

TEST(WaiterMachine, FairGrantAfterALongQuietWaitRestartsTheTtl) {
  // ttl 400 ms, the last busy attempt 300 ms back (> ttl/4): a TTL counted
  // from it would be mostly spent, so one attempt restarts it (acquire.lua
  // finds the lock holding our token) and the TTL counts from that send.
  WaiterMachine m = machine(fair(10s, 400ms), 1);
  ASSERT_EQ(kinds(queue_up(m)), V{"arm_timer"});
  EXPECT_EQ(kinds(m.grant_message(t0 + 302ms, std::nullopt)), (V{"cancel_timer", "send_attempt"}));
  m.sent(t0 + 303ms);
  const auto a = m.reply(t0 + 304ms, Reply::granted, 9);
  expect_granted(a, t0 + 303ms, 9);
}

TEST(WaiterMachine, AGrantWithinAQuarterTtlOfTheLastBusyAttemptIsUsedAtOnce) {
  WaiterMachine m = machine(fair(10s, 400ms), 1);
  ASSERT_EQ(kinds(queue_up(m)), V{"arm_timer"});
  // 100 ms after the busy send: exactly a quarter, not more.
  EXPECT_EQ(last(m.grant_message(t0 + 101ms, std::nullopt)).result, Result::granted);
}

TEST(WaiterMachine, GrantWhileTheHeadsOwnAttemptIsInFlightThatRanBeforeItWaitsForTheBusyReply) {
  // The race the integration tests cannot force: the release hands the lock
  // over while our refresh is on the wire. The refresh ran before the grant
  // (busy): we wait for its reply, so it cannot run after our own release,
  // and count the TTL from its send, which precedes the grant.
  WaiterMachine m = machine(fair(), 1);
  refresh_on_the_wire(m);
  EXPECT_TRUE(m.grant_message(t0 + 151ms, 5).empty()) << "used the lock before its attempt's reply";
  const auto a = m.reply(t0 + 152ms, Reply::busy);
  EXPECT_EQ(kinds(a), (V{"unsubscribe", "complete"}));
  expect_granted(a, t0 + 150ms, 5);
}

TEST(WaiterMachine, GrantWhileTheHeadsOwnAttemptIsInFlightThatRanAfterItTakesTheReply) {
  // The refresh ran after the grant: the script found the lock holding our
  // token, restarted its TTL and says granted with the grant's fence.
  WaiterMachine m = machine(fair(), 1);
  refresh_on_the_wire(m);
  m.grant_message(t0 + 151ms, 5);
  const auto a = m.reply(t0 + 152ms, Reply::granted, 5);
  expect_granted(a, t0 + 150ms, 5);
}

TEST(WaiterMachine, GrantWhileAnAttemptIsInFlightThatFailsIsPassedOn) {
  // We are the holder already, but our acquire reports an error: nobody would
  // use the lock until its TTL, so it is released to the next head.
  WaiterMachine m = machine(fair(), 1);
  refresh_on_the_wire(m);
  m.grant_message(t0 + 151ms, std::nullopt);
  const auto a = m.reply(t0 + 152ms, Reply::error);
  EXPECT_EQ(kinds(a), (V{"unsubscribe", "abandon", "pass_on_grant", "complete"}));
  EXPECT_EQ(last(a).result, Result::failed);
}

TEST(WaiterMachine, GrantToAWaiterThatGaveUpIsPassedOnByTheService) {
  // The waiter gives up at its deadline: it leaves the queue (whose reply
  // says whether a release had handed it the lock) and marks its token
  // abandoned, so a grant message arriving afterwards, which no waiter
  // receives any more, is answered by the service with a release.
  WaiterMachine m = machine(fair(600ms), 1);
  const auto armed = queue_up(m);
  ASSERT_EQ(kinds(armed), V{"arm_timer"});
  m.timer_fired(t0 + 600ms);
  m.sent(t0 + 600ms);
  const auto a = m.reply(t0 + 601ms, Reply::busy);
  EXPECT_EQ(kinds(a), (V{"leave_queue", "unsubscribe", "abandon", "complete"}));
  EXPECT_EQ(last(a).result, Result::busy);
  EXPECT_TRUE(m.grant_message(t0 + 602ms, std::nullopt).empty());
}

TEST(WaiterMachine, LostGrantMessageIsFoundByTheNextRefresh) {
  // The release made us the holder but its message never came (subscriber
  // reconnecting): the next refresh finds the lock holding our token.
  WaiterMachine m = machine(fair(), 1);
  const auto armed = queue_up(m);
  ASSERT_EQ(kinds(m.timer_fired(armed[0].at)), V{"send_attempt"});
  m.sent(armed[0].at);
  const auto a = m.reply(armed[0].at + 1ms, Reply::granted);
  EXPECT_EQ(last(a).result, Result::granted);
  EXPECT_EQ(last(a).at, armed[0].at);
}

TEST(WaiterMachine, AGrantDuringTheGateCheckIsSeenByTheAttemptItself) {
  // The grant came before our attempt was sent, so the attempt runs after
  // it: a busy answer then means the granted lock is gone again (expired,
  // force-released), not that we hold it.
  WaiterMachine m = machine(fair(), 1);
  ASSERT_EQ(kinds(queue_up(m)), V{"arm_timer"});
  ASSERT_EQ(kinds(m.timer_fired(t0 + 150ms)), V{"send_attempt"});
  EXPECT_TRUE(m.grant_message(t0 + 151ms, 5).empty());
  m.sent(t0 + 160ms);
  const auto a = m.reply(t0 + 161ms, Reply::busy);
  EXPECT_EQ(kinds(a), V{"arm_timer"}) << "took a lock that was no longer ours";
}

TEST(WaiterMachine, AGrantDuringTheGateCheckThatRefusesIsPassedOn) {
  WaiterMachine m = machine(fair(1s), 1);
  ASSERT_EQ(kinds(queue_up(m)), V{"arm_timer"});
  m.timer_fired(t0 + 150ms);
  m.grant_message(t0 + 151ms, std::nullopt);
  const auto a = m.refused(t0 + 152ms, 60s);  // a quarantine longer than the wait
  EXPECT_EQ(kinds(a), (V{"unsubscribe", "abandon", "pass_on_grant", "complete"}));
  EXPECT_EQ(last(a).result, Result::failed);
}

TEST(WaiterMachine, AGrantHandedBackAsUncheckedIsNotTakenForALaterBusyReply) {
  // A grant arrives while an attempt is in flight; the reply comes on a new
  // connection (unchecked), so the lock is handed back, and the grant with
  // it. The next attempt's busy must not be read as "ran before the grant".
  WaiterMachine m = machine(fair(), 1);
  refresh_on_the_wire(m);
  m.grant_message(t0 + 151ms, 5);
  EXPECT_EQ(kinds(m.reply(t0 + 152ms, Reply::unchecked_grant)), (V{"discard_grant", "send_attempt"}));
  m.sent(t0 + 153ms);
  EXPECT_EQ(kinds(m.reply(t0 + 154ms, Reply::busy)), V{"arm_timer"}) << "claimed a lock it handed back";
}

TEST(WaiterMachine, AGrantSurvivesAnEvictionRetry) {
  // acquire.lua refused before doing anything (an eviction since the gate's
  // check): the grant still stands and the next attempt finds it.
  WaiterMachine m = machine(fair(), 1);
  refresh_on_the_wire(m);
  m.grant_message(t0 + 151ms, 5);
  ASSERT_EQ(kinds(m.reply(t0 + 152ms, Reply::retry)), V{"send_attempt"});
  const auto refused = m.refused(t0 + 153ms, 0ms);  // the check failed
  EXPECT_EQ(kinds(refused), (V{"unsubscribe", "abandon", "pass_on_grant", "complete"}));
}

TEST(WaiterMachine, AGrantThatWasLostAgainLeavesNothingToPassOn) {
  // A stale grant (> ttl/4) makes us ask again; that attempt, sent after the
  // grant, says busy: the lock is no longer ours, so a later give-up does
  // not release it.
  WaiterMachine m = machine(fair(1s, 400ms), 1);
  ASSERT_EQ(kinds(queue_up(m)), V{"arm_timer"});
  ASSERT_EQ(kinds(m.grant_message(t0 + 500ms, std::nullopt)), (V{"cancel_timer", "send_attempt"}));
  m.sent(t0 + 500ms);
  const auto a = m.reply(t0 + 501ms, Reply::busy);
  ASSERT_EQ(kinds(a), V{"arm_timer"});
  m.timer_fired(a[0].at);
  m.sent(t0 + 1s);
  EXPECT_EQ(kinds(m.reply(t0 + 1s, Reply::busy)), (V{"leave_queue", "unsubscribe", "abandon", "complete"}));
}

TEST(WaiterMachine, FairModeWaitersCompleteInTheOrderTheirGrantsArrive) {
  // FairModeHandsOffInArrivalOrder, the waiter's part: two queued waiters do
  // nothing but refresh until the release that reaches each of them.
  WaiterMachine b = machine(fair(), 1), c = machine(fair(), 2);
  ASSERT_EQ(kinds(queue_up(b)), V{"arm_timer"});
  ASSERT_EQ(kinds(queue_up(c)), V{"arm_timer"});
  EXPECT_EQ(last(b.grant_message(t0 + 10ms, std::nullopt)).result, Result::granted);
  EXPECT_FALSE(c.done());
  EXPECT_EQ(last(c.grant_message(t0 + 20ms, std::nullopt)).result, Result::granted);
}

// --- cancel ----------------------------------------------------------------------

TEST(WaiterMachine, CancelWhileSleepingLeavesTheQueueAtOnce) {
  WaiterMachine m = machine(fair(), 1);
  ASSERT_EQ(kinds(queue_up(m)), V{"arm_timer"});
  const auto a = m.cancel(t0 + 10ms);
  EXPECT_EQ(kinds(a), (V{"cancel_timer", "leave_queue", "unsubscribe", "abandon", "complete"}));
  EXPECT_EQ(last(a).result, Result::cancelled);
}

TEST(WaiterMachine, CancelWithAnAttemptInFlightHandsBackTheGrantItBrings) {
  WaiterMachine m = machine(plain(), 1);
  m.start(t0);
  m.sent(t0);
  EXPECT_TRUE(m.cancel(t0 + 1ms).empty());  // ends on the reply
  const auto a = m.reply(t0 + 2ms, Reply::granted);
  EXPECT_EQ(kinds(a), (V{"pass_on_grant", "complete"}));
  EXPECT_EQ(last(a).result, Result::cancelled);
}

TEST(WaiterMachine, CancelWithAFairAttemptInFlightThatRanBeforeAGrantPassesTheGrantOn) {
  WaiterMachine m = machine(fair(), 1);
  refresh_on_the_wire(m);
  m.cancel(t0 + 151ms);
  m.grant_message(t0 + 152ms, std::nullopt);
  const auto a = m.reply(t0 + 153ms, Reply::busy);
  EXPECT_EQ(kinds(a), (V{"unsubscribe", "abandon", "pass_on_grant", "complete"}));
  EXPECT_EQ(last(a).result, Result::cancelled);
}
