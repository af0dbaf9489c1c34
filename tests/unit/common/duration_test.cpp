#include <gtest/gtest.h>

#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"

using namespace std::chrono_literals;
using jobguard::parse_duration;

TEST(Duration, ParsesEveryUnit) {
  EXPECT_EQ(parse_duration("250ms"), 250ms);
  EXPECT_EQ(parse_duration("30s"), 30s);
  EXPECT_EQ(parse_duration("5m"), 5min);
  EXPECT_EQ(parse_duration("2h"), 2h);
  EXPECT_EQ(parse_duration("1500us"), 1500us);
  EXPECT_EQ(parse_duration("1m30s"), 90s);
  EXPECT_EQ(parse_duration("0s"), 0s);
}

TEST(Duration, RejectsMalformedTextNamingTheOption) {
  for (const char* bad : {"", "3", "3x", "ms", "-1s", "1.5s", "s3", "99999999999999999999s"}) {
    try {
      parse_duration(bad, "--ttl");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const jobguard::Error& e) {
      EXPECT_EQ(e.code(), jobguard::errc::invalid_argument) << bad;
      EXPECT_NE(std::string(e.what()).find("--ttl"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
    }
  }
}

TEST(Duration, FormatsForHumans) {
  EXPECT_EQ(jobguard::format_duration(30s), "30s");
  EXPECT_EQ(jobguard::format_duration(250ms), "250ms");
  EXPECT_EQ(jobguard::format_duration(1500ms), "1.5s");
  EXPECT_EQ(jobguard::format_duration(40us), "40us");
}
