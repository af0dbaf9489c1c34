// A child process for a guarded job: CMD runs in its own process group (so
// one signal reaches everything it started), with extra environment variables
// such as JOBGUARD_KEY. Its exit is reported on an Asio executor without
// blocking the loop: through a pidfd (Linux >= 5.3), or SIGCHLD + waitpid(pid,
// WNOHANG) where pidfds are unavailable.
//
// Threads: construct, call and destroy a Process on the thread that runs its
// executor (one io_context run by one thread). The exit callback runs there too.
// Ownership: the Process owns the child; destroying it while the child still
// runs SIGKILLs the group and reaps the child, so nothing outlives the owner
// unnoticed.
#pragma once

#include <sys/types.h>

#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace jobguard::job {

struct ProcessOptions {
  // argv[0] is looked up on PATH as execvp(3) does. Must not be empty.
  std::vector<std::string> argv{};
  // Added to the inherited environment; an entry replaces a variable of the
  // same name.
  std::vector<std::pair<std::string, std::string>> env{};
};

struct ExitStatus {
  bool signaled = false;  // killed by a signal (then `signal` is set)
  int code = 0;           // exit code when !signaled
  int signal = 0;
  // The status a shell reports: the exit code, or 128 + the signal number.
  int shell_status() const noexcept { return signaled ? 128 + signal : code; }
  // "exit status 3" / "killed by signal 15 (Terminated)".
  std::string describe() const;
};

class Process {
 public:
  using ExitHandler = std::function<void(ExitStatus)>;

  // Spawns at once (posix_spawnp: no fork of a multi-threaded process). The
  // child gets default dispositions for SIGINT, SIGTERM, SIGQUIT, SIGHUP,
  // SIGPIPE and SIGCHLD and an empty signal mask, whatever its parent had.
  // Other file descriptors are inherited as with flock(1).
  // Throws std::system_error with the errno of the failed exec (ENOENT: not
  // found, EACCES: not executable), naming the command; and
  // jobguard::Error(invalid_argument) for an empty argv.
  // `on_exit` runs once on `ex` when the child has exited; after terminate(),
  // only once the rest of its group is gone too (or was SIGKILLed).
  Process(boost::asio::any_io_executor ex, const ProcessOptions& options, ExitHandler on_exit);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const noexcept;
  // The process group: equal to pid().
  pid_t pgid() const noexcept { return pid(); }
  bool running() const noexcept;
  bool terminating() const noexcept;

  // Sends `sig` to the whole group. No-op once the group is gone.
  void forward(int sig);
  // SIGTERM to the group now, SIGKILL to the group after `grace` (at once
  // when grace is zero). A second call never extends an earlier deadline.
  void terminate(std::chrono::milliseconds grace);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace jobguard::job
