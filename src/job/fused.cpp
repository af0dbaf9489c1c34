#include "job/fused.hpp"

#include <string>
#include <string_view>

#include "guard/scripts.hpp"
#include "lock/composed.hpp"

namespace jobguard::job {
namespace job_scripts {
extern const std::string_view claim;
extern const std::string_view finish;
}  // namespace job_scripts

namespace detail {
using ::jobguard::detail::as_lua_function;

const redis::Script& claim_script() {
  static const redis::Script s{::jobguard::detail::acquire_as_function() +
                               as_lua_function("idem_begin", guard::scripts::idempotency_begin) +
                               std::string(job_scripts::claim)};
  return s;
}

const redis::Script& finish_script() {
  static const redis::Script s{as_lua_function("idem_complete", guard::scripts::idempotency_complete) +
                               as_lua_function("record", guard::scripts::completion_record) +
                               ::jobguard::detail::release_as_function() + std::string(job_scripts::finish)};
  return s;
}
}  // namespace detail
}  // namespace jobguard::job
