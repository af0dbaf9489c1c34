#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "jobguard/observe/exposition.hpp"
#include "jobguard/observe/json.hpp"
#include "jobguard/observe/metrics.hpp"

using namespace jobguard::observe;
using namespace std::chrono_literals;

namespace {

void fill_billing(Registry& r) {
  auto& m = r.lock_class("billing");
  m.acquisitions_total.inc(3);
  m.busy_total.inc();
  m.wait_seconds.observe(200us);
  m.hold_seconds.observe(3ms);
  m.hold_seconds.observe(3ms);
  m.hold_seconds.observe(2s);
  m.renewals_total.inc(4);
  m.leases_lost_total.inc();
  m.stale_writes_rejected_total.inc(2);
  m.releases_total.inc(2);
  m.released_not_owner_total.inc();
  m.rate_limited_total.inc(3);
  m.rate_limit_wait_ms_total.inc(1250);
  m.concurrency_limited_total.inc(2);
  m.concurrency_limit_wait_ms_total.inc(40);
}

}  // namespace

TEST(Prometheus, ExactTextForOneClass) {
  Registry r;
  fill_billing(r);
  const std::string expected =
    "# HELP jobguard_build_info jobguard build; the value is always 1.\n"
    "# TYPE jobguard_build_info gauge\n"
    "jobguard_build_info{version=\"" JOBGUARD_TEST_VERSION "\"} 1\n"
    "# HELP jobguard_lock_acquisitions_total Locks granted.\n"
    "# TYPE jobguard_lock_acquisitions_total counter\n"
    "jobguard_lock_acquisitions_total{lock_class=\"billing\"} 3\n"
    "# HELP jobguard_lock_busy_total Acquire attempts answered busy because another owner held the lock (contention).\n"
    "# TYPE jobguard_lock_busy_total counter\n"
    "jobguard_lock_busy_total{lock_class=\"billing\"} 1\n"
    "# HELP jobguard_lock_renewals_total Successful lease renewals.\n"
    "# TYPE jobguard_lock_renewals_total counter\n"
    "jobguard_lock_renewals_total{lock_class=\"billing\"} 4\n"
    "# HELP jobguard_lock_renewal_failures_total Lease renewals that failed (Redis error or token gone).\n"
    "# TYPE jobguard_lock_renewal_failures_total counter\n"
    "jobguard_lock_renewal_failures_total{lock_class=\"billing\"} 0\n"
    "# HELP jobguard_lock_leases_lost_total Leases that expired or were taken by another owner while held.\n"
    "# TYPE jobguard_lock_leases_lost_total counter\n"
    "jobguard_lock_leases_lost_total{lock_class=\"billing\"} 1\n"
    "# HELP jobguard_lock_fail_open_total Jobs run without the lock because Redis was unavailable (fail-open policy).\n"
    "# TYPE jobguard_lock_fail_open_total counter\n"
    "jobguard_lock_fail_open_total{lock_class=\"billing\"} 0\n"
    "# HELP jobguard_lock_stale_writes_rejected_total Downstream writes rejected because their fencing token was stale.\n"
    "# TYPE jobguard_lock_stale_writes_rejected_total counter\n"
    "jobguard_lock_stale_writes_rejected_total{lock_class=\"billing\"} 2\n"
    "# HELP jobguard_lock_redis_errors_total Redis errors met while acquiring, renewing or releasing.\n"
    "# TYPE jobguard_lock_redis_errors_total counter\n"
    "jobguard_lock_redis_errors_total{lock_class=\"billing\"} 0\n"
    "# HELP jobguard_lock_releases_total Locks released by their owner.\n"
    "# TYPE jobguard_lock_releases_total counter\n"
    "jobguard_lock_releases_total{lock_class=\"billing\"} 2\n"
    "# HELP jobguard_lock_released_not_owner_total Releases that found the lock gone or held by another owner (the lease had been lost).\n"
    "# TYPE jobguard_lock_released_not_owner_total counter\n"
    "jobguard_lock_released_not_owner_total{lock_class=\"billing\"} 1\n"
    "# HELP jobguard_job_rate_limited_total Jobs a stream worker held back for a rate limit before their run.\n"
    "# TYPE jobguard_job_rate_limited_total counter\n"
    "jobguard_job_rate_limited_total{lock_class=\"billing\"} 3\n"
    "# HELP jobguard_job_rate_limit_wait_seconds_total Time those jobs waited for their turn, in all.\n"
    "# TYPE jobguard_job_rate_limit_wait_seconds_total counter\n"
    "jobguard_job_rate_limit_wait_seconds_total{lock_class=\"billing\"} 1.25\n"
    "# HELP jobguard_job_concurrency_limited_total Jobs a stream worker held back for a per-key concurrency permit before their run.\n"
    "# TYPE jobguard_job_concurrency_limited_total counter\n"
    "jobguard_job_concurrency_limited_total{lock_class=\"billing\"} 2\n"
    "# HELP jobguard_job_concurrency_limit_wait_seconds_total Time those jobs waited for a permit, in all.\n"
    "# TYPE jobguard_job_concurrency_limit_wait_seconds_total counter\n"
    "jobguard_job_concurrency_limit_wait_seconds_total{lock_class=\"billing\"} 0.04\n"
    "# HELP jobguard_lock_wait_seconds Time from the first acquire attempt until the lock was granted or the caller gave up.\n"
    "# TYPE jobguard_lock_wait_seconds histogram\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"0.0001\"} 0\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"0.00025\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"0.0005\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"0.001\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"0.0025\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"0.005\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"0.01\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"0.025\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"0.05\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"0.1\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"0.25\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"0.5\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"1\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"2.5\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"5\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"10\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"30\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"60\"} 1\n"
    "jobguard_lock_wait_seconds_bucket{lock_class=\"billing\",le=\"+Inf\"} 1\n"
    "jobguard_lock_wait_seconds_sum{lock_class=\"billing\"} 0.0002\n"
    "jobguard_lock_wait_seconds_count{lock_class=\"billing\"} 1\n"
    "# HELP jobguard_lock_hold_seconds Time a lock was held, from grant to release or loss.\n"
    "# TYPE jobguard_lock_hold_seconds histogram\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"0.0001\"} 0\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"0.00025\"} 0\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"0.0005\"} 0\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"0.001\"} 0\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"0.0025\"} 0\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"0.005\"} 2\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"0.01\"} 2\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"0.025\"} 2\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"0.05\"} 2\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"0.1\"} 2\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"0.25\"} 2\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"0.5\"} 2\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"1\"} 2\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"2.5\"} 3\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"5\"} 3\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"10\"} 3\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"30\"} 3\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"60\"} 3\n"
    "jobguard_lock_hold_seconds_bucket{lock_class=\"billing\",le=\"+Inf\"} 3\n"
    "jobguard_lock_hold_seconds_sum{lock_class=\"billing\"} 2.006\n"
    "jobguard_lock_hold_seconds_count{lock_class=\"billing\"} 3\n";
  EXPECT_EQ(to_prometheus(r), expected);
}

