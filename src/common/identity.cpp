#include "jobguard/detail/identity.hpp"

#include <fmt/format.h>
#include <pthread.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "jobguard/error.hpp"

namespace jobguard::detail {

namespace {
std::atomic<pid_t>& cached_pid() {
  static std::atomic<pid_t> pid = [] {
    ::pthread_atfork(nullptr, nullptr, [] { cached_pid().store(::getpid()); });
    return ::getpid();
  }();
  return pid;
}
}  // namespace

pid_t process_id() noexcept { return cached_pid().load(std::memory_order_relaxed); }

const std::string& host_name() {
  static const std::string host = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return std::string("unknown-host");
    return std::string(buf);
  }();
  return host;
}

void random_bytes(unsigned char* out, std::size_t n) {
  struct Pool {
    std::array<unsigned char, 4096> buf{};
    std::size_t used = 4096;
    pid_t pid = -1;
  };
  thread_local Pool pool;
  const pid_t me = process_id();
  while (n > 0) {
    if (pool.pid != me || pool.used == pool.buf.size()) {
      std::size_t got = 0;
      while (got < pool.buf.size()) {
        const ssize_t r = ::getrandom(pool.buf.data() + got, pool.buf.size() - got, 0);
        if (r < 0) {
          if (errno == EINTR) continue;
          throw Error(errc::invalid_argument, fmt::format("getrandom: {}", std::strerror(errno)));
        }
        got += static_cast<std::size_t>(r);
      }
      pool.used = 0;
      pool.pid = me;
    }
    const std::size_t take = std::min(n, pool.buf.size() - pool.used);
    unsigned char* from = pool.buf.data() + pool.used;
    std::memcpy(out, from, take);
    std::memset(from, 0, take);  // never handed out twice
    pool.used += take;
    out += take;
    n -= take;
  }
}

void append_hex(std::string& out, const unsigned char* bytes, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(digits[bytes[i] >> 4]);
    out.push_back(digits[bytes[i] & 0xf]);
  }
}

}  // namespace jobguard::detail
