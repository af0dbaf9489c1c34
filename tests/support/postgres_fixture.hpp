// A throwaway PostgreSQL 15 cluster: a copy of one initdb'd template per
// build tree in a temp dir, a free loopback port, trust auth, fsync off.
// Test binaries share one per process (shared_postgres()) and each test uses
// its own table/key names.
//
// Threads: not thread-safe; one owner. The cluster is stopped (pg_ctl stop -m
// immediate) and its directory removed by the destructor. A forked test child
// must leave with _exit() so it never runs that destructor.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "jobguard/guard/postgres.hpp"

namespace jobguard::test {

class PostgresServer {
 public:
  PostgresServer();  // creates the temp dir; start() copies the template cluster + pg_ctl start
  ~PostgresServer();
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;

  void start();  // throws std::runtime_error with the tool's log on failure
  void stop();
  // Shuts the running cluster down cleanly and adds standby.signal, so the
  // next start() brings it up as a hot standby with no primary: in recovery,
  // read-only, answering queries (a server configured the bad way for
  // `jobguard doctor`).
  void make_standby();

  std::uint16_t port() const noexcept { return port_; }
  const std::string& dir() const noexcept { return dir_; }
  // postgresql://postgres@127.0.0.1:PORT/postgres
  std::string url() const;

 private:
  std::string dir_;
  std::uint16_t port_ = 0;
  bool running_ = false;
};

// One cluster per test process, started on first use.
PostgresServer& shared_postgres();

// Base fixture: options for the shared cluster (short timeouts), migrated once.
class PostgresTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static guard::PgOptions pg_options();
  // A lowercase SQL-safe name unique to this test: "t_suite_test_suffix".
  static std::string name(const std::string& suffix);
};

// Runs argv (no shell); returns the exit status, output appended to `out`.
int run_command(const std::vector<std::string>& argv, std::string* out = nullptr);

}  // namespace jobguard::test
