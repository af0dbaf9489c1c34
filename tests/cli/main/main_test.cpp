// The dispatcher itself (apps/jobguard/main.cpp): the command table and
// --version, by running the real binary. No server needed.
#include <gtest/gtest.h>

#include <boost/version.hpp>
#include <string>
#include <utility>
#include <vector>

#include "jobguard/version.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

TEST(CliMain, VersionNamesJobguardTheClientLibrariesAndTheBuildType) {
  auto r = run_jobguard({"--version"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind(std::string("jobguard ") + jobguard::version_string + " (", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(" build)"), std::string::npos) << r.out;
  for (const char* lib : {"\nhiredis 0.", "\nOpenSSL ", "\nBoost 1."})
    EXPECT_NE(r.out.find(lib), std::string::npos) << "missing " << lib << " in:\n" << r.out;
  // Whether PostgreSQL is built in: its client libraries, or a line saying not.
#ifdef JOBGUARD_TESTS_WITHOUT_POSTGRES
  EXPECT_NE(r.out.find("\nPostgreSQL: not built in (JOBGUARD_WITH_POSTGRES=OFF)\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("libpq"), std::string::npos) << r.out;
#else
  EXPECT_NE(r.out.find("\nlibpqxx "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nlibpq "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("PostgreSQL: not built in"), std::string::npos) << r.out;
#endif
  EXPECT_NE(r.out.find("Boost " + std::to_string(BOOST_VERSION / 100000) + "." +
                       std::to_string(BOOST_VERSION / 100 % 1000) + "."),
            std::string::npos)
      << r.out;
}

TEST(CliMain, VersionNamesTheMallocTheBinaryRunsOn) {
  auto r = run_jobguard({"--version"});
  ASSERT_EQ(r.status, 0) << r.err;
#if JOBGUARD_EXPECT_JEMALLOC
  // Asked of the running process: jemalloc linked and answering, and counting
  // the bytes of a malloc, so it is the malloc in use.
  EXPECT_NE(r.out.find("\nmalloc: jemalloc 5."), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("not the malloc in use"), std::string::npos) << r.out;
#elif defined(__SANITIZE_ADDRESS__)
  EXPECT_NE(r.out.find("\nmalloc: AddressSanitizer's"), std::string::npos) << r.out;
#elif defined(__SANITIZE_THREAD__)
  EXPECT_NE(r.out.find("\nmalloc: ThreadSanitizer's"), std::string::npos) << r.out;
#else
  EXPECT_NE(r.out.find("\nmalloc: glibc 2."), std::string::npos) << r.out;
#endif
}

TEST(CliMain, HelpListsEverySubcommandOfTheTableInItsOrder) {
  auto r = run_jobguard({"--help"});
  ASSERT_EQ(r.status, 0) << r.err;
  std::size_t at = r.out.find("Subcommands:");
  ASSERT_NE(at, std::string::npos) << r.out;
  for (const char* name : {"\n  run ", "\n  jobs ", "\n  pg ", "\n  demo ", "\n  bench ", "\n  serve "}) {
    const auto next = r.out.find(name, at);
    ASSERT_NE(next, std::string::npos) << "missing or out of order: " << name << "\n" << r.out;
    at = next;
  }
}

TEST(CliMain, NoSubcommandIsAUsageError) {
  auto r = run_jobguard({});
  EXPECT_EQ(r.status, 64) << r.out << r.err;
}

#ifdef JOBGUARD_TESTS_WITHOUT_POSTGRES
// A Redis-only build refuses every use of PostgreSQL by name, with 78, before
// connecting anywhere (the Redis here is a dead port: 69 would mean it tried),
// and never falls back to Redis for what was meant for PostgreSQL.
TEST(CliMainWithoutPostgres, EveryUseOfPostgresIsRefusedByNameWith78) {
  const std::string pg = "postgresql://app:pg-s3cret@127.0.0.1:1/jobs";
  const std::string dead_redis = "redis://127.0.0.1:1/0";
  struct Case {
    std::vector<std::string> args;
    std::vector<std::pair<std::string, std::string>> env;
    const char* says;
  };
  const std::vector<Case> cases = {
      {{"pg", "migrate"}, {}, "jobguard pg migrate: this command needs PostgreSQL"},
      {{"--postgres", pg, "pg", "migrate"}, {}, "jobguard pg migrate: this command needs PostgreSQL"},
      {{"--postgres", pg, "run", "--key", "k", "--once", "r1", "--", "true"}, {},
       "jobguard run: --once with --postgres (or $JOBGUARD_POSTGRES_URL) needs PostgreSQL"},
      {{"run", "--key", "k", "--once", "r1", "--", "true"}, {{"JOBGUARD_POSTGRES_URL", pg}},
       "jobguard run: --once with --postgres (or $JOBGUARD_POSTGRES_URL) needs PostgreSQL"},
      {{"--postgres", pg, "doctor"}, {}, "jobguard doctor: --postgres (or $JOBGUARD_POSTGRES_URL) needs PostgreSQL"},
      {{"doctor"}, {{"JOBGUARD_POSTGRES_URL", pg}},
       "jobguard doctor: --postgres (or $JOBGUARD_POSTGRES_URL) needs PostgreSQL"},
      {{"demo", "--completions", "postgres"}, {}, "jobguard demo: --completions postgres needs PostgreSQL"},
      {{"--postgres", pg, "demo"}, {}, "jobguard demo: --postgres (or $JOBGUARD_POSTGRES_URL) needs PostgreSQL"},
      {{"demo"}, {{"JOBGUARD_POSTGRES_URL", pg}},
       "jobguard demo: --postgres (or $JOBGUARD_POSTGRES_URL) needs PostgreSQL"},
      {{"jobs", "work", "--stream", "s", "--class", "ledger-post", "--catalog",
        std::string(JOBGUARD_SOURCE_DIR) + "/docs/catalog.example.yaml", "--", "true"},
       {},
       "jobguard jobs work: class 'ledger-post' (consequence high) needs PostgreSQL"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"--redis", dead_redis};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const auto r = run_jobguard(args, std::chrono::seconds(30), c.env);
    std::string joined;
    for (const auto& a : c.args) joined += a + " ";
    EXPECT_EQ(r.status, 78) << joined << "\n" << r.out << r.err;
    EXPECT_EQ(r.err.rfind(c.says, 0), 0u) << joined << "\n" << r.err;
    EXPECT_NE(r.err.find("built without it (JOBGUARD_WITH_POSTGRES=OFF)\n"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
    EXPECT_EQ((r.out + r.err).find("pg-s3cret"), std::string::npos) << r.out << r.err;
  }
}

TEST(CliMainWithoutPostgres, HelpSaysWhatIsRefusedAndWithWhichStatus) {
  auto r = run_jobguard({"--help"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("This build has no PostgreSQL: a command that would use it exits 78"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("(not in this Redis-only build: exit 78)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("or PostgreSQL asked\nof a Redis-only build"), std::string::npos) << r.out;
}
#endif

}  // namespace
}  // namespace jobguard::test
