// The subscriber on the client's transport: the same handshake (AUTH, SELECT,
// CLIENT SETNAME) and reply reader, and what the server refuses is reported
// instead of dropped.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <set>

#include "helpers.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/subscriber.hpp"
#include "support/peers.hpp"
#include "support/redis_fixture.hpp"

using namespace jobguard;
using namespace jobguard::redis;
using namespace jobguard::test;
using namespace std::chrono_literals;

class RedisSubscriber : public RedisTest {
 protected:
  ConnectionOptions as_user(const std::string& user, const std::string& password) const {
    ConnectionOptions o = options();
    o.user = user;
    o.password = password;
    o.command_timeout = Ms(5000);
    o.connect_timeout = Ms(5000);
    return o;
  }
  std::string hostport() const { return fmt::format("{}:{}", server->host(), server->port()); }
};

namespace {
// The first error the subscriber reports, as a future.
struct FirstError {
  std::promise<Error> p;
  std::once_flag once;
  std::function<void(const Error&)> sink() {
    return [this](const Error& e) { std::call_once(once, [&] { p.set_value(e); }); };
  }
};
}  // namespace

TEST_F(RedisSubscriber, DeliversMessagesOnAConnectionWithTheClientsHandshake) {
  ConnectionOptions o = options();
  o.client_name = "subtest";
  o.db = 2;
  Client c(o);
  Subscriber sub(c);
  std::promise<void> ready;
  std::promise<std::string> got;
  sub.subscribe(
      key("ch"), [&](const std::string&, const std::string& msg) { got.set_value(msg); },
      [&] { ready.set_value(); });
  ASSERT_EQ(ready.get_future().wait_for(10s), std::future_status::ready);
  // SETNAME and SELECT ran on the subscriber's connection too.
  const std::string list = admin("CLIENT LIST");
  const auto at = list.find("name=subtest-sub");
  ASSERT_NE(at, std::string::npos) << list;
  const std::string line = list.substr(list.rfind('\n', at) + 1, list.find('\n', at) - list.rfind('\n', at) - 1);
  EXPECT_NE(line.find(" db=2 "), std::string::npos) << line;
  EXPECT_NE(line.find("sub=1"), std::string::npos) << line;
  EXPECT_EQ(admin(fmt::format("PUBLISH {} hello", key("ch"))), "1");
  auto f = got.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(f.get(), "hello");
}

TEST_F(RedisSubscriber, SubscribeForbiddenByTheAclIsReportedWithTheServersWords) {
  // Redis 7 users get no channel rights unless granted (&pattern / allchannels).
  ASSERT_EQ(admin("ACL SETUSER nopubsub on >pw ~* +@all resetchannels"), "OK");
  Client c(as_user("nopubsub", "pw"));
  Subscriber sub(c);
  FirstError first;
  sub.set_on_error(first.sink());
  sub.subscribe(key("ch"), [](const std::string&, const std::string&) {});
  auto f = first.p.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "the refusal was dropped";
  const Error e = f.get();
  const std::string msg = e.what();
  EXPECT_EQ(e.code(), errc::permission_denied) << msg;
  EXPECT_EQ(e.source(), error_source::redis);
  EXPECT_NE(msg.find("NOPERM"), std::string::npos) << msg;
  EXPECT_NE(msg.find(key("ch")), std::string::npos) << msg;
  EXPECT_NE(msg.find(hostport()), std::string::npos) << msg;
}

TEST_F(RedisSubscriber, WrongPasswordOnTheSubscriberConnectionIsReported) {
  ASSERT_EQ(admin("ACL SETUSER alice on >pw ~* &* +@all"), "OK");
  Client c(as_user("alice", "not-the-password"));
  Subscriber sub(c);
  FirstError first;
  sub.set_on_error(first.sink());
  sub.subscribe(key("ch"), [](const std::string&, const std::string&) {});
  auto f = first.p.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "the rejected AUTH was dropped";
  const Error e = f.get();
  const std::string msg = e.what();
  EXPECT_EQ(e.code(), errc::auth_failed) << msg;
  EXPECT_NE(msg.find("WRONGPASS"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"alice\""), std::string::npos) << msg;
  EXPECT_EQ(msg.find("not-the-password"), std::string::npos) << msg;
}

