// `jobguard run` against a server that refuses to serve: the server's own
// words, its host:port and the key reach the user in one line, and the exit
// status says "unavailable" (69), not "usage" (issues #10 and #12).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "support/cli_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;

class RunServerErrors : public CliTest {};

TEST_F(RunServerErrors, OutOfMemoryServerGivesItsOomTextHostAndKeyAndExit69) {
  EmbeddedRedisOptions so;
  so.extra_args = {"--maxmemory", "1mb", "--maxmemory-policy", "noeviction"};
  server = std::make_unique<EmbeddedRedis>(so);
  server->start();
  // Trusted before it fills: this test is about the grant's OOM refusal, not
  // the quarantine of a server with no lock-state record.
  trust_server();
  // Fill it until the server itself refuses writes, then until it refuses even
  // a small one. A refused 64 KB SET frees its query buffer, which can drop the
  // server back under maxmemory for a few small writes (the lock's SET among
  // them): only a refused small write leaves it refusing the next.
  auto client = make_client();
  auto fill = [&](const std::string& value, int first) {
    for (int i = first; i < first + 100000; ++i) {
      try {
        client->exec(redis::Command{"SET", key(std::to_string(i)), value});
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("OOM"), std::string::npos) << e.what();
        return true;
      }
    }
    return false;
  };
  ASSERT_TRUE(fill(std::string(64 * 1024, 'x'), 0)) << "the server never filled up";
  ASSERT_TRUE(fill(std::string(16, 'x'), 1000)) << "the server never refused a small write";

  const auto r = run_jobguard({"--redis", url(), "run", "--key", "k", "--", "true"}, 30s);
  EXPECT_EQ(r.status, 69) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("OOM command not allowed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(fmt::format("{}:{}", server->host(), server->port())), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("jobguard:lock:{k}"), std::string::npos) << r.err;
}

TEST_F(RunServerErrors, ReadOnlyReplicaGivesItsReadonlyTextAndExit69) {
  // A replica of an unreachable master still answers, read-only.
  admin("REPLICAOF 127.0.0.1 1");
  const auto r = run_jobguard({"--redis", url(), "run", "--key", "k", "--", "true"}, 30s);
  EXPECT_EQ(r.status, 69) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  // The lock-state check (docs/lock-safety.md, quarantine) reads the server's
  // role before the grant and names it; a write that got through would carry
  // the server's own READONLY text.
  EXPECT_TRUE(r.err.find("READONLY") != std::string::npos || r.err.find("not a primary") != std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(fmt::format("{}:{}", server->host(), server->port())), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("jobguard:lock:{k}"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace jobguard::test
