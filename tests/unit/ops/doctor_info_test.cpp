// The doctor's reading of INFO fields (ops/doctor_internal.hpp), pure.
#include <gtest/gtest.h>

#include "ops/doctor_internal.hpp"

namespace jobguard::ops::checks {
namespace {

TEST(DoctorInfo, AReplicaLagIsItsSecondsAndMinusOneIsAnAcknowledgementNow) {
  EXPECT_EQ(replica_lag("0"), 0);
  EXPECT_EQ(replica_lag("7"), 7);
  // Redis's time(NULL) can read a second behind the ACK's cached time.
  EXPECT_EQ(replica_lag("-1"), 0);
}

TEST(DoctorInfo, AReplicaLagThatIsNoNumberIsUnknown) {
  EXPECT_EQ(replica_lag(""), -1);
  EXPECT_EQ(replica_lag("soon"), -1);
}

}  // namespace
}  // namespace jobguard::ops::checks
