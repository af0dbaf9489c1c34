// TLS against redis-server --tls-port, with a CA and server certificate made
// by the openssl CLI for this test run (test::TlsCerts).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <boost/asio/post.hpp>
#include <future>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "helpers.hpp"
#include "support/redis_fixture.hpp"
#include "support/sentinel_redis.hpp"
#include "support/tls_certs.hpp"

using namespace jobguard;
using namespace jobguard::redis;
using namespace jobguard::test;

class RedisTls : public jobguard::test::RedisTest {
 protected:
  static void SetUpTestSuite() {
    certs_ = new TlsCerts();
    dir_ = certs_->dir();
  }
  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
  }

  void SetUp() override {
    EmbeddedRedisOptions so;
    so.tls_cert_file = dir_ + "/server.crt";
    so.tls_key_file = dir_ + "/server.key";
    so.tls_ca_file = dir_ + "/ca.crt";
    server = std::make_unique<EmbeddedRedis>(so);
    server->start();
    ASSERT_NE(server->tls_port(), 0);
  }

  ConnectionOptions tls_options(const std::string& query) const {
    auto o = parse_url(fmt::format("rediss://127.0.0.1:{}/0?{}", server->tls_port(), query));
    // Certificate errors must fail long before this; the code proves it too
    // (waiting out the deadline gives not_connected, not tls_error).
    o.command_timeout = Ms(20000);
    o.connect_timeout = Ms(20000);
    return o;
  }

  static inline TlsCerts* certs_ = nullptr;
  static inline std::string dir_;
};

TEST_F(RedisTls, RedissWithTheRightCaWorks) {
  Client c(tls_options("ca=" + dir_ + "/ca.crt"));
  EXPECT_TRUE(c.exec(Command{"SET", key("k"), "over tls"}).is_ok());
  EXPECT_EQ(c.exec(Command{"GET", key("k")}).str, "over tls");
  // Pipelined traffic over TLS: many calls in few writes, each its own reply.
  std::vector<std::future<Reply>> fs;
  for (int i = 0; i < 500; ++i) fs.push_back(c.exec_future(Command{"ECHO", std::to_string(i)}));
  for (int i = 0; i < 500; ++i) EXPECT_EQ(fs[static_cast<std::size_t>(i)].get().str, std::to_string(i));
  // The connection is really TLS: the plain port would not speak it.
  const std::string clients = admin("CLIENT LIST");
  EXPECT_NE(clients.find(fmt::format(":{}", server->tls_port())), std::string::npos) << clients;
}

TEST_F(RedisTls, ServerNameIsVerifiedAgainstTheCertificate) {
  Client by_name(tls_options("ca=" + dir_ + "/ca.crt&sni=localhost"));
  EXPECT_EQ(by_name.exec(Command{"PING"}).str, "PONG");

  Client wrong_name(tls_options("ca=" + dir_ + "/ca.crt&sni=redis.example.com"));
  const auto t0 = SteadyClock::now();
  const Error e = error_of([&] { wrong_name.exec(Command{"PING"}); });
  EXPECT_EQ(e.code(), errc::tls_error) << e.what();
  EXPECT_LT(since(t0), Ms(10000)) << "a certificate problem must not wait out the deadline";
}

TEST_F(RedisTls, WrongCaFailsFastWithTlsError) {
  Client c(tls_options("ca=" + dir_ + "/other-ca.crt"));
  for (int attempt = 0; attempt < 2; ++attempt) {
    const auto t0 = SteadyClock::now();
    const Error e = error_of([&] { c.exec(Command{"PING"}); });
    EXPECT_LT(since(t0), Ms(10000)) << "a certificate problem must not wait out the deadline";
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), errc::tls_error) << msg;
    EXPECT_EQ(e.next(), next_step::stop);
    EXPECT_NE(msg.find(fmt::format("127.0.0.1:{}", server->tls_port())), std::string::npos) << msg;
    EXPECT_NE(msg.find("certificate verify failed"), std::string::npos) << msg;
  }
  // verify=no is the explicit escape hatch for self-signed test servers.
  Client unverified(tls_options("ca=" + dir_ + "/other-ca.crt&verify=no"));
  EXPECT_EQ(unverified.exec(Command{"PING"}).str, "PONG");
}

