#include <gtest/gtest.h>

#include "jobguard/error.hpp"

using jobguard::errc;
using jobguard::next_step;

TEST(Error, SortsCodesByWhatTheCallerDoesNext) {
  EXPECT_EQ(jobguard::next_step_for({}), next_step::none);
  EXPECT_EQ(jobguard::next_step_for(errc::timeout), next_step::retry_call);
  EXPECT_EQ(jobguard::next_step_for(errc::connection_lost), next_step::retry_call);
  EXPECT_EQ(jobguard::next_step_for(errc::lease_lost), next_step::restart_attempt);
  EXPECT_EQ(jobguard::next_step_for(errc::stale_fence), next_step::restart_attempt);
  EXPECT_EQ(jobguard::next_step_for(errc::invalid_url), next_step::stop);
  EXPECT_EQ(jobguard::next_step_for(errc::auth_failed), next_step::stop);
  EXPECT_EQ(jobguard::next_step_for(errc::in_doubt), next_step::check_record);
}

TEST(Error, MessageCarriesCategoryTextAndDetail) {
  jobguard::Error e(errc::invalid_url, "port \"x\" is not a number");
  EXPECT_STREQ(e.what(), "invalid URL: port \"x\" is not a number");
  EXPECT_EQ(e.next(), next_step::stop);
}
