// The dispatcher itself (apps/jobguard/main.cpp): the command table and
// --version, by running the real binary. No server needed.
#include <gtest/gtest.h>

#include <boost/version.hpp>
#include <string>

#include "jobguard/version.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

TEST(CliMain, VersionNamesJobguardTheClientLibrariesAndTheBuildType) {
  auto r = run_jobguard({"--version"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind(std::string("jobguard ") + jobguard::version_string + " (", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(" build)"), std::string::npos) << r.out;
  for (const char* lib : {"\nhiredis 0.", "\nlibpqxx ", "\nlibpq ", "\nOpenSSL ", "\nBoost 1."})
    EXPECT_NE(r.out.find(lib), std::string::npos) << "missing " << lib << " in:\n" << r.out;
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

}  // namespace
}  // namespace jobguard::test
