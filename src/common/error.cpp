#include "jobguard/error.hpp"

#include <cerrno>

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
      case errc::permission_denied: return "permission denied";
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

namespace {
// OS error numbers that describe a network that may heal; any other foreign
// code (a TLS library reason, a file that is missing, a bad descriptor) is a
// condition a retry of the same call does not fix.
bool transient_errno(int v) noexcept {
  switch (v) {
    case ECONNREFUSED: case ECONNRESET: case ECONNABORTED: case ETIMEDOUT: case EHOSTUNREACH:
    case ENETUNREACH: case ENETDOWN: case ENETRESET: case EPIPE: case EAGAIN: case EINTR:
    case ENOTCONN: case EADDRNOTAVAIL: case ENOBUFS: case EHOSTDOWN: case ECANCELED:
      return true;
    default:
      return false;
  }
}
}  // namespace

next_step next_step_for(std::error_code ec) noexcept {
  if (!ec) return next_step::none;
  // Codes from other categories are mapped explicitly, never by default to
  // "retry": a loop that retries a configuration error forever hides it.
  if (ec.category() == std::generic_category() || ec.category() == std::system_category())
    return transient_errno(ec.value()) ? next_step::retry_call : next_step::stop;
  if (ec.category() != jobguard_category()) return next_step::stop;
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

const char* to_string(error_source s) noexcept {
  switch (s) {
    case error_source::none: return "jobguard";
    case error_source::redis: return "redis";
    case error_source::postgres: return "postgres";
    case error_source::process: return "process";
  }
  return "?";
}

Error::Error(std::error_code ec, const std::string& detail, error_source source) : code_(ec), source_(source) {
  std::string m = ec.message();
  if (!detail.empty()) {
    m += ": ";
    detail_at_ = static_cast<std::uint32_t>(m.size());
    m += detail;
  } else {
    detail_at_ = static_cast<std::uint32_t>(m.size());
  }
  what_ = std::make_shared<const std::string>(std::move(m));
}

const char* Error::what() const noexcept { return what_ ? what_->c_str() : "ok"; }

std::string_view Error::detail() const noexcept {
  if (!what_) return {};
  return std::string_view(*what_).substr(detail_at_);
}

Error Error::with_context(std::string_view context) const {
  if (!*this) return *this;
  const std::string_view d = detail();
  return Error(code_, d.empty() ? std::string(context) : std::string(context) + ": " + std::string(d), source_);
}

}  // namespace jobguard
