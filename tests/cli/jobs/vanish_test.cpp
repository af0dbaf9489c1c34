// `jobguard jobs work` keeps working when its stream or consumer group
// vanishes under it: a DEL of the stream while the worker is blocked reading
// it (UNBLOCKED), and a Redis restart without persistence (NOGROUP); neither
// may make the worker exit 64. And when its connection silently dies (a
// frozen TCP relay, like a dropped NAT entry), it must not log "deadline
// exceeded" for ever.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "jobguard/redis/client.hpp"
#include "support/cli_fixture.hpp"
#include "support/peers.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;

class JobsVanish : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    stream_ = key("q");
    out_ = file("out");
  }
  std::vector<std::string> worker_argv() const { return worker_argv(url()); }
  std::vector<std::string> worker_argv(const std::string& redis_url) const {
    // CMD appends the job's id field to the output file: the ground truth.
    // A restarted server is quarantined for max_ttl (docs/lock-safety.md):
    // short here, so the test waits seconds, not the default minute; a job
    // refused meanwhile stays pending and is reclaimed after claim-idle.
    const std::string options = redis_url.find('?') == std::string::npos ? "?max_ttl=2s" : "&max_ttl=2s";
    return {jobguard_binary(), "--redis", redis_url + options, "jobs", "work", "--stream", stream_, "--class", "t",
            "--ttl", "2s", "--claim-idle", "1s", "--consumer", "w1", "--", "sh", "-c", "echo \"$JOBGUARD_FIELD_ID\" >> \"$0\"", out_};
  }
  void add(const std::string& id) {
    // Added with the admin connection: the worker sees what any producer adds.
    ASSERT_NE(admin(fmt::format("XADD {} * id {}", stream_, id)).find('-'), std::string::npos);
  }
  bool done(const std::string& id) const {
    std::istringstream in(read_file(out_));
    for (std::string l; std::getline(in, l);)
      if (l == id) return true;
    return false;
  }
  std::string stream_, out_;
};

TEST_F(JobsVanish, WorkerSurvivesItsStreamBeingDeletedAndARedisRestartWithoutPersistence) {
  Subprocess worker(worker_argv());
  add("1");
  ASSERT_TRUE(eventually([&] { return done("1"); }, 20s)) << worker.err();

  // DEL while the worker sits in XREADGROUP BLOCK: the read ends with
  // "UNBLOCKED the stream key no longer exists", later reads with NOGROUP.
  ASSERT_EQ(admin("DEL " + stream_), "1");
  add("2");
  ASSERT_TRUE(eventually([&] { return done("2"); }, 20s)) << worker.err();
  ASSERT_TRUE(worker.running()) << worker.err();

  // The server restarts empty (no persistence): stream and group are gone.
  server->restart();
  add("3");
  ASSERT_TRUE(eventually([&] { return done("3"); }, 30s)) << worker.err();
  ASSERT_TRUE(worker.running()) << worker.err();

  worker.signal(SIGTERM);
  const auto r = worker.wait_or_kill(30s);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.status, 64) << r.err;
}

TEST_F(JobsVanish, WorkerBehindAFrozenLinkReplacesItsConnectionAndTakesTheNextJob) {
  // Every connection the worker has open stops moving bytes, both ways, and
  // stays open: no reset, no FIN, so only the worker's deadlines can tell.
  // New connections through the relay pass. The short command deadline keeps
  // the three timeouts that recycle a connection (the client's default) to a
  // few seconds.
  FrozenRelay relay(server->port());
  Subprocess worker(worker_argv(fmt::format("redis://127.0.0.1:{}/0?timeout=500ms", relay.port())));
  add("1");
  ASSERT_TRUE(eventually([&] { return done("1"); }, 20s)) << worker.err();
  const int before = relay.accepted();

  relay.freeze_existing();
  add("2");
  ASSERT_TRUE(eventually([&] { return done("2"); }, 60s)) << worker.err();
  EXPECT_GT(relay.accepted(), before) << "the job came over a new connection";
  EXPECT_NE(worker.err().find("connection recycled"), std::string::npos) << worker.err();
  ASSERT_TRUE(worker.running()) << worker.err();

  worker.signal(SIGTERM);
  const auto r = worker.wait_or_kill(30s);
  EXPECT_EQ(r.status, 0) << r.err;
}

}  // namespace
}  // namespace jobguard::test
