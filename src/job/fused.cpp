#include "job/fused.hpp"

#include <fmt/format.h>

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
namespace {
std::string as_function(std::string_view name, std::string_view body) {
  return fmt::format("local function {}(KEYS, ARGV)\n{}\nend\n", name, body);
}
}  // namespace

const redis::Script& claim_script() {
  static const redis::Script s{::jobguard::detail::acquire_as_function() +
                               as_function("idem_begin", guard::scripts::idempotency_begin) +
                               std::string(job_scripts::claim)};
  return s;
}

const redis::Script& finish_script() {
  static const redis::Script s{as_function("idem_complete", guard::scripts::idempotency_complete) +
                               as_function("record", guard::scripts::completion_record) +
                               ::jobguard::detail::release_as_function() + std::string(job_scripts::finish)};
  return s;
}
}  // namespace detail
}  // namespace jobguard::job