TEST(Prometheus, EmptyRegistryStillDeclaresEveryFamily) {
  Registry r;
  const std::string text = to_prometheus(r);
  EXPECT_NE(text.find("# TYPE jobguard_lock_hold_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE jobguard_lock_acquisitions_total counter\n"), std::string::npos);
  EXPECT_EQ(text.find("lock_class="), std::string::npos);
}

TEST(Prometheus, LabelValuesAreEscaped) {
  EXPECT_EQ(escape_label_value("plain"), "plain");
  EXPECT_EQ(escape_label_value("a\"b"), "a\\\"b");
  EXPECT_EQ(escape_label_value("a\\b"), "a\\\\b");
  EXPECT_EQ(escape_label_value("a\nb"), "a\\nb");
  EXPECT_EQ(escape_help("a\\b\n\"c\""), "a\\\\b\\n\"c\"");

  Registry r;
  r.lock_class("we\"ird\nclass\\x").acquisitions_total.inc();
  const std::string text = to_prometheus(r);
  EXPECT_NE(text.find("jobguard_lock_acquisitions_total{lock_class=\"we\\\"ird\\nclass\\\\x\"} 1\n"),
            std::string::npos)
      << text;
  // No raw newline from the class name may split a sample line.
  EXPECT_EQ(text.find("ird\nclass"), std::string::npos);
}

