// One error story for all of jobguard. Every failure carries an `errc`, and
// every errc maps to what the caller should do next:
// retry the call, restart the attempt, stop, or consult the idempotency record
// because the side effect is in doubt. "Lock is busy" is a result, not an error.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
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
  auth_failed,             // AUTH rejected (wrong password, unknown ACL user, no password set)
  tls_error,               // TLS handshake or certificate verification failed
  protocol_error,          // the server sent bytes we cannot parse
  server_error,            // an -ERR reply the caller did not expect
  script_error,            // a Lua script failed on the server
  shutdown,                // the client is closing; no new calls accepted
  permission_denied,       // NOPERM: the ACL user may not run this command or touch this key
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

// Which system a failure came from. The runner and the CLI decide by it (is
// Redis down, or PostgreSQL?) instead of guessing from the code: a statement
// timeout and a Redis timeout share errc::timeout.
enum class error_source : std::uint8_t {
  none,      // not said (argument checks, local logic)
  redis,     // a Redis server or the connection to it
  postgres,  // a PostgreSQL server or the connection to it
  process,   // a child process jobguard supervises
};
const char* to_string(error_source s) noexcept;

// The one error value: a code (what the caller does next), a one-line text
// that keeps the story (the server's own words, its host:port, the key or
// resource), and where it came from. Thrown by the blocking facades and
// passed as `const Error&` to asynchronous handlers, where a
// default-constructed Error means success.
//
// Cost: an Error that is no error holds no text and allocates nothing, so
// handlers on the success path pay for a null pointer. Copies share the text.
class Error : public std::exception {
 public:
  Error() noexcept = default;
  Error(std::error_code ec, const std::string& detail, error_source source = error_source::none);
  Error(errc e, const std::string& detail, error_source source = error_source::none)
      : Error(make_error_code(e), detail, source) {}
  // The code alone, its meaning as the text (a clear code is no error): what
  // a handler that kept only a std::error_code passes on to one that takes
  // an Error. Where the Error itself is at hand, pass it: it keeps the story.
  Error(std::error_code ec) : Error(ec ? Error(ec, std::string()) : Error()) {}

  // True when this is an error.
  explicit operator bool() const noexcept { return static_cast<bool>(code_); }
  std::error_code code() const noexcept { return code_; }
  // The code alone, for a handler that needs no more: a Redis completion
  // (`const Error&`) may be handled by a callable taking a std::error_code.
  operator std::error_code() const noexcept { return code_; }
  next_step next() const noexcept { return next_step_for(code_); }
  error_source source() const noexcept { return source_; }
  // "<what the code means>: <detail>", one line; "ok" for no error.
  const char* what() const noexcept override;
  // The text after the code's meaning (what was asked, where, the server's words).
  std::string_view detail() const noexcept;
  // The same error with `context` put before the detail ("release of
  // jobguard:lock:{k}"): how a layer that knows the key adds it on the error
  // path only. No error stays no error.
  Error with_context(std::string_view context) const;

 private:
  std::error_code code_;
  error_source source_ = error_source::none;
  std::uint32_t detail_at_ = 0;  // where detail() starts in *what_
  std::shared_ptr<const std::string> what_;
};

}  // namespace jobguard

template <>
struct std::is_error_code_enum<jobguard::errc> : std::true_type {};