TEST_F(RedisSubscriber, LockWaiterWithoutPubSubRightsSaysSoAndStillGetsTheLockByPolling) {
  ASSERT_EQ(admin("ACL SETUSER nopubsub on >pw ~* +@all resetchannels"), "OK");
  ConnectionOptions o = as_user("nopubsub", "pw");
  Warnings warnings;
  warnings.attach(o);
  Client c(o);
  auto svc = LockService::create(c, KeyBuilder("t" + std::to_string(server->port())));
  auto holder = svc->acquire("res", LockOptions{.ttl = 10s});
  ASSERT_TRUE(holder);
  const std::string lock_key = svc->keys().lock_key("res");
  std::thread releaser([&] {
    // Freed only once the waiter has reported that it cannot listen; by an
    // admin DEL, since this user may not PUBLISH (the release script would).
    eventually([&] { return static_cast<bool>(svc->subscriber_error()); }, Ms(10000));
    admin("DEL " + lock_key);
  });
  auto got = svc->acquire("res", LockOptions{.ttl = 10s, .wait = 20s, .backoff_max = 50ms});
  releaser.join();
  holder->detach();
  EXPECT_TRUE(got.has_value()) << "polling must still find the released lock";
  if (got) got->detach();
  const Error e = svc->subscriber_error();
  EXPECT_EQ(e.code(), errc::permission_denied) << e.what();
  EXPECT_NE(std::string(e.what()).find("NOPERM"), std::string::npos) << e.what();
  EXPECT_TRUE(warnings.any_contains("fall back to polling")) << "the refusal is logged through on_warning";
}

// The subscriber reconnects the same way as the client. A
// subscribed connection sends nothing once confirmed, so a frozen link (a TCP
// relay that stops forwarding and never closes) showed no timeout, and
// waiters heard no release again until the process restarted. Its heartbeat
// PINGs time out, the connection is recycled, the channel resubscribed and
// listeners told of the reconnect.
TEST_F(RedisSubscriber, FrozenLinkIsRecycledByTheHeartbeatAndTheSubscriptionRestored) {
  FrozenRelay relay(server->port());
  ConnectionOptions o = options();
  o.port = relay.port();
  o.command_timeout = Ms(300);
  o.subscriber_ping_interval = Ms(100);
  o.recycle_after_timeouts = 3;
  Warnings warnings;
  warnings.attach(o);
  // Declared before the client: its loop thread may still deliver a message
  // (one of the repeated PUBLISHes below) until the client is destroyed.
  std::atomic<int> reconnects{0};
  std::mutex mu;
  std::set<std::string> got;
  std::promise<void> ready;
  Client c(o);
  Subscriber sub(c);
  sub.set_on_reconnect([&] { ++reconnects; });
  sub.subscribe(
      key("ch"),
      [&](const std::string&, const std::string& msg) {
        std::lock_guard g(mu);
        got.insert(msg);
      },
      [&] { ready.set_value(); });
  ASSERT_EQ(ready.get_future().wait_for(10s), std::future_status::ready);
  auto received = [&](const std::string& m) {
    std::lock_guard g(mu);
    return got.count(m) > 0;
  };
  EXPECT_EQ(admin(fmt::format("PUBLISH {} before", key("ch"))), "1");
  ASSERT_TRUE(eventually([&] { return received("before"); }, Ms(10000)));

  relay.freeze_existing();
  ASSERT_TRUE(eventually([&] { return reconnects.load() >= 1; }, Ms(30000))) << "the frozen link was never replaced";
  // Published until heard: the frozen connection stays subscribed on the
  // server (the relay keeps its end open), so a count of receivers proves
  // nothing; a message that arrives does.
  ASSERT_TRUE(eventually(
      [&] {
        admin(fmt::format("PUBLISH {} after", key("ch")));
        return received("after");
      },
      Ms(30000)));
  EXPECT_GE(relay.accepted(), 2);
  EXPECT_TRUE(warnings.any_contains("connection recycled")) << "the recycling is logged";
}

TEST_F(RedisSubscriber, NegativePingIntervalIsRefused) {
  ConnectionOptions o = options();
  o.subscriber_ping_interval = Ms(-1);
  EXPECT_EQ(error_of([&] { Client c(o); }).code(), errc::invalid_argument);
}
