// TLS against redis-server --tls-port, with a CA and server certificate made
// by the openssl CLI for this test run.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "helpers.hpp"
#include "support/redis_fixture.hpp"

using namespace jobguard;
using namespace jobguard::redis;
using namespace jobguard::test;

namespace {

void run(const std::string& cmd) {
  const int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  ASSERT_EQ(rc, 0) << "failed: " << cmd;
}

// Makes a CA; with `leaf`, also a server certificate it signs for
// IP:127.0.0.1 and DNS:localhost.
void make_ca(const std::string& dir, const std::string& name) {
  run(fmt::format(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj '/CN=jobguard test {0}' "
      "-keyout {1}/{0}.key -out {1}/{0}.crt",
      name, dir));
}

}  // namespace

class RedisTls : public jobguard::test::RedisTest {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "jobguard-tls-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    make_ca(dir_, "ca");
    make_ca(dir_, "other-ca");
    std::ofstream(dir_ + "/ext.cnf") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                        "basicConstraints=CA:FALSE\n"
                                        "extendedKeyUsage=serverAuth\n";
    run(fmt::format("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj '/CN=localhost' "
                    "-keyout {0}/server.key -out {0}/server.csr",
                    dir_));
    run(fmt::format("openssl x509 -req -in {0}/server.csr -CA {0}/ca.crt -CAkey {0}/ca.key -CAcreateserial "
                    "-days 2 -extfile {0}/ext.cnf -out {0}/server.crt",
                    dir_));
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
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
