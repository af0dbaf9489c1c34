// The fleet's Prometheus families as `jobguard serve` exports them (the
// accumulator behind them: tests/unit/observe/fleet_test.cpp). No server.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "jobguard/observe/metrics.hpp"
#include "jobguard/ops/fleet_exporter.hpp"

namespace jobguard::ops {
namespace {

using observe::FleetCounts;
using observe::Histogram;

TEST(FleetExposition, EveryFamilyHasHelpAndTypeAndClassLabels) {
  std::map<std::string, FleetCounts, std::less<>> totals;
  auto& c = totals["bill\"ing"];
  c.acquisitions = 3;
  c.leases_lost = 1;
  c.released_not_owner = 2;
  c.hold_buckets[Histogram::bucket_index(0.002)] = 3;
  c.hold_sum_ns = 6'000'000;
  c.rate_limited = 4;
  c.rate_limit_wait_ms = 2500;
  c.concurrency_limited = 5;
  c.concurrency_limit_wait_ms = 120;
  const std::string t = fleet_to_prometheus(totals, true);
  EXPECT_NE(t.find("# TYPE jobguard_fleet_lock_acquisitions_total counter\n"), std::string::npos) << t;
  EXPECT_NE(t.find("jobguard_fleet_lock_acquisitions_total{class=\"bill\\\"ing\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("jobguard_fleet_lock_expired_total{class=\"bill\\\"ing\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("# TYPE jobguard_fleet_lock_hold_seconds histogram\n"), std::string::npos) << t;
  EXPECT_NE(t.find("jobguard_fleet_lock_hold_seconds_bucket{class=\"bill\\\"ing\",le=\"0.0025\"} 3\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("jobguard_fleet_lock_hold_seconds_count{class=\"bill\\\"ing\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("jobguard_fleet_lock_hold_seconds_sum{class=\"bill\\\"ing\"} 0.006\n"), std::string::npos) << t;
  EXPECT_NE(t.find("# TYPE jobguard_fleet_job_rate_limited_total counter\n"), std::string::npos) << t;
  EXPECT_NE(t.find("jobguard_fleet_job_rate_limited_total{class=\"bill\\\"ing\"} 4\n"), std::string::npos) << t;
  EXPECT_NE(t.find("jobguard_fleet_job_rate_limit_wait_seconds_total{class=\"bill\\\"ing\"} 2.5\n"), std::string::npos)
      << t;
  EXPECT_NE(t.find("jobguard_fleet_job_concurrency_limited_total{class=\"bill\\\"ing\"} 5\n"), std::string::npos) << t;
  EXPECT_NE(t.find("jobguard_fleet_job_concurrency_limit_wait_seconds_total{class=\"bill\\\"ing\"} 0.12\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("jobguard_fleet_up 1\n"), std::string::npos);
  EXPECT_NE(fleet_to_prometheus({}, false).find("jobguard_fleet_up 0\n"), std::string::npos);
}

}  // namespace
}  // namespace jobguard::ops
