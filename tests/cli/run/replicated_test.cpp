// `jobguard run` against replicated deployments: `replicas=1` on
// the URL confirms the grant with WAIT, a stopped replica makes the run fail
// closed (exit 69, one line, CMD not run), and a redis+sentinel:// URL finds
// the primary through the sentinels.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "support/replicated_redis.hpp"
#include "support/sentinel_redis.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;

std::string temp_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          fmt::format("jobguard-replicated-{}-{}", ::getpid(), name))
      .string();
}

TEST(RunReplicated, AGrantTheReplicaDoesNotConfirmIsExit69AndCmdDoesNotRun) {
  ReplicatedRedis set(1);
  set.start();
  // A long timeout while the replica runs (a loaded host acks late), a
  // short one for the refusal.
  const std::string healthy = fmt::format("redis://127.0.0.1:{}/0?replicas=1&replicas_timeout=2s", set.primary().port());
  const std::string url =
      fmt::format("redis://127.0.0.1:{}/0?replicas=1&replicas_timeout=200ms", set.primary().port());
  {
    redis::Client c(redis::parse_url(url));
    trust_new_server(c);
  }
  const std::string marker = temp_file("ran");
  std::filesystem::remove(marker);
  auto ok = run_jobguard({"--redis", healthy, "run", "--key", "k", "--fence", "--", "touch", marker}, 30s);
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_TRUE(std::filesystem::exists(marker));
  std::filesystem::remove(marker);

  set.replica(0).pause();
  auto r = run_jobguard({"--redis", url, "run", "--key", "k", "--fence", "--", "touch", marker}, 30s);
  set.replica(0).resume();
  EXPECT_EQ(r.status, 69) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("not confirmed by replicas: 0 of 1 replicas acknowledged within 200 ms"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(fmt::format("127.0.0.1:{}", set.primary().port())), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(marker)) << "CMD ran on an unconfirmed grant";
}

TEST(RunReplicated, ASentinelUrlFindsThePrimary) {
  SentinelRedis dep;
  dep.start();
  {
    redis::Client c(redis::parse_url(dep.url()));
    trust_new_server(c);
  }
  auto r = run_jobguard({"--redis", dep.url("replicas=2"), "run", "--key", "k", "--fence", "--", "sh", "-c",
                         "echo $JOBGUARD_FENCE"},
                        30s);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
}

}  // namespace
}  // namespace jobguard::test
