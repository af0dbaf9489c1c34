// The client against a hostile server (replies over the reply limits) and a
// frozen link (a TCP relay that stops forwarding).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <filesystem>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/subscriber.hpp"
#include "support/peers.hpp"
#include "support/redis_fixture.hpp"

using namespace jobguard;
using namespace jobguard::redis;
using namespace jobguard::test;

namespace {

ConnectionOptions to_port(std::uint16_t port) {
  ConnectionOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  // Long against a loaded machine: a protocol_error (not a timeout) proves
  // the bad reply was refused as it arrived, before any deadline.
  o.command_timeout = Ms(10000);
  o.connect_timeout = Ms(5000);
  return o;
}

// The keepalive settings of every socket of this process connected to
// 127.0.0.1:`port`: the client's connections are this process' own
// descriptors, so the test reads what the kernel was told.
struct Keepalive {
  int on = -1, idle = -1, interval = -1, probes = -1;
};
std::vector<Keepalive> keepalive_of_sockets_to(std::uint16_t port) {
  std::vector<Keepalive> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    int fd = -1;
    try {
      fd = std::stoi(e.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0 || peer.sin_family != AF_INET ||
        ntohs(peer.sin_port) != port)
      continue;
    Keepalive k;
    socklen_t n = sizeof(int);
    ::getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &k.on, &n);
    ::getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &k.idle, &n);
    ::getsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &k.interval, &n);
    ::getsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &k.probes, &n);
    out.push_back(k);
  }
  return out;
}

// Three calls in flight meet the hostile reply: each fails with a protocol
// error naming the limit; the connection is replaced and serves the next call.
void expect_refused_then_recovered(HostileServer& server, const std::string& limit_text, Warnings& warnings,
                                   ConnectionOptions o) {
  warnings.attach(o);
  Client c(o);
  std::vector<std::future<Reply>> fs;
  for (int i = 0; i < 3; ++i) fs.push_back(c.exec_future(Command{"PING"}));
  for (auto& f : fs) {
    const Error e = error_of([&] { f.get(); });
    EXPECT_EQ(e.code(), errc::protocol_error) << e.what();
    EXPECT_NE(std::string(e.what()).find(limit_text), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(c.address()), std::string::npos) << e.what();
    EXPECT_EQ(e.source(), error_source::redis);
  }
  EXPECT_TRUE(warnings.any_contains(limit_text));
  // The hostile connection was dropped by the client, and a new one serves.
  EXPECT_TRUE(eventually([&] { return server.hostile_closed_by_client(); }, Ms(10000)));
  EXPECT_EQ(c.exec(Command{"PING"}).str, "PONG");
  EXPECT_GE(server.accepted(), 2);
}

}  // namespace

TEST(RedisReplyLimits, TwoBillionElementArrayFailsCallsWithProtocolErrorInsteadOfAborting) {
  HostileServer server("*2000000000\r\n");
  Warnings w;
  expect_refused_then_recovered(server, "max_reply_elements", w, to_port(server.port()));
}

TEST(RedisReplyLimits, TwentyMillionElementArrayIsRefusedBeforeTheLoopSizesIt) {
  HostileServer server("*20000000\r\n:1\r\n:2\r\n");
  Warnings w;
  expect_refused_then_recovered(server, "20000000 array elements", w, to_port(server.port()));
}

TEST(RedisReplyLimits, GigabyteBulkStringIsRefusedAndNotBufferedWhileTheServerKeepsSending) {
  // The server declares 4 GB and streams junk until the client hangs up.
  HostileServer server("$4000000000\r\n", /*then_flood=*/true);
  Warnings w;
  expect_refused_then_recovered(server, "max_bulk_bytes", w, to_port(server.port()));
}

TEST(RedisReplyLimits, LimitsAreConfigurable) {
  HostileServer server("*2\r\n$20\r\n01234567890123456789\r\n:1\r\n");
  ConnectionOptions o = to_port(server.port());
  o.max_bulk_bytes = 16;
  Warnings w;
  expect_refused_then_recovered(server, "over the limit of 16 (max_bulk_bytes)", w, o);
}

TEST(RedisReplyLimits, OutOfRangeLimitsAreRefusedAtConstruction) {
  ConnectionOptions o = to_port(1);
  o.max_reply_depth = 8;
  EXPECT_EQ(error_of([&] { Client c(o); }).code(), errc::invalid_argument);
  o.max_reply_depth = 7;
  o.max_reply_elements = 0;
  EXPECT_EQ(error_of([&] { Client c(o); }).code(), errc::invalid_argument);
}

class RedisLiveness : public RedisTest {};

