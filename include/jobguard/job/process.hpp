// The mechanism under job::Supervisor: one CMD in its own process group,
// watched by a guardian process that kills the whole group when jobguard dies,
// whatever kills it (SIGKILL included). Use job::Supervisor; this class has no
// policy (no timeouts, no leases, no signal forwarding of its own).
//
// The group: CMD is spawned (posix_spawnp: vfork + exec) as the leader of a
// new process group. One guardian per process serves every CMD: forked once,
// at the first CMD, in its own session with every signal blocked, it holds
// one end of a socket pair whose other end only this process holds, and is
// told each group when it starts and again when it ends. At EOF — this
// process exited or was killed, SIGKILL included — it SIGKILLs every group it
// still lists. When CMD exits, the Process kills its group (whatever CMD left
// in it) before it reaps CMD: until the reap the group id cannot be reused,
// so neither the Process nor the guardian can ever signal a stranger's group.
// What it cannot cover: a process that leaves the group (setsid, setpgid), a
// SIGSTOPped or SIGKILLed guardian, and a jobguard killed in the moment
// between the spawn and telling the guardian (docs/lock-safety.md,
// "Supervision").
//
// Exit, stop and continue of CMD are reported on an Asio executor without
// blocking the loop: a pidfd (Linux >= 5.3) for the exit and SIGCHLD +
// waitid(WSTOPPED | WCONTINUED) for the rest.
//
// Threads: construct, call and destroy a Process on the thread that runs its
// executor (one io_context run by one thread); callbacks run there too.
// Ownership: the Process owns CMD; destroying it while CMD runs SIGKILLs the
// group and reaps CMD.
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
  // same name. Inherited JOBGUARD_*_URL and JOBGUARD_*_PASSWORD variables are
  // never passed on: they may carry credentials CMD has no business with.
  std::vector<std::pair<std::string, std::string>> env{};
  // Make CMD's group the foreground process group of the terminal on standard
  // input, so CMD can read it (and the terminal's own signals reach CMD, not
  // us); given back to our group when CMD ends. Without it, a CMD that reads
  // the terminal is stopped by SIGTTIN.
  bool foreground = false;
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

// The environment CMD gets: ours without the variables ProcessOptions::env
// says are never passed on, then `extra`. "NAME=value" strings.
std::vector<std::string> child_environment(const std::vector<std::pair<std::string, std::string>>& extra);

class Process {
 public:
  using ExitHandler = std::function<void(ExitStatus)>;
  // CMD (its group leader) stopped (`stopped`, with the stop signal) or continued.
  using StopHandler = std::function<void(bool stopped, int signal)>;

  // Starts CMD (posix_spawnp) in a new group of its own, and the process's
  // guardian if it has none yet. CMD
  // gets default dispositions for every signal jobguard may catch or ignore
  // (SIGPIPE included) and an empty signal mask, whatever its parent had.
  // Other file descriptors are inherited as with flock(1).
  // Throws std::system_error with the errno of the failed exec (ENOENT: not
  // found, EACCES: not executable) or of the failed spawn or terminal hand-over,
  // naming the command (or "starting the process-group guardian" when no
  // guardian could be started); and jobguard::Error(invalid_argument) for an empty
  // argv. `on_exit` runs once on `ex` when CMD has exited and its group has
  // been killed (nothing CMD left in it survives the report).
  Process(boost::asio::any_io_executor ex, const ProcessOptions& options, ExitHandler on_exit,
          StopHandler on_stop = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const noexcept;
  // The process group: CMD's pid (CMD leads it; its descendants are in it).
  pid_t pgid() const noexcept;
  bool running() const noexcept;
  bool stopped() const noexcept;

  // Sends `sig` to the whole group, then SIGCONT so that a stopped group can
  // act on it (as service managers do). No-op once CMD was reaped.
  void signal_group(int sig);
  // SIGKILL to the group now.
  void kill();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace jobguard::job
