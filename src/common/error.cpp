#include "jobguard/error.hpp"

namespace jobguard {
namespace {

class Category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "jobguard"; }
  std::string message(int v) const override {
    switch (static_cast<errc>(v)) {
      case errc::ok: return "ok";
      case errc::not_connected: return "not connected to the server";
      case errc::connection_lost: return "connection lost with the call in flight";
      case errc::timeout: return "deadline exceeded";
      case errc::server_busy: return "server busy";
      case errc::redis_unavailable: return "Redis unavailable";
      case errc::postgres_unavailable: return "PostgreSQL unavailable";
      case errc::lease_lost: return "lease lost";
      case errc::stale_fence: return "stale fencing token";
      case errc::invalid_argument: return "invalid argument";
      case errc::invalid_url: return "invalid URL";
      case errc::auth_failed: return "authentication failed";
      case errc::tls_error: return "TLS error";
      case errc::protocol_error: return "protocol error";
      case errc::server_error: return "server error";
      case errc::script_error: return "script error";
      case errc::shutdown: return "client shut down";
      case errc::in_doubt: return "outcome in doubt";
    }
    return "unknown jobguard error";
  }
};

}  // namespace

const std::error_category& jobguard_category() noexcept {
  static const Category c;
  return c;
}

next_step next_step_for(std::error_code ec) noexcept {
  if (!ec) return next_step::none;
  if (ec.category() != jobguard_category()) return next_step::retry_call;
  const int v = ec.value();
  if (v >= 60) return next_step::check_record;
  if (v >= 40) return next_step::stop;
  if (v >= 20) return next_step::restart_attempt;
  return next_step::retry_call;
}

const char* to_string(next_step s) noexcept {
  switch (s) {
    case next_step::none: return "none";
    case next_step::retry_call: return "retry the call";
    case next_step::restart_attempt: return "restart the attempt";
    case next_step::stop: return "stop";
    case next_step::check_record: return "check the idempotency record";
  }
  return "?";
}

Error::Error(std::error_code ec, const std::string& detail)
    : std::runtime_error(detail.empty() ? ec.message() : ec.message() + ": " + detail), code_(ec) {}

}  // namespace jobguard
