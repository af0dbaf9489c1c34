#include "exit_status.hpp"

#include <fmt/format.h>

namespace jobguard::cli {

int exit_status_for(std::error_code ec) noexcept {
  if (!ec) return exit_code::ok;
  if (ec.category() == jobguard_category()) {
    for (const auto& row : kExitTable)
      if (static_cast<int>(row.code) == ec.value()) return row.status;
  }
  return next_step_for(ec) == next_step::retry_call ? exit_code::unavailable : exit_code::usage;
}

int exit_status_for(const Error& e) { return exit_status_for(e.code()); }

std::string exit_status_help(const std::string& own) {
  std::string s = own;
  if (!s.empty() && s.back() != '\n') s += '\n';
  s += fmt::format(
      "Any subcommand: {} usage (bad flag, malformed URL, key or duration; checked before\n"
      "connecting); {} Redis/PostgreSQL unavailable (fail-closed; try later); {} in doubt (a\n"
      "COMMIT whose result is unknown: check the record); {} the server refused the request\n"
      "(WRONGTYPE, a script or protocol error, in its words); {} permission denied (NOPERM: the\n"
      "ACL user's rights); {} configuration (wrong password, TLS or certificate, or PostgreSQL asked\n"
      "of a Redis-only build: no retry fixes it).",
      exit_code::usage, exit_code::unavailable, exit_code::in_doubt, exit_code::server_error,
      exit_code::permission, exit_code::config);
  return s;
}

}  // namespace jobguard::cli