// TCP keepalive on every connection, the subscriber's included, so
// a peer that vanished is noticed by the kernel while no call is in flight.
TEST_F(RedisLiveness, ClientAndSubscriberConnectionsCarryTheConfiguredKeepalive) {
  ConnectionOptions o = options();
  o.keepalive_idle = std::chrono::seconds(7);  // not the kernel's default (7200)
  o.keepalive_interval = std::chrono::seconds(3);
  o.keepalive_probes = 4;
  Client c(o);
  EXPECT_EQ(c.exec(Command{"PING"}).str, "PONG");
  Subscriber sub(c);
  std::promise<void> ready;
  sub.subscribe("t:keepalive", [](const std::string&, const std::string&) {}, [&] { ready.set_value(); });
  ASSERT_EQ(ready.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const auto socks = keepalive_of_sockets_to(server->port());
  ASSERT_GE(socks.size(), 2u) << "the client's and the subscriber's connections";
  for (const auto& k : socks) {
    EXPECT_EQ(k.on, 1);
    EXPECT_EQ(k.idle, 7);
    EXPECT_EQ(k.interval, 3);
    EXPECT_EQ(k.probes, 4);
  }
}

TEST_F(RedisLiveness, KeepaliveOffLeavesTheSocketWithoutIt) {
  ConnectionOptions o = options();
  o.keepalive = false;
  Client c(o);
  EXPECT_EQ(c.exec(Command{"PING"}).str, "PONG");
  const auto socks = keepalive_of_sockets_to(server->port());
  ASSERT_FALSE(socks.empty());
  for (const auto& k : socks) EXPECT_EQ(k.on, 0);
}

TEST_F(RedisLiveness, FrozenLinkIsRecycledAfterConsecutiveTimeoutsAndCallsSucceedAgain) {
  FrozenRelay relay(server->port());
  ConnectionOptions o = to_port(relay.port());
  o.command_timeout = Ms(300);
  o.recycle_after_timeouts = 3;
  Warnings w;
  w.attach(o);
  Client c(o);
  ASSERT_TRUE(c.wait_connected(std::chrono::seconds(10)));
  EXPECT_EQ(c.exec(Command{"PING"}).str, "PONG");

  relay.freeze_existing();
  // Three calls time out on the frozen link (no reply can come back)...
  for (int i = 0; i < 3; ++i) {
    const Error e = error_of([&] { c.exec(Command{"PING"}); });
    EXPECT_EQ(e.code(), errc::timeout) << e.what();
  }
  // ...and the third one makes the client replace the connection.
  EXPECT_TRUE(eventually([&] { return c.stats().recycled == 1; }, Ms(10000)));
  EXPECT_TRUE(w.any_contains("connection recycled")) << "the recycling is logged";
  // The new connection goes through the relay afresh and works.
  EXPECT_TRUE(eventually(
      [&] {
        try {
          return c.exec(Command{"PING"}).str == "PONG";
        } catch (const Error&) {
          return false;
        }
      },
      Ms(10000)));
  EXPECT_EQ(relay.accepted(), 2);
}

TEST_F(RedisLiveness, WithRecyclingOffAFrozenLinkKeepsTimingOut) {
  FrozenRelay relay(server->port());
  ConnectionOptions o = to_port(relay.port());
  o.command_timeout = Ms(200);
  o.recycle_after_timeouts = 0;
  Client c(o);
  ASSERT_TRUE(c.wait_connected(std::chrono::seconds(10)));
  EXPECT_EQ(c.exec(Command{"PING"}).str, "PONG");
  relay.freeze_existing();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(error_of([&] { c.exec(Command{"PING"}); }).code(), errc::timeout);
  EXPECT_EQ(c.stats().recycled, 0u);
  EXPECT_EQ(relay.accepted(), 1);
}

TEST_F(RedisLiveness, RepliesInBetweenResetTheTimeoutCount) {
  // A slow call now and then is not a dead link: only timeouts in a row count.
  ConnectionOptions o = options();
  o.recycle_after_timeouts = 2;
  o.command_timeout = Ms(5000);
  Client c(o);
  ASSERT_TRUE(c.wait_connected(std::chrono::seconds(10)));
  CallOptions tiny{Ms(50)};
  for (int i = 0; i < 4; ++i) {
    // DEBUG-free stall: BLPOP on an empty list with a server-side timeout of
    // 1 s outlives the 50 ms call deadline.
    EXPECT_EQ(error_of([&] { c.exec(Command{"BLPOP", "t:liveness:empty", "1"}, tiny); }).code(), errc::timeout);
    // Its late reply (nil after 1 s) arrives before this call's, and counts as
    // the link being alive.
    EXPECT_EQ(c.exec(Command{"PING"}).str, "PONG");
  }
  EXPECT_EQ(c.stats().recycled, 0u);
}
