// The lease state machine on a fake clock: TTLs crossed without sleeping.
#include <gtest/gtest.h>

#include "lock/lease_timeline.hpp"

using namespace std::chrono_literals;
using jobguard::LeaseOptions;
using jobguard::LeaseState;
using jobguard::detail::LeaseTimeline;
using T = LeaseTimeline::Clock::time_point;

namespace {
const T t0 = T(std::chrono::hours(1000));
LeaseTimeline make(std::chrono::milliseconds ttl = 30s, LeaseOptions o = {}) {
  return LeaseTimeline(LeaseTimeline::resolve(ttl, o), t0);
}
}  // namespace

TEST(LeaseTimeline, RenewsAtAThirdOfTheTtl) {
  auto tl = make();
  EXPECT_FALSE(tl.poll(t0 + 9s));
  EXPECT_TRUE(tl.poll(t0 + 10s));
  EXPECT_EQ(tl.next_wake(), t0 + 10s);
}

TEST(LeaseTimeline, CoalescingSendsARenewalDueSoonWithTheBatch) {
  auto tl = make();
  EXPECT_FALSE(tl.poll(t0 + 10s - 20ms, 10ms));
  EXPECT_TRUE(tl.poll(t0 + 10s - 5ms, 10ms));
}

TEST(LeaseTimeline, SafeTimeCountsFromWhenTheRenewalWasSentNotAnswered) {
  auto tl = make();
  ASSERT_TRUE(tl.poll(t0 + 10s));
  tl.renewal_sent(t0 + 10s);
  tl.renewal_succeeded(t0 + 12s);  // a slow reply
  // ttl 30 s, drift 30 s/100 + 2 ms = 302 ms, counted from the send at 10 s.
  EXPECT_EQ(tl.safe_until(), t0 + 10s + 30s - 302ms);
  EXPECT_EQ(tl.state(), LeaseState::active);
}

TEST(LeaseTimeline, TokenGoneLosesTheLease) {
  auto tl = make();
  tl.poll(t0 + 10s);
  tl.renewal_sent(t0 + 10s);
  tl.renewal_token_gone();
  EXPECT_EQ(tl.state(), LeaseState::token_gone);
  EXPECT_FALSE(tl.poll(t0 + 11s));
}

TEST(LeaseTimeline, FailedRenewalsRetrySoonAndLoseAtTheSafeTime) {
  auto tl = make(3s);
  ASSERT_TRUE(tl.poll(t0 + 1s));
  tl.renewal_sent(t0 + 1s);
  tl.renewal_failed(t0 + 1100ms, "timeout");
  EXPECT_EQ(tl.state(), LeaseState::active);
  EXPECT_EQ(tl.next_wake(), t0 + 1100ms + 250ms);  // retry at a quarter period
  EXPECT_TRUE(tl.poll(t0 + 1350ms));
  tl.renewal_sent(t0 + 1350ms);
  tl.renewal_failed(t0 + 2s, "timeout");
  // ttl 3 s - drift 32 ms: lost at 2968 ms, even though no renewal said so.
  EXPECT_TRUE(tl.poll(t0 + 2967ms)) << "still active: another retry is due";
  EXPECT_EQ(tl.state(), LeaseState::active);
  tl.renewal_sent(t0 + 2967ms);
  EXPECT_FALSE(tl.poll(t0 + 2968ms));
  EXPECT_EQ(tl.state(), LeaseState::expired);
}

TEST(LeaseTimeline, APausePastTheTtlIsLostOnResumeBeforeAnyRenewal) {
  auto tl = make(3s);
  // The process was stopped from 0.5 s to 10 s: the renewal due at 1 s never
  // went out. On resume the first poll reports the loss and sends nothing.
  EXPECT_FALSE(tl.poll(t0 + 10s));
  EXPECT_EQ(tl.state(), LeaseState::expired);
}

TEST(LeaseTimeline, ALateSuccessfulReplyDoesNotResurrectAnExpiredLease) {
  auto tl = make(3s);
  ASSERT_TRUE(tl.poll(t0 + 1s));
  tl.renewal_sent(t0 + 1s);
  // The reply sat in our socket while we were paused for 5 s.
  tl.renewal_succeeded(t0 + 6s);
  EXPECT_EQ(tl.state(), LeaseState::expired);
}

TEST(LeaseTimeline, HardTimeoutEndsTheLease) {
  LeaseOptions o;
  o.hard_timeout = 5s;
  auto tl = make(30s, o);
  EXPECT_EQ(tl.next_wake(), t0 + 5s);
  EXPECT_FALSE(tl.poll(t0 + 5s));
  EXPECT_EQ(tl.state(), LeaseState::timed_out);
}

TEST(LeaseTimeline, JitterSpreadsTheNextRenewal) {
  auto tl = make();
  tl.poll(t0 + 10s);
  tl.renewal_sent(t0 + 10s);
  tl.renewal_succeeded(t0 + 10s, 1.1);
  EXPECT_EQ(tl.next_wake(), t0 + 21s);
}

TEST(LeaseTimeline, ReleasedLeaseNeverRenewsOrExpires) {
  auto tl = make(3s);
  tl.released();
  EXPECT_FALSE(tl.poll(t0 + 1s));
  EXPECT_FALSE(tl.poll(t0 + 1h));
  EXPECT_EQ(tl.state(), LeaseState::released);
}

TEST(LeaseTimeline, TheDefaultCoalescingWindowIsAHundredthOfThePeriodBetween10And50Ms) {
  auto window = [](std::chrono::milliseconds ttl, LeaseOptions o = {}) { return LeaseTimeline::resolve(ttl, o).coalesce; };
  EXPECT_EQ(window(30s), 50ms);   // period 10 s: 100 ms, capped
  EXPECT_EQ(window(6s), 20ms);    // period 2 s
  EXPECT_EQ(window(3s), 10ms);    // period 1 s
  EXPECT_EQ(window(600ms), 10ms); // the floor: the window of earlier releases
  EXPECT_EQ(window(30s, {.coalesce = 3ms}), 3ms);
  EXPECT_EQ(window(30s, {.renew_every = 20s}), 50ms);
  EXPECT_EQ(window(30s, {.renew_every = 1500ms}), 15ms);
}
