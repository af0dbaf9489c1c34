#include "support/cli_fixture.hpp"

#include <fmt/format.h>
#include <stdlib.h>

#include <filesystem>
#include <system_error>

namespace jobguard::test {

void CliTest::SetUp() {
  RedisTest::SetUp();
  char tmpl[] = "/tmp/jobguard-cli-test.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  dir_ = tmpl;
}

void CliTest::TearDown() {
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  RedisTest::TearDown();
}

std::string CliTest::url() const { return fmt::format("redis://{}:{}/0", server->host(), server->port()); }

std::string CliTest::file(const std::string& name) const { return dir_ + "/" + name; }

}  // namespace jobguard::test
