// parse_rate and rate_key: the spellings a user types for --rate, and the
// one-line refusals.
#include <gtest/gtest.h>

#include "jobguard/error.hpp"
#include "jobguard/job/limits.hpp"
#include "jobguard/job/unique.hpp"
#include "jobguard/lock.hpp"

using namespace std::chrono_literals;
using namespace jobguard;

TEST(ParseRate, PerFieldAndPerClassWithNamedAndWrittenPeriods) {
  auto r = job::parse_rate("customer=100/min");
  EXPECT_EQ(r.field, "customer");
  EXPECT_EQ(r.count, 100);
  EXPECT_EQ(r.per, 60s);
  EXPECT_EQ(r.interval(), 600ms);
  r = job::parse_rate("5/s");
  EXPECT_TRUE(r.field.empty());
  EXPECT_EQ(r.interval(), 200ms);
  EXPECT_EQ(job::parse_rate("3/sec").per, 1s);
  EXPECT_EQ(job::parse_rate("3600/h").interval(), 1s);
  EXPECT_EQ(job::parse_rate("x=2/1m30s").per, 90s);
  EXPECT_EQ(job::parse_rate("3/1s").interval().count(), 333333) << "microseconds, rounded down";
}

TEST(ParseRate, BadRatesAreRefusedNamingWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"0/s", "the count must be at least 1"},     {"-1/s", "the count must be at least 1"},
      {"ten/s", "not a whole number"},             {"5", "expected [FIELD=]N/PERIOD"},
      {"a=5", "expected [FIELD=]N/PERIOD"},        {"=5/s", "empty field name"},
      {"5/0s", "the period must be more than 0"},  {"5/fortnight", "invalid duration \"fortnight\""},
      {"2000000/s", "more than one job per microsecond"}, {"/s", "not a whole number"},
  };
  for (const auto& [text, words] : cases) {
    try {
      job::parse_rate(text);
      ADD_FAILURE() << text << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::invalid_argument)) << text;
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << text << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << "names the rate: " << e.what();
    }
  }
}

TEST(RateKey, OneBudgetPerFieldValueOrPerClass) {
  EXPECT_EQ(job::rate_key(job::parse_rate("customer=1/s"), "charge", "42"), "jobguard:rate:customer=42");
  EXPECT_EQ(job::rate_key(job::parse_rate("1/s"), "charge", ""), "jobguard:rate:charge");
}

TEST(UniqueNames, RoundTrip) {
  for (auto s : {job::UniqueStrategy::until_executed, job::UniqueStrategy::until_and_while_executing,
                 job::UniqueStrategy::until_expired, job::UniqueStrategy::while_executing})
    EXPECT_EQ(job::parse_unique_strategy(job::to_string(s)), s);
  for (auto c : {job::UniqueConflict::reject, job::UniqueConflict::replace, job::UniqueConflict::log})
    EXPECT_EQ(job::parse_unique_conflict(job::to_string(c)), c);
  EXPECT_FALSE(job::parse_unique_conflict("ignore").has_value());
}

TEST(ParseConcurrency, FieldAndCount) {
  const auto c = job::parse_concurrency("customer=2");
  EXPECT_EQ(c.field, "customer");
  EXPECT_EQ(c.count, 2);
  EXPECT_EQ(job::parse_concurrency("tenant=10000").count, 10000);
}

TEST(ParseConcurrency, BadLimitsAreRefusedNamingWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"customer=0", "the count must be in [1, 10000]"}, {"customer=-1", "the count must be in [1, 10000]"},
      {"customer=10001", "the count must be in [1, 10000]"}, {"customer", "expected FIELD=N"},
      {"=2", "empty field name"},                        {"customer=two", "not a whole number"},
      {"customer=", "not a whole number"},               {"cu stomer=2", "the field name has a brace, a space"},
      {"customer=99999999999999999999", "not a whole number"},
  };
  for (const auto& [text, words] : cases) {
    try {
      job::parse_concurrency(text);
      ADD_FAILURE() << text << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::invalid_argument)) << text;
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << text << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << "names the limit: " << e.what();
    }
  }
}

TEST(ConcurrencyResource, OnePerFieldValueEscapedToBeALockResource) {
  const auto c = job::parse_concurrency("customer=2");
  EXPECT_EQ(job::concurrency_resource(c, "42"), "concurrency:customer=42");
  // Braces would break the hash tag, spaces a log line; '%' is escaped too,
  // so "a b" and a literal "a%20b" stay two resources.
  EXPECT_EQ(job::concurrency_resource(c, "a b{x}"), "concurrency:customer=a%20b%7Bx%7D");
  EXPECT_EQ(job::concurrency_resource(c, "a%20b"), "concurrency:customer=a%2520b");
  const auto long_one = job::concurrency_resource(c, std::string(600, 'x'));
  EXPECT_EQ(long_one.size(), 512u);
  EXPECT_NO_THROW(KeyBuilder().lock_key(long_one));
  EXPECT_NO_THROW(KeyBuilder().lock_key(job::concurrency_resource(c, std::string(300, ' '))));
}
