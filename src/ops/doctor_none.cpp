// The doctor's PostgreSQL checks in a Redis-only build
// (JOBGUARD_WITH_POSTGRES=OFF): one failed check that says why.
#include "jobguard/ops/doctor.hpp"

namespace jobguard::ops {

std::vector<CheckResult> check_postgres(const std::string&, const DoctorOptions&) {
  return {{"pg_connection", CheckStatus::fail, "this jobguard was built without PostgreSQL (JOBGUARD_WITH_POSTGRES=OFF)",
           "build it with libpqxx to check PostgreSQL"}};
}

}  // namespace jobguard::ops
