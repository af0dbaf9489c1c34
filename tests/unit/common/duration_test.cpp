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

namespace {

std::string refusal(std::string_view text, bool ms = false) {
  try {
    if (ms) jobguard::parse_duration_ms(text, "--timeout");
    else jobguard::parse_duration(text, "--timeout");
  } catch (const jobguard::Error& e) {
    EXPECT_EQ(e.code(), jobguard::errc::invalid_argument) << text;
    return e.what();
  }
  return {};
}

}  // namespace

TEST(Duration, CompoundFormsAddUp) {
  EXPECT_EQ(parse_duration("48h30m"), 48h + 30min);
  EXPECT_EQ(parse_duration("1m30s"), 90s);
  EXPECT_EQ(parse_duration("1h2m3s4ms"), 1h + 2min + 3s + 4ms);
  EXPECT_EQ(parse_duration("1s500ms"), 1500ms);
  EXPECT_EQ(parse_duration("2ms250us"), 2250us);
}

TEST(Duration, AcceptsUpToThirtyDays) {
  EXPECT_EQ(parse_duration("720h"), jobguard::kMaxDuration);
  EXPECT_EQ(parse_duration("719h60m"), jobguard::kMaxDuration);
  EXPECT_EQ(parse_duration("2592000s"), jobguard::kMaxDuration);
}

// Unbounded, "--timeout 3000000h" would fire at once (the deadline wraps)
// and "--ttl 3000000h" set a 342-year key. Both are now refused up front.
TEST(Duration, HugeValuesAreRefusedNotWrapped) {
  for (const char* text : {"3000000h", "721h", "720h1us", "2592001s", "719h61m", "99999999999999999999s",
                           "9223372036854775807us", "9223372036854775807h", "1h999999999999999999ms"}) {
    const std::string why = refusal(text);
    EXPECT_NE(why.find("above the maximum of 720h"), std::string::npos) << text << ": " << why;
    EXPECT_NE(why.find("--timeout"), std::string::npos) << why;
    EXPECT_NE(why.find(text), std::string::npos) << "names the value: " << why;
  }
}

// Rounded, "500us" would become 0ms, which every option reads as "none".
TEST(Duration, MillisecondSettingsRefuseWhatWouldRoundAway) {
  EXPECT_EQ(jobguard::parse_duration_ms("250ms"), 250ms);
  EXPECT_EQ(jobguard::parse_duration_ms("2000us"), 2ms);
  EXPECT_EQ(jobguard::parse_duration_ms("0s"), 0ms);
  EXPECT_EQ(jobguard::parse_duration_ms("48h30m"), 48h + 30min);
  std::string why = refusal("500us", true);
  EXPECT_NE(why.find("round to nothing"), std::string::npos) << why;
  EXPECT_NE(why.find("\"500us\" for --timeout"), std::string::npos) << why;
  why = refusal("1500us", true);
  EXPECT_NE(why.find("sub-millisecond"), std::string::npos) << why;
  EXPECT_NE(refusal("3000000h", true).find("maximum"), std::string::npos);
}

TEST(Duration, ControlBytesInTheTextAreEscapedInTheMessage) {
  const std::string why = refusal("5\x1b[2Jx");
  EXPECT_EQ(why.find('\x1b'), std::string::npos) << why;
  EXPECT_NE(why.find("\\x1b"), std::string::npos) << why;
  EXPECT_EQ(refusal("5\ns").find('\n'), std::string::npos);
}