TEST(Prometheus, FamiliesStayContiguousAcrossClasses) {
  Registry r;
  r.lock_class("b").acquisitions_total.inc(2);
  r.lock_class("a").acquisitions_total.inc(1);
  const std::string text = to_prometheus(r);
  const std::string both =
      "# TYPE jobguard_lock_acquisitions_total counter\n"
      "jobguard_lock_acquisitions_total{lock_class=\"a\"} 1\n"
      "jobguard_lock_acquisitions_total{lock_class=\"b\"} 2\n"
      "# HELP jobguard_lock_busy_total";
  EXPECT_NE(text.find(both), std::string::npos) << text;
}

TEST(Prometheus, ValuesFormatAsTheTextFormatWants) {
  EXPECT_EQ(format_value(0.0001), "0.0001");
  EXPECT_EQ(format_value(1.0), "1");
  EXPECT_EQ(format_value(2.006), "2.006");
  EXPECT_EQ(format_value(1.0 / 0.0), "+Inf");
  EXPECT_EQ(format_value(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(format_value(0.0 / 0.0), "NaN");
}

TEST(MetricsJson, CarriesTheSameNumbers) {
  Registry r;
  fill_billing(r);
  const nlohmann::json j = to_json(r);
  const auto& b = j.at("lock_classes").at("billing");
  EXPECT_EQ(b.at("acquisitions_total"), 3);
  EXPECT_EQ(b.at("busy_total"), 1);
  EXPECT_EQ(b.at("renewals_total"), 4);
  EXPECT_EQ(b.at("leases_lost_total"), 1);
  EXPECT_EQ(b.at("stale_writes_rejected_total"), 2);
  EXPECT_EQ(b.at("released_not_owner_total"), 1);
  EXPECT_EQ(b.at("rate_limited_total"), 3);
  EXPECT_DOUBLE_EQ(b.at("rate_limit_wait_seconds_total").get<double>(), 1.25);
  EXPECT_EQ(b.at("concurrency_limited_total"), 2);
  EXPECT_DOUBLE_EQ(b.at("concurrency_limit_wait_seconds_total").get<double>(), 0.04);
  const auto& hold = b.at("hold_seconds");
  EXPECT_EQ(hold.at("count"), 3);
  EXPECT_NEAR(hold.at("sum_seconds").get<double>(), 2.006, 1e-12);
  EXPECT_NEAR(hold.at("p99_seconds").get<double>(), *r.snapshot("billing")->hold_seconds.quantile(0.99), 1e-12);
  ASSERT_EQ(hold.at("buckets").size(), kSecondsBuckets.size() + 1);
  EXPECT_EQ(hold.at("buckets").back().at("le"), "+Inf");
  EXPECT_EQ(hold.at("buckets").back().at("count"), 3);
  EXPECT_EQ(hold.at("buckets")[5].at("le").get<double>(), 0.005);
  EXPECT_EQ(hold.at("buckets")[5].at("count"), 2);
}

TEST(MetricsJson, EmptyHistogramHasNullQuantiles) {
  Registry r;
  r.lock_class("idle");
  const nlohmann::json j = to_json(r);
  EXPECT_TRUE(j.at("lock_classes").at("idle").at("wait_seconds").at("p99_seconds").is_null());
}
