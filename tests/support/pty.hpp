// Runs a binary as the session leader of a fresh pseudo-terminal, as a shell
// in a terminal window would: the pty is its controlling terminal and its
// process group is the terminal's foreground group. For tests of job control
// (SIGTTIN for a background reader, tcsetpgrp).
//
// Threads: one owner. The destructor SIGKILLs a child still running (and its
// process group) and reaps it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace jobguard::test {

class PtyProcess {
 public:
  // argv[0] must be a path (no PATH lookup). `env` is added to (or replaces
  // in) the test's environment. Throws std::runtime_error when it cannot start.
  explicit PtyProcess(std::vector<std::string> argv, std::vector<std::pair<std::string, std::string>> env = {});
  ~PtyProcess();
  PtyProcess(const PtyProcess&) = delete;
  PtyProcess& operator=(const PtyProcess&) = delete;

  pid_t pid() const noexcept { return pid_; }
  // Types `text` on the terminal.
  void write(std::string_view text);
  // Waits up to `timeout` for the exit (exit code, or 128 + signal), reading
  // the terminal meanwhile; nullopt if still running then.
  std::optional<int> wait_for(std::chrono::milliseconds timeout);
  // Everything the terminal has shown so far (stdout and stderr of the child).
  const std::string& screen();

 private:
  void drain();
  int master_ = -1;
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::string screen_;
};

}  // namespace jobguard::test
