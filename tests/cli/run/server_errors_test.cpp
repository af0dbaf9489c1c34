// `jobguard run` against a server that refuses to serve: the server's own
// words, its host:port and the key reach the user in one line, and the exit
// status says "unavailable" (69), not "usage": OOM,
// READONLY, MASTERDOWN and LOADING from real redis-servers put in that state;
// replies over the client's limits from a hostile peer are a protocol error (76).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "support/cli_fixture.hpp"
#include "support/peers.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;

class RunServerErrors : public CliTest {
 protected:
  // `jobguard run` on this test's server fails closed: 69, one line with the
  // server's own words and its host:port, CMD not run. Returns the run.
  SubprocessResult expect_unavailable_saying(const std::string& server_text) {
    const auto marker = file("ran");
    const auto r = run_jobguard({"--redis", url(), "run", "--key", "k", "--", "touch", marker}, 30s);
    EXPECT_EQ(r.status, 69) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(server_text), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(fmt::format("{}:{}", server->host(), server->port())), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(marker)) << "CMD ran";
    return r;
  }
};

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

  const auto r = expect_unavailable_saying("OOM command not allowed");
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

TEST_F(RunServerErrors, ReplicaThatMustNotServeStaleDataGivesItsMasterdownTextAndExit69) {
  // A replica told not to serve stale data answers every data command with
  // MASTERDOWN while its link to the master is down (here: no master at all).
  admin("CONFIG SET replica-serve-stale-data no");
  admin("REPLICAOF 127.0.0.1 1");
  expect_unavailable_saying("MASTERDOWN Link with MASTER is down");
}

TEST_F(RunServerErrors, ServerStillLoadingItsDatasetGivesItsLoadingTextAndExit69) {
  // A server loading its RDB answers data commands with LOADING. Redis' own
  // test knob key-load-delay (µs per key) makes 1,000 keys load for 100 s, and
  // an event-processing interval of 1 KB lets it answer (INFO, and LOADING to
  // everything else) between keys instead of only every 2 MB; uncompressed,
  // each 1,000-byte key is about that interval. The run below
  // meets the loading server whatever the host's speed: loading only gets
  // slower on a slow host.
  EmbeddedRedisOptions so;
  so.persistence = true;
  so.extra_args = {"--enable-debug-command", "yes", "--key-load-delay", "100000",
                   "--loading-process-events-interval-bytes", "1024", "--rdbcompression", "no"};
  server = std::make_unique<EmbeddedRedis>(so);
  server->start();
  admin("DEBUG POPULATE 1000 filler 1000");
  ASSERT_EQ(admin("SAVE"), "OK");
  server->restart();  // ready once INFO answers: loading has begun
  ASSERT_NE(admin("INFO persistence").find("loading:1"), std::string::npos) << admin("INFO persistence");
  expect_unavailable_saying("LOADING Redis is loading the dataset in memory");
  server->kill();  // no need to wait out the load
}

// Reply limits where the user meets them: a peer on the Redis port that
// declares two billion elements would abort an unbounded reader
// (std::bad_alloc), twenty million block it for seconds, a 4 GB bulk string
// be buffered. Each is a protocol error naming the limit, and the run fails closed:
// 76 (no retry makes that peer speak Redis), CMD not run, never a crash.
TEST_F(RunServerErrors, RepliesOverTheClientsLimitsAreRefusedExit76AndNeverCrash) {
  struct Case {
    std::string reply;
    bool flood;
    std::string says;
  };
  for (const auto& c : std::vector<Case>{{"*2000000000\r\n", false, "2000000000 array elements"},
                                         {"*20000000\r\n:1\r\n:2\r\n", false, "20000000 array elements"},
                                         {"$4000000000\r\n", true, "max_bulk_bytes"}}) {
    HostileServer hostile(c.reply, c.flood);
    const auto marker = file("ran");
    const auto r = run_jobguard(
        {"--redis", fmt::format("redis://127.0.0.1:{}/0", hostile.port()), "run", "--key", "k", "--", "touch", marker},
        60s);
    EXPECT_FALSE(r.signaled) << c.says << ": killed by a signal (" << r.status - 128 << "): " << r.err;
    EXPECT_EQ(r.status, 76) << c.says << ": " << r.err;
    // The client's warning that it dropped the connection may precede it;
    // the run's own error is the last line.
    const auto last = r.err.substr(r.err.rfind('\n', r.err.size() - 2) + 1);
    EXPECT_NE(last.find("jobguard run: protocol error"), std::string::npos) << r.err;
    EXPECT_NE(last.find(c.says), std::string::npos) << r.err;
    EXPECT_NE(last.find("CMD not run"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(marker)) << c.says;
  }
}

}  // namespace
}  // namespace jobguard::test
