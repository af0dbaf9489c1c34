// One error story for all of jobguard. Every failure carries an `errc`, and
// every errc maps to what the caller should do next (STYLE.md principle 2):
// retry the call, restart the attempt, stop, or consult the idempotency record
// because the side effect is in doubt. "Lock is busy" is a result, not an error.
#pragma once

#include <stdexcept>
#include <string>
#include <system_error>

namespace jobguard {

enum class errc {
  ok = 0,
  // --- retry the call: transient, the same call may succeed later -----------
  not_connected = 1,       // no live connection and the deadline passed
  connection_lost,         // the connection broke with this call in flight
  timeout,                 // the call's deadline passed before its reply
  server_busy,             // LOADING / BUSY / TRYAGAIN / MASTERDOWN and friends
  redis_unavailable,       // umbrella used by the CLI: Redis could not serve us
  postgres_unavailable,    // PostgreSQL could not be reached or dropped us
  // --- restart the attempt: our claim on the resource is gone ---------------
  lease_lost = 20,         // the lock expired or was taken while we held it
  stale_fence,             // the downstream saw a newer fencing token
  // --- stop: fixing this needs a human ----------------------------------------
  invalid_argument = 40,   // malformed key, duration, option...
  invalid_url,             // malformed redis:// / rediss:// / postgres URL
  auth_failed,             // AUTH rejected (wrong password, unknown ACL user)
  tls_error,               // TLS handshake or certificate verification failed
  protocol_error,          // the server sent bytes we cannot parse
  server_error,            // an -ERR reply the caller did not expect
  script_error,            // a Lua script failed on the server
  shutdown,                // the client is closing; no new calls accepted
  // --- in doubt: the side effect may or may not have happened ---------------
  in_doubt = 60,
};

// What the caller does next, derived from the errc alone.
enum class next_step { none, retry_call, restart_attempt, stop, check_record };

const std::error_category& jobguard_category() noexcept;

inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), jobguard_category()};
}

next_step next_step_for(std::error_code ec) noexcept;
const char* to_string(next_step s) noexcept;

// Thrown by the blocking facades. `what()` is a one-line message that names
// what is wrong and where (the URL part, the key, the server reply...).
class Error : public std::runtime_error {
 public:
  Error(std::error_code ec, const std::string& detail);
  explicit Error(errc e, const std::string& detail) : Error(make_error_code(e), detail) {}
  std::error_code code() const noexcept { return code_; }
  next_step next() const noexcept { return next_step_for(code_); }

 private:
  std::error_code code_;
};

}  // namespace jobguard

template <>
struct std::is_error_code_enum<jobguard::errc> : std::true_type {};
