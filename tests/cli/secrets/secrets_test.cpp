#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/testing/embedded_redis.hpp"
#include "support/cli_fixture.hpp"
#include "support/subprocess.hpp"

using jobguard::test::run_jobguard;
using jobguard::test::SubprocessResult;
using namespace std::chrono_literals;

namespace {

std::string all_output(const SubprocessResult& r) { return r.out + r.err; }

// Every byte a run printed must be free of `secret` and of any piece of it
// long enough to identify it.
void expect_never_printed(const SubprocessResult& r, const std::string& secret) {
  const std::string all = all_output(r);
  for (std::size_t len = std::min<std::size_t>(4, secret.size()); len <= secret.size(); ++len)
    for (std::size_t i = 0; i + len <= secret.size(); ++i) {
      const std::string piece = secret.substr(i, len);
      if (piece.find_first_not_of("/?@:") == std::string::npos) continue;  // punctuation alone proves nothing
      EXPECT_EQ(all.find(piece), std::string::npos) << "printed \"" << piece << "\" of the password:\n" << all;
    }
}

class SecretsCli : public jobguard::test::CliTest {};

}  // namespace

// The password "se/cr?et" must not be split at '/', nor the error
// quote a piece of it as the port.
TEST(SecretsCliNoServer, PasswordWithSlashAndQuestionMarkIsNeverPrinted) {
  // Port 1 on loopback: nothing listens, so the run fails closed (69)
  // after parsing the URL; no redis-server needed.
  for (const std::string url : {"redis://:se/cr?et@127.0.0.1:1/0", "redis://app:se/cr?et@127.0.0.1:1/0?timeout=200ms",
                                "redis://se/cr?et@127.0.0.1:1"}) {
    const auto r = run_jobguard({"--redis", url, "run", "--key", "k", "--", "true"}, 30s);
    EXPECT_EQ(r.status, 69) << url << "\n" << all_output(r);
    expect_never_printed(r, "se/cr?et");
  }
  // Malformed URLs: usage error naming the problem, still no password.
  for (const std::string url : {"redis://:se/cr?et@127.0.0.1:hun/0", "redis://app:se/cr?et@", "redis://app:secret/0",
                                "redis://:se/cr?et@h?bogus=1", "redis://:se/cr?et@h?timeout=500us"}) {
    const auto r = run_jobguard({"--redis", url, "run", "--key", "k", "--", "true"}, 30s);
    EXPECT_EQ(r.status, 64) << url << "\n" << all_output(r);
    EXPECT_NE(r.err.find("invalid URL"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
    expect_never_printed(r, url.find("se/cr?et") != std::string::npos ? "se/cr?et" : "secret");
  }
}

TEST(SecretsCliNoServer, HelpShowsTheEnvironmentUrlRedacted) {
  const auto r = run_jobguard({"--help"}, 30s, {{"JOBGUARD_REDIS_URL", "redis://ops:hq7/zv3-kw@cache.internal:6380/1"},
                                                {"JOBGUARD_POSTGRES_URL", "postgresql://app:pg-s3cret@db/jobs"}});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("redis://ops:***@cache.internal:6380/1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("postgresql://app:***@db/jobs"), std::string::npos) << r.out;
  expect_never_printed(r, "hq7/zv3-kw");
  expect_never_printed(r, "pg-s3cret");
}

TEST(SecretsCliNoServer, MalformedPostgresUrlIsNotEchoedWithItsPassword) {
  for (const std::string url : {"postgresql://app:pg/s3cret@db:5432x/jobs", "postgresql://app:pg-s3cret@db:notaport/jobs",
                                "host=db password=pg-s3cret port=abc bogus"}) {
    const auto r = run_jobguard({"--postgres", url, "pg", "migrate"}, 30s);
#ifdef JOBGUARD_TESTS_WITHOUT_POSTGRES
    // Refused before the URL is read: a Redis-only build.
    EXPECT_EQ(r.status, 78) << url << "\n" << all_output(r);
#else
    // 64 when libpq refuses the text, 69 when it parses and the connect
    // fails on it (a non-numeric port is noticed only then).
    EXPECT_TRUE(r.status == 64 || r.status == 69) << url << "\n" << all_output(r);
#endif
    EXPECT_FALSE(r.err.empty());
    expect_never_printed(r, url.find("pg/s3cret") != std::string::npos ? "pg/s3cret" : "pg-s3cret");
  }
}

// The duration bounds, where the user meets them.
TEST(SecretsCliNoServer, DurationsAreBoundedAndNeverRoundToNothing) {
  struct Case {
    std::vector<std::string> args;
    const char* says;
  };
  for (const auto& c : std::vector<Case>{
           {{"run", "--key", "k", "--timeout", "3000000h", "--", "true"}, "above the maximum of 720h"},
           {{"run", "--key", "k", "--ttl", "3000000h", "--", "true"}, "above the maximum of 720h"},
           {{"run", "--key", "k", "--timeout", "500us", "--", "true"}, "round to nothing"},
           {{"run", "--key", "k", "--wait", "1500us", "--", "true"}, "sub-millisecond"},
           {{"run", "--key", "k", "--ttl", "99999999999999999999999s", "--", "true"}, "above the maximum"}}) {
    const auto r = run_jobguard(c.args, 30s);
    EXPECT_EQ(r.status, 64) << all_output(r);
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
  }
}

TEST_F(SecretsCli, CompoundDurationsAreAccepted) {
  // A TTL above the default max_ttl (60 s) needs the URL to say so.
  const auto r = run_jobguard({"--redis", url() + "?max_ttl=49h", "run", "--key", "compound", "--ttl", "48h30m", "--timeout",
                               "1h2m3s4ms", "--", "true"},
                              30s);
  EXPECT_EQ(r.status, 0) << all_output(r);
}

TEST(SecretsCliNoServer, ControlBytesInAKeyAreEscaped) {
  const auto r = run_jobguard({"--redis", "redis://127.0.0.1:1/0", "run", "--key", "bad\nkey\x1b[2J", "--", "true"});
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
}

// A password kept out of argv and the URL.
class PasswordSources : public ::testing::Test {
 protected:
  void SetUp() override {
    jobguard::EmbeddedRedisOptions o;
    o.extra_args = {"--requirepass", kPassword};
    server = std::make_unique<jobguard::EmbeddedRedis>(o);
    server->start();
    url = "redis://" + server->host() + ":" + std::to_string(server->port()) + "/0";
    {
      // A server this test just started empty: not quarantined (lock.hpp).
      auto conn = jobguard::redis::parse_url(url);
      conn.password = kPassword;
      jobguard::redis::Client c(conn);
      jobguard::trust_new_server(c);
    }
    dir = ::testing::TempDir() + "jobguard-secrets-" + std::to_string(::getpid()) + "-" +
          ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir);
  }
  void TearDown() override {
    server.reset();
    std::filesystem::remove_all(dir);
  }
  std::string write(const std::string& name, const std::string& content) {
    const std::string path = dir + "/" + name;
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }

  static constexpr const char* kPassword = "p/w?x@y:z";
  std::unique_ptr<jobguard::EmbeddedRedis> server;
  std::string url, dir;
};

TEST_F(PasswordSources, FromAFileWithATrailingNewline) {
  const auto file = write("pw", std::string(kPassword) + "\n");
  const auto r = run_jobguard({"--redis", url, "--redis-password-file", file, "run", "--key", "pwfile", "--", "true"});
  EXPECT_EQ(r.status, 0) << all_output(r);
  expect_never_printed(r, kPassword);
}

TEST_F(PasswordSources, FromTheEnvironment) {
  const auto r = run_jobguard({"--redis", url, "run", "--key", "pwenv", "--", "true"}, 30s,
                              {{"JOBGUARD_REDIS_PASSWORD", kPassword}});
  EXPECT_EQ(r.status, 0) << all_output(r);
}

TEST_F(PasswordSources, WrongOrMissingPasswordFailsClosedWithoutPrintingIt) {
  const auto wrong = write("wrong", "zq-wrong-9x\n");
  auto r = run_jobguard({"--redis", url, "--redis-password-file", wrong, "run", "--key", "pwwrong", "--", "true"});
  EXPECT_EQ(r.status, 78) << all_output(r);
  expect_never_printed(r, "zq-wrong-9x");
  r = run_jobguard({"--redis", url, "run", "--key", "pwnone", "--", "true"});
  EXPECT_EQ(r.status, 78) << all_output(r);
}

TEST_F(PasswordSources, BadFileOrTwoPasswordsIsAUsageError) {
  auto r = run_jobguard({"--redis", url, "--redis-password-file", dir + "/missing", "run", "--key", "k", "--", "true"});
  EXPECT_EQ(r.status, 64) << all_output(r);
  EXPECT_NE(r.err.find("--redis-password-file"), std::string::npos) << r.err;
  r = run_jobguard({"--redis", url, "--redis-password-file", write("empty", "\n"), "run", "--key", "k", "--", "true"});
  EXPECT_EQ(r.status, 64) << all_output(r);
  EXPECT_NE(r.err.find("is empty"), std::string::npos) << r.err;
  const std::string with_pw = "redis://:other-s3cret@" + server->host() + ":" + std::to_string(server->port());
  r = run_jobguard({"--redis", with_pw, "run", "--key", "k", "--", "true"}, 30s, {{"JOBGUARD_REDIS_PASSWORD", kPassword}});
  EXPECT_EQ(r.status, 64) << all_output(r);
  EXPECT_NE(r.err.find("already has a password"), std::string::npos) << r.err;
  expect_never_printed(r, "other-s3cret");
  expect_never_printed(r, kPassword);
}
