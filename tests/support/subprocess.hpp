// Runs a real binary (the jobguard CLI, a shell) as a child of the test:
// arguments and extra environment in, stdout/stderr captured to files (not
// pipes: a grandchild that outlives the child cannot make a reader hang),
// waiting with a timeout, signals out.
//
// Threads: one owner. The destructor SIGKILLs a child still running and
// reaps it, so a failing test never leaves one behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace jobguard::test {

struct SubprocessResult {
  int status = -1;       // exit code, or 128 + signal like a shell
  bool signaled = false;
  std::string out, err;  // everything captured
};

class Subprocess {
 public:
  // argv[0] is looked up on PATH. `env` is added to (or replaces in) the
  // test's environment. Throws std::runtime_error when it cannot spawn.
  explicit Subprocess(std::vector<std::string> argv, std::vector<std::pair<std::string, std::string>> env = {});
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const noexcept { return pid_; }
  bool running();
  // Waits up to `timeout` for the exit; nullopt if still running then.
  std::optional<SubprocessResult> wait_for(std::chrono::milliseconds timeout);
  // wait_for, and when it times out: SIGKILL, reap, and return status -1
  // with "(timed out)" appended to err, so the assertion shows the output.
  SubprocessResult wait_or_kill(std::chrono::milliseconds timeout);
  void signal(int sig);

  // What has been written so far.
  std::string out() const;
  std::string err() const;

 private:
  std::string dir_;
  pid_t pid_ = -1;
  std::optional<SubprocessResult> result_;
};

// The jobguard binary built with the tests.
std::string jobguard_binary();

// Run to completion (with a timeout, then SIGKILL): shorthand for the CLI tests.
SubprocessResult run_jobguard(const std::vector<std::string>& args,
                              std::chrono::milliseconds timeout = std::chrono::seconds(30),
                              std::vector<std::pair<std::string, std::string>> env = {});

// True when no process with `pid` is running any more (gone, or a zombie
// nobody has reaped yet: it runs no code).
bool process_gone(pid_t pid);

// Reads a whole file ("" when missing; what was read when a read fails, as
// on a /proc file of a process that exits meanwhile: ESRCH, never thrown).
std::string read_file(const std::string& path);

// Processes whose command line names `needle`, as "PID: command line". A
// zombie's command line is empty, so one that died but is not reaped yet
// never matches.
std::vector<std::string> processes_naming(const std::string& needle);

}  // namespace jobguard::test