TEST_F(RedisTls, EmbeddedServerUrlConnectsOverTls) {
  auto o = parse_url(server->url());
  ASSERT_TRUE(o.tls.enabled);
  Client c(o);
  EXPECT_EQ(c.exec(Command{"PING"}).str, "PONG");
}

TEST_F(RedisTls, TlsServerKilledWithCallsInFlightFailsThemAndTheClientReconnects) {
  auto o = tls_options("ca=" + dir_ + "/ca.crt");
  o.command_timeout = Ms(20000);
  Client c(o);
  ASSERT_EQ(c.exec(Command{"PING"}).str, "PONG");
  ASSERT_EQ(admin("CLIENT PAUSE 20000 ALL"), "OK");
  std::vector<std::future<Reply>> fs;
  for (int i = 0; i < 2000; ++i) fs.push_back(c.exec_future(Command{"SET", key(std::to_string(i)), "v"}));
  ASSERT_TRUE(eventually([&] { return c.stats().writes >= 2; }));
  std::this_thread::sleep_for(Ms(100));
  // Calls made off the loop are posted to it: once a handler posted now has
  // run, every call before it is on the live connection (written or queued
  // to be), which the kill fails with connection_lost. Without this a busy
  // host can still be routing calls at the kill; those wait for the next
  // connection and then their 20 s deadline.
  {
    std::promise<void> routed;
    boost::asio::post(c.get_executor(), [&] { routed.set_value(); });
    ASSERT_EQ(routed.get_future().wait_for(Ms(10000)), std::future_status::ready);
  }
  server->kill();
  for (auto& f : fs) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    const Error e = error_of([&] { f.get(); });
    EXPECT_EQ(e.code(), errc::connection_lost) << e.what();
  }
  server->start();
  ASSERT_TRUE(eventually(
      [&] {
        try {
          return c.exec(Command{"PING"}).str == "PONG";
        } catch (const Error&) {
          return false;
        }
      },
      Ms(5000)));
  EXPECT_GE(c.stats().reconnects, 1u);
}

// TLS everywhere behind Sentinel (rediss+sentinel://): the sentinels listen
// with TLS and reach the data nodes and each other over it, the data nodes
// replicate over TLS, so every address a sentinel names is a TLS port. The
// client finds the primary through TLS sentinels, writes to it over TLS, and
// after SENTINEL FAILOVER follows the promotion to the replica's TLS port.
TEST_F(RedisTls, EverythingOverTlsBehindSentinelFollowsAFailover) {
  test::SentinelRedis dep(1, 2);
  dep.tls_everywhere(dir_ + "/server.crt", dir_ + "/server.key", dir_ + "/ca.crt");
  dep.start();
  auto o = parse_url(dep.tls_everywhere_url("ca=" + dir_ + "/ca.crt"));
  ASSERT_TRUE(o.tls.enabled);
  ASSERT_TRUE(o.sentinel.tls);
  o.connect_timeout = Ms(2000);
  o.command_timeout = Ms(3000);
  o.on_warning = [](const std::string&) {};
  Client c(o);
  ASSERT_TRUE(c.wait_connected(Ms(10000)));
  const std::uint16_t primary = dep.primary_port();
  ASSERT_EQ(primary, dep.data().primary().tls_port()) << "the sentinels name the primary's TLS port";
  EXPECT_EQ(c.address(), fmt::format("127.0.0.1:{}", primary));
  EXPECT_EQ(c.exec(Command{"SET", "t:tls-everywhere", "1"}).str, "OK");
  // Asked in plain on the side: written on the primary, replicated over TLS.
  EXPECT_EQ(redis_command_at("127.0.0.1", dep.node(primary).port(), "GET t:tls-everywhere"), "1");
  const std::uint16_t replica_plain = dep.data().replica(0).port();
  EXPECT_TRUE(eventually([&] { return redis_command_at("127.0.0.1", replica_plain, "GET t:tls-everywhere") == "1"; },
                         Ms(5000)));

  const std::uint16_t promoted = dep.failover();
  ASSERT_EQ(promoted, dep.data().replica(0).tls_port());
  // A call that meets the old primary's closed or demoted connection fails
  // (it may or may not have run); the next ones go to the promoted replica.
  EXPECT_TRUE(eventually(
      [&] {
        try {
          return c.exec(Command{"SET", "t:tls-everywhere", "2"}).str == "OK" &&
                 c.address() == fmt::format("127.0.0.1:{}", promoted);
        } catch (const Error&) {
          return false;
        }
      },
      Ms(15000)))
      << "now at " << c.address();
  EXPECT_EQ(redis_command_at("127.0.0.1", replica_plain, "GET t:tls-everywhere"), "2");
  EXPECT_NE(redis_command_at("127.0.0.1", replica_plain, "INFO replication").find("role:master"), std::string::npos);
}

