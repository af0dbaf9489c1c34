// EmbeddedPostgres::abandon(): what the demo's interrupt thread calls while
// its main thread may be anywhere in start(). Nothing may run in the
// directory once it returns, so the directory, once removed, stays removed.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "jobguard/error.hpp"
#include "jobguard/testing/embedded_postgres.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;

void expect_removed_for_good(const std::string& dir) {
  EXPECT_EQ(processes_naming(dir), std::vector<std::string>{});
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  EXPECT_FALSE(ec) << ec.message();
  // Nothing left running writes into it again.
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir << " came back";
}

TEST(EmbeddedPostgresAbandon, DuringInitdbNothingIsLeftRunningAndTheServerIsNeverStarted) {
  EmbeddedPostgres pg;
  std::atomic<bool> started{false};
  std::string error;
  std::thread starter([&] {
    try {
      pg.start();
      started = true;
    } catch (const Error& e) {
      error = e.what();
    }
  });
  // initdb has begun: the cluster's directory is there, the server is not.
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < until && !std::filesystem::exists(pg.data_dir() + "/base") &&
         !pg.running())
    std::this_thread::sleep_for(5ms);
  ASSERT_FALSE(pg.running()) << "initdb finished before the test saw it run";
  pg.abandon();
  starter.join();
  EXPECT_FALSE(started.load()) << "start() went on after abandon()";
  EXPECT_FALSE(error.empty());
  EXPECT_FALSE(pg.running());
  expect_removed_for_good(pg.dir());
}

TEST(EmbeddedPostgresAbandon, ARunningServerIsStoppedAndNoLaterStartRuns) {
  EmbeddedPostgres pg;
  pg.start();
  ASSERT_TRUE(pg.running());
  ASSERT_FALSE(processes_naming(pg.dir()).empty());
  pg.abandon();
  EXPECT_FALSE(pg.running());
  try {
    pg.start();
    ADD_FAILURE() << "started after abandon()";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::postgres_unavailable));
    EXPECT_NE(std::string(e.what()).find("abandoned"), std::string::npos) << e.what();
  }
  expect_removed_for_good(pg.dir());
}

}  // namespace
}  // namespace jobguard::test
