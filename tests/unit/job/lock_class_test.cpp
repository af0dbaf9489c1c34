#include "jobguard/job/lock_class.hpp"

#include <gtest/gtest.h>

#include "jobguard/error.hpp"

using namespace std::chrono_literals;
using namespace jobguard;
using job::Consequence;
using job::LockClass;
using job::RedisDownPolicy;

namespace {

LockClass valid() {
  return LockClass{.name = "invoice-charge",
                   .key_pattern = "invoice:{id}",
                   .consequence = Consequence::moderate,
                   .ttl = 30s,
                   .owner = "billing",
                   .protects = "one card charge per invoice"};
}

std::string refusal(const LockClass& c) {
  try {
    c.validate();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::invalid_argument));
    return e.what();
  }
  return "";
}

}  // namespace

TEST(LockClass, ResourceFillsTheIdIntoThePattern) {
  auto c = valid();
  EXPECT_EQ(c.resource_for("48291"), "invoice:48291");
  c.key_pattern = "tenant:{id}:sync";
  EXPECT_EQ(c.resource_for("alpha"), "tenant:alpha:sync");
  c.key_pattern = "nightly-report";
  EXPECT_EQ(c.resource_for("ignored"), "nightly-report");
}

TEST(LockClass, DefaultsAreFailClosedAndAFifthOfTheTtl) {
  LockClass c;
  EXPECT_EQ(c.on_redis_down, RedisDownPolicy::fail_closed);
  c.ttl = 10s;
  EXPECT_EQ(c.effective_min_time_left(), 2s);
  c.min_time_left = 500ms;
  EXPECT_EQ(c.effective_min_time_left(), 500ms);
}

TEST(LockClass, ValidDeclarationPasses) {
  EXPECT_EQ(refusal(valid()), "");
  auto lr = valid();
  lr.long_running = true;
  lr.hard_timeout = 10min;
  EXPECT_EQ(refusal(lr), "");
}

TEST(LockClass, EachBrokenFieldIsNamed) {
  auto c = valid();
  c.name = "";
  EXPECT_NE(refusal(c).find("empty name"), std::string::npos);
  c = valid();
  c.name = "per key 42";
  EXPECT_NE(refusal(c).find("name has ' '"), std::string::npos);
  c = valid();
  c.key_pattern = "a:{id}:{id}";
  EXPECT_NE(refusal(c).find("more than once"), std::string::npos);
  c = valid();
  c.key_pattern = "bad key {id}";
  EXPECT_NE(refusal(c).find("key_pattern \"bad key {id}\""), std::string::npos);
  c = valid();
  c.ttl = 5ms;
  EXPECT_NE(refusal(c).find("ttl 5 ms"), std::string::npos);
  c = valid();
  c.min_time_left = 30s;
  EXPECT_NE(refusal(c).find("min_time_left 30000 ms is not below the ttl"), std::string::npos);
  c = valid();
  c.owner = "";
  EXPECT_NE(refusal(c).find("no owner"), std::string::npos);
  c = valid();
  c.protects = "";
  EXPECT_NE(refusal(c).find("protects"), std::string::npos);
  EXPECT_NE(refusal(c).find("lock class 'invoice-charge': "), std::string::npos);
}

TEST(LockClass, DecisionMatrixLongRunningRow) {
  auto c = valid();
  c.long_running = true;
  EXPECT_NE(refusal(c).find("long_running needs a hard_timeout"), std::string::npos);
  c = valid();
  c.hard_timeout = 1min;
  EXPECT_NE(refusal(c).find("hard_timeout is set but long_running is not"), std::string::npos);
}

TEST(LockClass, ParsersAcceptTheDocumentedSpellingsOnly) {
  EXPECT_EQ(job::parse_consequence("high"), Consequence::high);
  EXPECT_EQ(job::parse_consequence("low"), Consequence::low);
  EXPECT_FALSE(job::parse_consequence("High"));
  EXPECT_EQ(job::parse_redis_down_policy("fail-open"), RedisDownPolicy::fail_open);
  EXPECT_EQ(job::parse_redis_down_policy("fail_closed"), RedisDownPolicy::fail_closed);
  EXPECT_FALSE(job::parse_redis_down_policy("open"));
  EXPECT_STREQ(job::to_string(RedisDownPolicy::fail_open), "fail-open");
  EXPECT_STREQ(job::to_string(Consequence::moderate), "moderate");
}
