// The high row without PostgreSQL (a build with JOBGUARD_WITH_POSTGRES=OFF):
// a high class is refused when its runner is made, not at its first job.
#include "job/claim_path.hpp"
#include "jobguard/error.hpp"
#include "jobguard/job/runner.hpp"

namespace jobguard::job {

std::unique_ptr<DurableSteps> make_pg_steps(const RunnerBackends&) {
  throw Error(errc::invalid_argument,
              "consequence high needs PostgreSQL, and this jobguard was built without it (JOBGUARD_WITH_POSTGRES=OFF)");
}

}  // namespace jobguard::job
