#include "jobguard/job/limits.hpp"

#include <fmt/format.h>

#include <charconv>

#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"

namespace jobguard::job {

RateLimit parse_rate(std::string_view text) {
  RateLimit r;
  std::string_view rest = text;
  if (const auto eq = rest.find('='); eq != std::string_view::npos) {
    r.field = std::string(rest.substr(0, eq));
    if (r.field.empty()) throw Error(errc::invalid_argument, fmt::format("rate \"{}\": empty field name", text));
    rest = rest.substr(eq + 1);
  }
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos)
    throw Error(errc::invalid_argument, fmt::format("rate \"{}\": expected [FIELD=]N/PERIOD, e.g. 100/min", text));
  const auto n = rest.substr(0, slash);
  const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), r.count);
  if (ec != std::errc{} || end != n.data() + n.size() || n.empty())
    throw Error(errc::invalid_argument, fmt::format("rate \"{}\": \"{}\" is not a whole number of jobs", text, n));
  if (r.count <= 0) throw Error(errc::invalid_argument, fmt::format("rate \"{}\": the count must be at least 1", text));
  const auto period = rest.substr(slash + 1);
  if (period == "s" || period == "sec") r.per = std::chrono::seconds(1);
  else if (period == "min") r.per = std::chrono::minutes(1);
  else if (period == "h") r.per = std::chrono::hours(1);
  else r.per = parse_duration_ms(period, fmt::format("rate \"{}\"", text));
  if (r.per.count() <= 0) throw Error(errc::invalid_argument, fmt::format("rate \"{}\": the period must be more than 0", text));
  if (r.interval().count() < 1)
    throw Error(errc::invalid_argument, fmt::format("rate \"{}\": more than one job per microsecond", text));
  return r;
}

std::string rate_key(const RateLimit& r, std::string_view lock_class, std::string_view value) {
  if (r.field.empty()) return fmt::format("jobguard:rate:{}", lock_class);
  return fmt::format("jobguard:rate:{}={}", r.field, value);
}

ConcurrencyLimit parse_concurrency(std::string_view text) {
  ConcurrencyLimit c;
  const auto eq = text.find('=');
  if (eq == std::string_view::npos)
    throw Error(errc::invalid_argument, fmt::format("concurrency \"{}\": expected FIELD=N, e.g. customer=2", text));
  c.field = std::string(text.substr(0, eq));
  if (c.field.empty()) throw Error(errc::invalid_argument, fmt::format("concurrency \"{}\": empty field name", text));
  for (unsigned char ch : c.field)
    if (ch <= 0x20 || ch == 0x7f || ch == '{' || ch == '}')
      throw Error(errc::invalid_argument,
                  fmt::format("concurrency \"{}\": the field name has a brace, a space or a control byte", text));
  const auto n = text.substr(eq + 1);
  long long count = 0;
  const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), count);
  if (ec != std::errc{} || end != n.data() + n.size() || n.empty())
    throw Error(errc::invalid_argument, fmt::format("concurrency \"{}\": \"{}\" is not a whole number of jobs", text, n));
  if (count < 1 || count > LockOptions::kMaxPermits)
    throw Error(errc::invalid_argument, fmt::format("concurrency \"{}\": the count must be in [1, {}]", text,
                                                    LockOptions::kMaxPermits));
  c.count = static_cast<int>(count);
  return c;
}

std::string concurrency_resource(const ConcurrencyLimit& c, std::string_view value) {
  // KeyBuilder::validate_resource's limit.
  constexpr std::size_t kMaxResource = 512;
  std::string r = fmt::format("concurrency:{}=", c.field);
  for (unsigned char ch : value) {
    const bool plain = ch > 0x20 && ch != 0x7f && ch != '{' && ch != '}' && ch != '%';
    std::string piece = plain ? std::string(1, static_cast<char>(ch)) : fmt::format("%{:02X}", ch);
    if (r.size() + piece.size() > kMaxResource) break;
    r += piece;
  }
  return r;
}

}  // namespace jobguard::job
