// The refusal a quarantined grant carries: the way forward (`jobguard server
// trust`) is named only when every reason is a missing record, the one case a
// server just provisioned shows; a restart or an eviction gets no such hint.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "lock/quarantine.hpp"

namespace jobguard::detail {
namespace {

using namespace std::chrono_literals;

const std::string kMissing =
    "no lock-state record: restarted without persistence, flushed, record evicted, or new to jobguard";

TEST(QuarantineMessage, AMissingRecordNamesTheTrustCommandAndTheWait) {
  const auto m = quarantine_message(kMissing, 59001ms, "redis://127.0.0.1:6379/0");
  EXPECT_EQ(m,
            "server lost lock state (" + kMissing +
                "); grants refused for 59001 ms more: if the server was just provisioned (not restarted), "
                "`jobguard server trust --redis redis://127.0.0.1:6379/0` ends this now, else wait 60 s");
  EXPECT_EQ(m.find('\n'), std::string::npos);
}

TEST(QuarantineMessage, EveryShardMissingItsRecordStillGetsTheHint) {
  const std::string reason = "127.0.0.1:7001: " + kMissing + "; 127.0.0.1:7002: " + kMissing;
  EXPECT_TRUE(only_missing_records(reason));
  EXPECT_NE(quarantine_message(reason, 1000ms, "u").find("server trust --redis u"), std::string::npos);
}

TEST(QuarantineMessage, ARestartOrAnEvictionGetsNoHint) {
  const std::string restart =
      "a different server process (run_id 01234567 -> 89abcdef): restarted or failed over, recent writes may be lost";
  EXPECT_FALSE(only_missing_records(restart));
  EXPECT_FALSE(only_missing_records("127.0.0.1:7001: " + kMissing + "; 127.0.0.1:7002: " + restart));
  EXPECT_FALSE(only_missing_records("keys evicted (evicted_keys 0 -> 3, maxmemory-policy allkeys-lru)"));
  EXPECT_FALSE(only_missing_records(""));
  EXPECT_EQ(quarantine_message(restart, 5000ms, "u"),
            "server lost lock state (" + restart + "); grants refused for 5000 ms more");
  // Without a URL (callers that have none) the message is the plain one.
  EXPECT_EQ(quarantine_message(kMissing, 5000ms), "server lost lock state (" + kMissing + "); grants refused for 5000 ms more");
}

}  // namespace
}  // namespace jobguard::detail
