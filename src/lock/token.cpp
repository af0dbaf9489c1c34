#include <fmt/format.h>
#include <sys/random.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"

namespace jobguard {

std::string make_token(std::string_view job_id) {
  for (char c : job_id)
    if (c == '#' || static_cast<unsigned char>(c) <= 0x20)
      throw Error(errc::invalid_argument, fmt::format("job id \"{}\" may not contain '#' or whitespace", job_id));
  // 128 bits from the kernel CSPRNG: a token nobody else can guess or collide
  // with, so compare-and-delete really proves ownership.
  std::array<unsigned char, 16> rnd{};
  std::size_t got = 0;
  while (got < rnd.size()) {
    const ssize_t n = ::getrandom(rnd.data() + got, rnd.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(errc::invalid_argument, fmt::format("getrandom: {}", std::strerror(errno)));
    }
    got += static_cast<std::size_t>(n);
  }
  static const std::string host = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return std::string("unknown-host");
    return std::string(buf);
  }();
  std::string hex;
  hex.reserve(32);
  static constexpr char digits[] = "0123456789abcdef";
  for (unsigned char c : rnd) {
    hex.push_back(digits[c >> 4]);
    hex.push_back(digits[c & 0xf]);
  }
  return fmt::format("{}/{}/{}#{}", host, ::getpid(), job_id, hex);
}

std::string token_owner(std::string_view token) {
  const auto hash = token.rfind('#');
  if (hash == std::string_view::npos) return std::string(token);
  return std::string(token.substr(0, hash));
}

}  // namespace jobguard
