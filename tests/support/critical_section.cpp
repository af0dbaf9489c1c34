#include "support/critical_section.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <thread>

namespace jobguard::test {

void append_line(const std::string& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  [[maybe_unused]] const auto n = ::write(fd, line.data(), line.size());
  ::close(fd);
}

bool hold_critical_section(const std::string& held, const std::string& log, const std::string& fields,
                           std::chrono::milliseconds hold) {
  const int fd = ::open(held.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
  append_line(log, fmt::format("{} {} {}\n", fd >= 0 ? "grant" : "overlap", fields,
                               std::chrono::steady_clock::now().time_since_epoch().count()));
  std::this_thread::sleep_for(hold);
  if (fd >= 0) {
    ::close(fd);
    ::unlink(held.c_str());
  }
  return fd >= 0;
}

}  // namespace jobguard::test
