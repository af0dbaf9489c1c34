// The releaser's yield (LockService::Impl::yield_until), seen as an order of
// grants on a real server. Not in the ThreadSanitizer run: what it checks is
// an order of events a fraction of a millisecond apart, which TSan's
// slowdown of every client step (not the server's) turns around; the yield's
// own logic is tested with a fake clock (tests/unit/lock/waiter_test.cpp).
#include <gtest/gtest.h>

#include <future>
#include <optional>
#include <string>
#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using jobguard::test::eventually;

#include "fixtures.hpp"

// Default mode: a holder that releases and at once waits for the same lock
// again (a worker's loop) gives the waiter its release woke a head start —
// the service holds its next waiting attempt for about one round trip
// (LockService::Impl::yield_until). Seen without a race between two live
// waiters, whose outcome also depends on how fast the woken one answers
// (a test of that, the woken waiter against the releaser, separated the two
// builds too weakly: 70 % either way on a loaded host). Here A's release
// wakes a waiter that never answers (a process that died in line), then A
// waits for the lock again at once while a newcomer C tries once. A's first
// attempt is held for the yield, so C, which asks a moment after A, gets
// the lock; A gets it after C.
TEST_F(LockTest, AReleaserThatWokeAWaiterHoldsItsNextWaitingAttemptForTheYield) {
  const std::string r = resource("ghost");
  const std::string line = svc->keys().waiters_key(r);
  auto cc = make_client();
  auto c_svc = LockService::create(*cc);
  const LockOptions waiting{.ttl = 10s, .wait = 10s, .backoff_min = 1ms, .backoff_max = 2ms};
  constexpr int kRounds = 20;
  int newcomer_first = 0;
  for (int round = 0; round < kRounds; ++round) {
    auto a = svc->acquire(r);
    ASSERT_TRUE(a);
    ASSERT_EQ(admin("ZADD " + line + " 1 ghost-" + std::to_string(round)), "1");
    // The release waits out a 30 ms pause, so its round trip, and with it
    // the yield (one round trip, at most 5 ms), is long: the newcomer's call
    // below has milliseconds to land first, however slow this build's client
    // steps (a sanitizer's) are. Without the yield A still asks first.
    admin("CLIENT PAUSE 30 ALL");
    ASSERT_TRUE(a->release());  // pops the ghost: a waiter woken
    std::promise<std::optional<Lock>> again;
    svc->async_acquire(r, waiting, [&](const Error& e, std::optional<Lock> l) {
      EXPECT_FALSE(e) << e.what();
      again.set_value(std::move(l));
    });
    auto c = c_svc->acquire(r);  // try once, a moment after A asked
    if (c) {
      ++newcomer_first;
      std::this_thread::sleep_for(1ms);
      ASSERT_TRUE(c->release());
    }
    auto f = again.get_future();
    ASSERT_EQ(f.wait_for(15s), std::future_status::ready);
    auto mine = f.get();
    ASSERT_TRUE(mine);
    ASSERT_TRUE(mine->release());
    ASSERT_TRUE(eventually([&] { return admin("EXISTS " + svc->keys().lock_key(r)) == "0"; }, 5s));
  }
  // A pause whose end the server's clock brings early (a VM's clock step)
  // makes a short yield: C may lose such a round.
  EXPECT_GE(newcomer_first, kRounds - 4) << "A took the lock back first in " << kRounds - newcomer_first << " of "
                                         << kRounds << " rounds";
  c_svc.reset();
}

