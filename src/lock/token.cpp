#include <fmt/format.h>
#include <sys/random.h>
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <cerrno>
#include <cstring>

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
  // OS randomness fetched 4 KiB at a time per thread (one syscall per 256
  // tokens). The buffer is tied to the pid: a forked child must never hand
  // out the bytes its parent also holds, or two owners would share a token.
  struct Pool {
    std::array<unsigned char, 4096> buf{};
    std::size_t used = 4096;
    pid_t pid = -1;
  };
  thread_local Pool pool;
  // getpid() is a syscall (glibc no longer caches it) and showed in profiles
  // of the acquire path: keep it in a global that a fork handler refreshes.
  static std::atomic<pid_t> cached_pid = [] {
    ::pthread_atfork(nullptr, nullptr, [] { cached_pid.store(::getpid()); });
    return ::getpid();
  }();
  const pid_t me = cached_pid.load(std::memory_order_relaxed);
  if (pool.pid != me || pool.used + 16 > pool.buf.size()) {
    std::size_t got = 0;
    while (got < pool.buf.size()) {
      const ssize_t n = ::getrandom(pool.buf.data() + got, pool.buf.size() - got, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw Error(errc::invalid_argument, fmt::format("getrandom: {}", std::strerror(errno)));
      }
      got += static_cast<std::size_t>(n);
    }
    pool.used = 0;
    pool.pid = me;
  }
  std::array<unsigned char, 16> rnd{};
  std::copy_n(pool.buf.begin() + static_cast<std::ptrdiff_t>(pool.used), rnd.size(), rnd.begin());
  // Never reuse bytes: wipe what we hand out.
  std::fill_n(pool.buf.begin() + static_cast<std::ptrdiff_t>(pool.used), rnd.size(), 0);
  pool.used += rnd.size();
  static const std::string host = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return std::string("unknown-host");
    return std::string(buf);
  }();
  // The pid is read every time: a forked child must not claim its parent's.
  std::string t;
  t.reserve(host.size() + job_id.size() + 48);  // one allocation, not a copy then a regrow
  t.append(host).append(1, '/').append(std::to_string(me)).append(1, '/').append(job_id).append(1, '#');
  static constexpr char digits[] = "0123456789abcdef";
  for (unsigned char c : rnd) {
    t.push_back(digits[c >> 4]);
    t.push_back(digits[c & 0xf]);
  }
  return t;
}

std::string token_owner(std::string_view token) {
  const auto hash = token.rfind('#');
  if (hash == std::string_view::npos) return std::string(token);
  return std::string(token.substr(0, hash));
}

}  // namespace jobguard