// Sentinels behind TLS (sentinel_tls=yes; rediss+sentinel:// is the same with
// TLS to the data nodes too): the client asks them over TLS, with the data
// nodes' CA, and finds the primary; a sentinel whose certificate the CA did
// not sign fails the lookup with a TLS error, not the deadline; a plain
// question to a TLS port finds nothing.
TEST_F(RedisTls, SentinelsOverTlsNameThePrimary) {
  test::SentinelRedis dep(1, 2);
  dep.sentinel_tls(dir_ + "/server.crt", dir_ + "/server.key", dir_ + "/ca.crt");
  dep.start();
  auto opts = [&](const std::string& url) {
    auto o = parse_url(url);
    o.connect_timeout = Ms(2000);
    o.command_timeout = Ms(3000);
    o.on_warning = [](const std::string&) {};
    return o;
  };
  Client c(opts(dep.tls_url("ca=" + dir_ + "/ca.crt")));
  ASSERT_TRUE(c.wait_connected(Ms(10000)));
  const std::uint16_t primary = dep.primary_port();
  EXPECT_EQ(c.address(), fmt::format("127.0.0.1:{}", primary));
  EXPECT_EQ(c.exec(Command{"SET", "t:sentinel-tls", "1"}).str, "OK");
  EXPECT_EQ(redis_command_at("127.0.0.1", primary, "GET t:sentinel-tls"), "1");

  Client wrong_ca(opts(dep.tls_url("ca=" + dir_ + "/other-ca.crt")));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    wrong_ca.exec(Command{"PING"});
    ADD_FAILURE() << "a sentinel with a certificate of another CA was used";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no sentinel named the primary"), std::string::npos) << what;
    EXPECT_NE(what.find(fmt::format("127.0.0.1:{}", dep.sentinel(0).tls_port())), std::string::npos) << what;
  }
  EXPECT_LT(since(t0), Ms(10000));

  // Without sentinel_tls the same ports answer nothing a client can read.
  std::string plain = dep.tls_url();
  plain.replace(plain.find("?sentinel_tls=yes"), std::string("?sentinel_tls=yes").size(), "");
  Client no_tls(opts(plain));
  EXPECT_FALSE(no_tls.wait_connected(Ms(1500)));

  // Sentinels learned from the first (SENTINEL sentinels) are asked over TLS
  // too: with the one in the URL gone, a reconnect finds the primary through
  // the other.
  auto one = opts(fmt::format("redis+sentinel://127.0.0.1:{}/{}?sentinel_tls=yes&ca={}&name=tls-learn",
                              dep.sentinel(0).tls_port(), dep.master_name(), dir_ + "/ca.crt"));
  Client learner(one);
  ASSERT_TRUE(learner.wait_connected(Ms(10000)));
  dep.sentinel(0).kill();
  redis_command_at("127.0.0.1", primary, "CLIENT KILL TYPE normal");
  // A call that meets the killed connection fails (it may or may not have
  // been sent); the next ones go out once the client is back.
  EXPECT_TRUE(eventually(
      [&] {
        try {
          return learner.exec(Command{"GET", "t:sentinel-tls"}).str == "1";
        } catch (const Error&) {
          return false;
        }
      },
      Ms(10000)));
}
