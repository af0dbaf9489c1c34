// The CLI's exit statuses: one table, keyed by the library's error codes, so
// every subcommand reports the same failure with the same status. The numbers
// follow sysexits(3) where one fits; 70 (lease lost), 75 (lock busy) and 124
// (hard timeout, as timeout(1)) are the contract `run` has always had.
//
// The rule behind the table is the error's next step (jobguard/error.hpp):
// "retry the call" is 69 (try later), "restart the attempt" is 70, "check the
// record" is 74 (in doubt). "Stop" is split by who has to fix it: the command
// line (64), the server's data or a script (76), the ACL user's rights (77),
// the configuration: password, certificate (78).
#pragma once

#include <array>
#include <string>
#include <system_error>

#include "jobguard/error.hpp"

namespace jobguard::cli {

namespace exit_code {
inline constexpr int ok = 0;
inline constexpr int usage = 64;        // EX_USAGE: bad flags, malformed URL/key/duration
inline constexpr int data = 65;         // EX_DATAERR: bad input file (policy lint)
inline constexpr int unavailable = 69;  // EX_UNAVAILABLE: Redis/PostgreSQL unavailable; try later
inline constexpr int lease_lost = 70;   // the lease was lost while CMD ran
inline constexpr int in_doubt = 74;     // EX_IOERR: the outcome is unknown (COMMIT in doubt)
inline constexpr int busy = 75;         // EX_TEMPFAIL: lock busy (try again later)
inline constexpr int server_error = 76; // EX_PROTOCOL: the server refused what was asked (WRONGTYPE, script)
inline constexpr int permission = 77;   // EX_NOPERM: the ACL user may not run this command or touch this key
inline constexpr int config = 78;       // EX_CONFIG: wrong password, TLS/certificate, PostgreSQL asked of a
                                        // Redis-only build: no retry can fix it
inline constexpr int timeout = 124;     // hard timeout (as timeout(1))
}  // namespace exit_code

struct ExitRow {
  errc code;
  int status;
};

// Every errc but ok, with its status. Adding an errc without a row here fails
// the CLI's table test (tests/cli/main), which walks every code.
inline constexpr std::array<ExitRow, 18> kExitTable{{
    {errc::not_connected, exit_code::unavailable},
    {errc::connection_lost, exit_code::unavailable},
    {errc::timeout, exit_code::unavailable},
    // OOM, READONLY, MASTERDOWN, LOADING, BUSY, TRYAGAIN, CLUSTERDOWN: the
    // server cannot serve us now, and says so in e.what().
    {errc::server_busy, exit_code::unavailable},
    {errc::redis_unavailable, exit_code::unavailable},
    {errc::postgres_unavailable, exit_code::unavailable},
    {errc::lease_lost, exit_code::lease_lost},
    {errc::stale_fence, exit_code::lease_lost},
    {errc::invalid_argument, exit_code::usage},
    {errc::invalid_url, exit_code::usage},
    {errc::auth_failed, exit_code::config},
    {errc::tls_error, exit_code::config},
    {errc::protocol_error, exit_code::server_error},
    {errc::server_error, exit_code::server_error},
    {errc::script_error, exit_code::server_error},
    // The client was closing (a signal arrived): nothing wrong with the
    // request, the service is not there for it any more.
    {errc::shutdown, exit_code::unavailable},
    {errc::permission_denied, exit_code::permission},
    {errc::in_doubt, exit_code::in_doubt},
}};

// The status for `ec`: its row for a jobguard code, else by its next step
// (an OS error a retry may mend is 69, any other 64).
int exit_status_for(std::error_code ec) noexcept;
int exit_status_for(const Error& e);

// The footer lines every subcommand's --help ends with: the statuses any
// command may exit with, after its own (`own`, may be empty).
std::string exit_status_help(const std::string& own);

}  // namespace jobguard::cli
