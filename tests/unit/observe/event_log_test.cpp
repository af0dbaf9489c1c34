#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>

#include "jobguard/error.hpp"
#include "jobguard/observe/event_log.hpp"

using namespace jobguard::observe;
using namespace std::chrono_literals;

namespace {

// 2026-11-30T09:41:02.123Z
std::chrono::system_clock::time_point fixed_time() {
  return std::chrono::system_clock::time_point(std::chrono::seconds(1796031662)) + 123ms;
}

Event acquired() {
  return Event{.event = "acquired",
               .lock_key = "jobguard:lock:{invoice:1}",
               .job_id = "w1-42",
               .lock_class = "billing",
               .outcome = "ok",
               .elapsed_ms = 3.2,
               .extra = {}};
}

}  // namespace

TEST(EventLog, TimestampIsUtcWithMilliseconds) {
  EXPECT_EQ(format_timestamp(fixed_time()), "2026-11-30T09:41:02.123Z");
  EXPECT_EQ(format_timestamp(std::chrono::system_clock::time_point{}), "1970-01-01T00:00:00.000Z");
}

TEST(EventLog, HumanLineShape) {
  EXPECT_EQ(format_event(acquired(), LogFormat::human, fixed_time()),
            "2026-11-30T09:41:02.123Z acquired  key=jobguard:lock:{invoice:1} job=w1-42 class=billing outcome=ok "
            "elapsed=3.2ms");
}

TEST(EventLog, HumanLineOmitsEmptyFieldsAndQuotesAwkwardValues) {
  Event e{.event = "fail_open", .lock_class = "billing", .elapsed_ms = 1234.4};
  e.extra = {{"reason", std::string("redis down: connection refused")}, {"attempt", std::int64_t{3}},
             {"retry", true}, {"key", std::string("x")}};
  EXPECT_EQ(format_event(e, LogFormat::human, fixed_time()),
            "2026-11-30T09:41:02.123Z fail_open class=billing elapsed=1234ms "
            "reason=\"redis down: connection refused\" attempt=3 retry=true extra_key=x");
}

TEST(EventLog, HumanLineCannotBeSplitByAKeyWithANewline) {
  Event e{.event = "busy", .lock_key = "evil\n2026-01-01T00:00:00.000Z released key=x"};
  const std::string line = format_event(e, LogFormat::human, fixed_time());
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_NE(line.find("key=\"evil\\n2026"), std::string::npos) << line;
}

TEST(EventLog, JsonLineShape) {
  Event e = acquired();
  e.extra = {{"fence", std::int64_t{17}}, {"ratio", 0.5}, {"job_id", std::string("forged")}};
  const std::string line = format_event(e, LogFormat::json, fixed_time());
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(line,
            R"({"ts":"2026-11-30T09:41:02.123Z","event":"acquired","lock_key":"jobguard:lock:{invoice:1}",)"
            R"("job_id":"w1-42","lock_class":"billing","outcome":"ok","elapsed_ms":3.2,"fence":17,"ratio":0.5,)"
            R"("extra_job_id":"forged"})");
  const auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j.at("job_id"), "w1-42");
  EXPECT_EQ(j.at("fence"), 17);
}

TEST(EventLog, JsonLineOmitsEmptyFieldsAndSurvivesBadUtf8) {
  Event e{.event = "lost", .lock_key = "inv\xff:1"};
  const std::string line = format_event(e, LogFormat::json, fixed_time());
  const auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j.size(), 3u);  // ts, event, lock_key
  EXPECT_EQ(j.at("event"), "lost");
  EXPECT_FALSE(j.contains("elapsed_ms"));
  EXPECT_EQ(j.at("lock_key"), "inv\xEF\xBF\xBD:1");  // U+FFFD
}

TEST(EventLog, JsonElapsedNotFiniteIsNull) {
  Event e{.event = "released", .elapsed_ms = 1.0 / 0.0};
  const auto j = nlohmann::json::parse(format_event(e, LogFormat::json, fixed_time()));
  EXPECT_TRUE(j.at("elapsed_ms").is_null());
}

TEST(EventLog, WritesOneLinePerEventToTheStream) {
  std::ostringstream out;
  EventLog log(LogFormat::json, out);
  log.set_clock(fixed_time);
  log.emit(acquired());
  log.emit(Event{.event = "released", .lock_class = "billing", .outcome = "ok"});
  const std::string text = out.str();
  ASSERT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
  std::istringstream lines(text);
  std::string l1, l2;
  std::getline(lines, l1);
  std::getline(lines, l2);
  EXPECT_EQ(nlohmann::json::parse(l1).at("event"), "acquired");
  EXPECT_EQ(nlohmann::json::parse(l2).at("event"), "released");
}

TEST(EventLog, CallbackSinkGetsLinesWithoutNewline) {
  std::vector<std::string> got;
  EventLog log(LogFormat::human, [&](std::string_view l) { got.emplace_back(l); });
  log.set_clock(fixed_time);
  log.emit(Event{.event = "skipped", .job_id = "run-7", .outcome = "already_completed"});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], "2026-11-30T09:41:02.123Z skipped   job=run-7 outcome=already_completed");
}

TEST(EventLog, ParseLogFormatNamesTheBadValue) {
  EXPECT_EQ(parse_log_format("json"), LogFormat::json);
  EXPECT_EQ(parse_log_format("human"), LogFormat::human);
  try {
    parse_log_format("yaml");
    FAIL() << "expected an error";
  } catch (const jobguard::Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"yaml\""), std::string::npos);
    EXPECT_EQ(e.code(), jobguard::errc::invalid_argument);
  }
}
