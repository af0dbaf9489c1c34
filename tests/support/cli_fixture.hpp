// Fixture for tests that run the real jobguard binary against this test's
// redis-server, with a private temporary directory for the files the
// commands under test write (the ground truth of what ran).
#pragma once

#include <string>

#include "support/redis_fixture.hpp"

namespace jobguard::test {

class CliTest : public RedisTest {
 protected:
  void SetUp() override;
  void TearDown() override;

  // redis://HOST:PORT/0 of this test's server.
  std::string url() const;
  // A path inside this test's temporary directory (removed after the test).
  std::string file(const std::string& name) const;

 private:
  std::string dir_;
};

}  // namespace jobguard::test
