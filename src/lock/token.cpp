#include <fmt/format.h>

#include <array>

#include "jobguard/detail/identity.hpp"

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/text.hpp"

namespace jobguard {

std::string make_token(std::string_view job_id) {
  for (char c : job_id)
    if (c == '#' || static_cast<unsigned char>(c) <= 0x20)
      throw Error(errc::invalid_argument, fmt::format("job id \"{}\" may not contain '#' or whitespace", escape_text(job_id, 64)));
  // 128 bits from the kernel CSPRNG: a token nobody else can guess or collide
  // with, so compare-and-delete really proves ownership.
  std::array<unsigned char, 16> rnd{};
  detail::random_bytes(rnd.data(), rnd.size());
  const std::string& host = detail::host_name();
  // The pid is read every time: a forked child must not claim its parent's.
  const std::string pid = std::to_string(detail::process_id());
  std::string t;
  t.reserve(host.size() + pid.size() + job_id.size() + 36);  // one allocation, not a copy then a regrow
  t.append(host).append(1, '/').append(pid).append(1, '/').append(job_id).append(1, '#');
  detail::append_hex(t, rnd.data(), rnd.size());
  return t;
}

std::string token_owner(std::string_view token) {
  const auto hash = token.rfind('#');
  if (hash == std::string_view::npos) return std::string(token);
  return std::string(token.substr(0, hash));
}

}  // namespace jobguard
