// The client behind Redis Sentinel: a primary, two replicas and
// three redis-sentinel processes started by the fixture (SentinelRedis) on
// free loopback ports. The client asks a sentinel for the primary on every
// (re)connect, checks ROLE before sending anything, learns the other
// sentinels from the one that answers, and follows a failover.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "support/redis_fixture.hpp"
#include "support/sentinel_redis.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using jobguard::test::eventually;
using jobguard::test::redis_command_at;

namespace {

class SentinelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dep = std::make_unique<test::SentinelRedis>();
    dep->start();
  }
  redis::ConnectionOptions options(const std::string& query = {}) {
    auto o = redis::parse_url(dep->url(query));
    o.command_timeout = 2s;
    o.connect_timeout = 1s;
    return o;
  }
  std::unique_ptr<test::SentinelRedis> dep;
};

}  // namespace

TEST_F(SentinelTest, TheClientFindsThePrimaryThroughASentinel) {
  redis::Client c(options());
  ASSERT_TRUE(c.wait_connected(5s));
  const std::uint16_t primary = dep->primary_port();
  EXPECT_EQ(c.address(), fmt::format("127.0.0.1:{}", primary));
  EXPECT_EQ(c.exec(redis::Command{"SET", "t:s", "1"}).str, "OK");
  EXPECT_EQ(redis_command_at("127.0.0.1", primary, "GET t:s"), "1");
  auto role = c.exec(redis::Command{"ROLE"});
  ASSERT_TRUE(role.is_array());
  EXPECT_EQ(role.elements[0].str, "master");
}

// Only the first sentinel in the URL is up when the client starts asking
// later: the others are learned from it (SENTINEL sentinels) and asked when
// it is gone.
TEST_F(SentinelTest, SentinelsAreDiscoveredFromEachOther) {
  const std::uint16_t dead = pick_free_port();
  auto o = redis::parse_url(fmt::format("redis+sentinel://127.0.0.1:{},127.0.0.1:{}/{}", dead, dep->sentinel(0).port(),
                                        dep->master_name()));
  o.command_timeout = 2s;
  o.connect_timeout = 1s;
  redis::Client c(o);
  ASSERT_TRUE(c.wait_connected(5s));
  const auto before = c.stats().reconnects;
  dep->sentinel(0).kill();
  // Break our connection: the reconnect must ask a sentinel again, and
  // neither URL entry answers now.
  redis_command_at("127.0.0.1", dep->primary_port(1), "CLIENT KILL TYPE normal");
  ASSERT_TRUE(eventually([&] { return c.stats().reconnects > before && c.stats().connected == 1; }, 5s))
      << "no sentinel learned from the first one was asked";
  EXPECT_EQ(c.exec(redis::Command{"PING"}).str, "PONG");
}

// A sentinel's answer can be stale: here the primary was made a replica
// behind the sentinels' backs (they notice only at their next INFO poll).
// The client checks ROLE and never sends a call to it.
TEST_F(SentinelTest, AServerThatIsNotThePrimaryIsNeverUsed) {
  EmbeddedRedis other;
  other.start();
  const std::uint16_t primary = dep->primary_port();
  ASSERT_EQ(redis_command_at("127.0.0.1", primary, fmt::format("REPLICAOF 127.0.0.1 {}", other.port())), "OK");
  redis::Client c(options());
  try {
    (void)c.exec(redis::Command{"SET", "t:stale", "1"}, {.timeout = 600ms});
    FAIL() << "a call was sent to a replica";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), errc::not_connected) << msg;
    EXPECT_NE(msg.find(fmt::format("127.0.0.1:{} is a slave (ROLE), not the primary of 'mymaster'", primary)),
              std::string::npos)
        << msg;
  }
  EXPECT_EQ(redis_command_at("127.0.0.1", other.port(), "EXISTS t:stale"), "0");
}

TEST_F(SentinelTest, NoSentinelKnowingTheMasterIsOneLineNamingEach) {
  auto o = redis::parse_url(fmt::format("redis+sentinel://127.0.0.1:{}/nosuchmaster", dep->sentinel(0).port()));
  o.command_timeout = 800ms;
  o.connect_timeout = 500ms;
  redis::Client c(o);
  try {
    (void)c.exec(redis::Command{"PING"});
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(fmt::format("no sentinel named the primary of 'nosuchmaster' (127.0.0.1:{}: does not monitor a "
                                   "master named 'nosuchmaster')",
                                   dep->sentinel(0).port())),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos);
  }
}

TEST_F(SentinelTest, AFailoverMovesTheClientToTheNewPrimary) {
  redis::Client c(options());
  ASSERT_TRUE(c.wait_connected(5s));
  const std::uint16_t old = dep->primary_port();
  EXPECT_EQ(c.exec(redis::Command{"SET", "t:f", "before"}).str, "OK");
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint16_t now = dep->failover();
  ASSERT_NE(now, old);
  std::fprintf(stderr, "[sentinel] failover 127.0.0.1:%u -> 127.0.0.1:%u took %lld ms\n", old, now,
               static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::steady_clock::now() - t0)
                                          .count()));
  // The old primary still accepts writes until the sentinels demote it
  // (seconds later): the client's own check (sentinel_check, 1 s) moves it.
  // How soon is reported, not asserted: a loaded host moves it.
  const auto t1 = std::chrono::steady_clock::now();
  ASSERT_TRUE(eventually([&] { return c.address() == fmt::format("127.0.0.1:{}", now); }, 10s)) << c.address();
  std::fprintf(stderr, "[sentinel] the client moved %lld ms after the failover completed\n",
               static_cast<long long>(
                   std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t1).count()));
  ASSERT_TRUE(eventually(
      [&] {
        try {
          return c.exec(redis::Command{"SET", "t:f", "after"}, {.timeout = 500ms}).str == "OK";
        } catch (const Error&) {
          return false;
        }
      },
      5s));
  EXPECT_EQ(c.address(), fmt::format("127.0.0.1:{}", now));
  EXPECT_EQ(redis_command_at("127.0.0.1", now, "GET t:f"), "after");
}
