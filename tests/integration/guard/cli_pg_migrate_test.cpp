// `jobguard pg migrate`, run as the real binary against the test cluster.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdlib>

#include "jobguard/testing/embedded_redis.hpp"
#include "support/postgres_fixture.hpp"

using namespace jobguard;
using jobguard::test::PostgresTest;
using jobguard::test::run_command;

namespace {

guard::PgOptions PgMigrateCliOptions() {
  guard::PgOptions o;
  o.url = test::shared_postgres().url();
  return o;
}

const std::string kBinary = std::string(JOBGUARD_BINARY_DIR) + "/apps/jobguard/jobguard";

std::string fresh_database(const std::string& db) {
  guard::PgConnection admin(PgMigrateCliOptions());
  admin.exec("CREATE DATABASE " + db);
  return fmt::format("postgresql://postgres@127.0.0.1:{}/{}", test::shared_postgres().port(), db);
}

}  // namespace

class PgMigrateCli : public PostgresTest {};

TEST_F(PgMigrateCli, FirstRunPrintsWhatItCreatedSecondRunIsUpToDate) {
  const auto url = fresh_database(name("db"));
  std::string out;
  ASSERT_EQ(run_command({kBinary, "--postgres", url, "pg", "migrate"}, &out), 0) << out;
  EXPECT_NE(out.find("created table jobguard_fences"), std::string::npos) << out;
  EXPECT_NE(out.find("created table jobguard_completions"), std::string::npos) << out;
  EXPECT_NE(out.find("created table jobguard_idempotency"), std::string::npos) << out;
  out.clear();
  ASSERT_EQ(run_command({kBinary, "--postgres", url, "--json", "pg", "migrate"}, &out), 0) << out;
  EXPECT_NE(out.find(R"("created":[])"), std::string::npos) << out;
  out.clear();
  ASSERT_EQ(run_command({kBinary, "--postgres", url, "pg", "migrate"}, &out), 0) << out;
  EXPECT_NE(out.find("up to date"), std::string::npos) << out;
}

TEST_F(PgMigrateCli, NoUrlIsAUsageErrorSayingWhereToSetIt) {
  ::unsetenv("JOBGUARD_POSTGRES_URL");
  std::string out;
  EXPECT_EQ(run_command({kBinary, "pg", "migrate"}, &out), 64) << out;
  EXPECT_NE(out.find("JOBGUARD_POSTGRES_URL"), std::string::npos) << out;
}

TEST_F(PgMigrateCli, UnreachableServerExitsUnavailable) {
  std::string out;
  const auto url = fmt::format("postgresql://postgres@127.0.0.1:{}/postgres", pick_free_port());
  EXPECT_EQ(run_command({kBinary, "--postgres", url, "pg", "migrate"}, &out), 69) << out;
  EXPECT_NE(out.find("PostgreSQL unavailable"), std::string::npos) << out;
}
