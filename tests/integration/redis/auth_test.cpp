// AUTH (ACL users, requirepass) and SELECT, as set by the URL.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "helpers.hpp"
#include "support/redis_fixture.hpp"

using namespace jobguard;
using namespace jobguard::redis;
using namespace jobguard::test;

class RedisAuth : public jobguard::test::RedisTest {
 protected:
  ConnectionOptions from_url(const std::string& userinfo_and_path) const {
    auto o = parse_url(fmt::format("redis://{}", userinfo_and_path));
    // "Fast" below means well before this; the error code proves it too: a
    // call that waits out its deadline fails with not_connected instead.
    o.command_timeout = Ms(20000);
    o.connect_timeout = Ms(20000);
    return o;
  }
  std::string hostport() const { return fmt::format("{}:{}", server->host(), server->port()); }
};

TEST_F(RedisAuth, AclUserFromTheUrlAuthenticates) {
  ASSERT_EQ(admin("ACL SETUSER alice on >pw ~* +@all"), "OK");
  Client c(from_url("alice:pw@" + hostport()));
  EXPECT_EQ(c.exec(Command{"ACL", "WHOAMI"}).str, "alice");
  EXPECT_TRUE(c.exec(Command{"SET", key("k"), "v"}).is_ok());
}

TEST_F(RedisAuth, WrongPasswordFailsFastNamingTheUserAndTheServer) {
  ASSERT_EQ(admin("ACL SETUSER alice on >pw ~* +@all"), "OK");
  Client c(from_url("alice:not-the-password@" + hostport()));
  for (int attempt = 0; attempt < 2; ++attempt) {  // the first call waits for the handshake, the second does not
    const auto t0 = SteadyClock::now();
    const Error e = error_of([&] { c.exec(Command{"PING"}); });
    EXPECT_LT(since(t0), Ms(10000)) << "must not wait out the 20 s deadline";
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), errc::auth_failed) << msg;
    EXPECT_EQ(e.next(), next_step::stop);
    EXPECT_NE(msg.find("\"alice\""), std::string::npos) << msg;
    EXPECT_NE(msg.find(hostport()), std::string::npos) << msg;
    EXPECT_NE(msg.find("WRONGPASS"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("not-the-password"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_EQ(c.stats().connected, 0);
}

TEST_F(RedisAuth, RequirepassServerWithPasswordOnlyUrl) {
  EmbeddedRedisOptions so;
  so.extra_args = {"--requirepass", "s3cret"};
  server = std::make_unique<EmbeddedRedis>(so);
  server->start();
  Client c(from_url("s3cret@" + hostport()));
  EXPECT_TRUE(c.exec(Command{"SET", key("k"), "v"}).is_ok());
  EXPECT_EQ(c.exec(Command{"GET", key("k")}).str, "v");

  // No password at all: the server says NOAUTH, which is a stop error too.
  Client anon(from_url(hostport()));
  const Error e = error_of([&] { anon.exec(Command{"GET", key("k")}); });
  EXPECT_EQ(e.code(), errc::auth_failed) << e.what();
  EXPECT_NE(std::string(e.what()).find("NOAUTH"), std::string::npos) << e.what();
}

TEST_F(RedisAuth, SelectDbFromTheUrl) {
  Client db3(from_url(hostport() + "/3"));
  EXPECT_TRUE(db3.exec(Command{"SET", key("k"), "in-3"}).is_ok());
  EXPECT_NE(db3.exec(Command{"CLIENT", "INFO"}).str.find(" db=3 "), std::string::npos);
  EXPECT_EQ(db3.exec(Command{"GET", key("k")}).str, "in-3");
  EXPECT_EQ(admin("EXISTS " + key("k")), "0") << "the key must not land in db 0";
  Client db0(from_url(hostport() + "/0"));
  EXPECT_TRUE(db0.exec(Command{"GET", key("k")}).is_nil());
  EXPECT_EQ(db0.exec(Command{"MOVE", key("missing"), "3"}).integer, 0);

  // A db the server does not have is a configuration error: fail fast, say which.
  Client db99(from_url(hostport() + "/99"));
  const auto t0 = SteadyClock::now();
  const Error e = error_of([&] { db99.exec(Command{"PING"}); });
  EXPECT_LT(since(t0), Ms(10000));
  EXPECT_EQ(e.next(), next_step::stop) << e.what();
  EXPECT_NE(std::string(e.what()).find("SELECT"), std::string::npos) << e.what();
}
