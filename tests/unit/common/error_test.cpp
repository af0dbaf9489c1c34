#include <gtest/gtest.h>

#include <cerrno>
#include <ios>

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
  EXPECT_EQ(jobguard::next_step_for(errc::permission_denied), next_step::stop);
  EXPECT_EQ(jobguard::next_step_for(errc::in_doubt), next_step::check_record);
}

TEST(Error, MessageCarriesCategoryTextAndDetail) {
  jobguard::Error e(errc::invalid_url, "port \"x\" is not a number");
  EXPECT_STREQ(e.what(), "invalid URL: port \"x\" is not a number");
  EXPECT_EQ(e.next(), next_step::stop);
}

TEST(Error, PermissionDeniedIsNotAnAuthenticationFailure) {
  const jobguard::Error e(errc::permission_denied, "EVALSHA on jobguard:lock:{k}: NOPERM no permissions");
  EXPECT_STREQ(e.what(), "permission denied: EVALSHA on jobguard:lock:{k}: NOPERM no permissions");
  EXPECT_NE(jobguard::make_error_code(errc::permission_denied), jobguard::make_error_code(errc::auth_failed));
}

TEST(Error, ForeignCodesAreMappedExplicitlyNotRetriedByDefault) {
  EXPECT_EQ(jobguard::next_step_for(std::make_error_code(std::errc::connection_refused)), next_step::retry_call);
  EXPECT_EQ(jobguard::next_step_for(std::error_code(ECONNRESET, std::system_category())), next_step::retry_call);
  EXPECT_EQ(jobguard::next_step_for(std::make_error_code(std::errc::permission_denied)), next_step::stop);
  EXPECT_EQ(jobguard::next_step_for(std::make_error_code(std::errc::no_such_file_or_directory)), next_step::stop);
  EXPECT_EQ(jobguard::next_step_for(std::make_error_code(std::io_errc::stream)), next_step::stop);
}

TEST(Error, DefaultConstructedIsNoErrorAndHoldsNoText) {
  const jobguard::Error ok;
  EXPECT_FALSE(ok);
  EXPECT_EQ(ok.next(), next_step::none);
  EXPECT_EQ(ok.source(), jobguard::error_source::none);
  EXPECT_STREQ(ok.what(), "ok");
  EXPECT_TRUE(ok.detail().empty());
  EXPECT_FALSE(ok.with_context("k"));
}

TEST(Error, KeepsSourceAndDetailThroughAddedContext) {
  const jobguard::Error e(errc::server_busy, "127.0.0.1:6379: OOM command not allowed", jobguard::error_source::redis);
  EXPECT_TRUE(e);
  EXPECT_EQ(e.detail(), "127.0.0.1:6379: OOM command not allowed");
  const jobguard::Error c = e.with_context("release of jobguard:lock:{k}");
  EXPECT_EQ(c.code(), e.code());
  EXPECT_EQ(c.source(), jobguard::error_source::redis);
  EXPECT_STREQ(c.what(), "server busy: release of jobguard:lock:{k}: 127.0.0.1:6379: OOM command not allowed");
  // Copies share the text: throwing and catching keeps it.
  try {
    throw c;
  } catch (const jobguard::Error& caught) {
    EXPECT_STREQ(caught.what(), c.what());
  }
}
