#include "jobguard/job/limits.hpp"

#include <fmt/format.h>

#include <charconv>

#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"

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

}  // namespace jobguard::job
