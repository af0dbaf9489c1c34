// job::Supervisor: the one component that runs a CMD under a lease. It starts
// CMD (job::Process: its own process group, a guardian that kills the group if
// jobguard dies), forwards signals, stops CMD on a lost lease, at the lock's
// safe time or at a hard timeout (the stop signal to the group, SIGKILL after
// the grace), notices a CMD stopped by a signal, and reports one outcome.
//
// Many Supervisors may run at once on one executor (no thread of their own,
// no global state but signal dispositions and the process's one guardian:
// constructing one makes the process ignore SIGPIPE, once, so that writing to
// a closed pipe cannot kill jobguard and orphan CMD).
//
// Threads: construct, call and destroy on the thread that runs the executor
// (one io_context, one thread); the handlers run there. remote_stop() returns
// the only thing callable from other threads.
// Ownership: the Supervisor owns CMD; destroying it before the outcome kills
// CMD's group and reaps it (no handler runs then). The Lease, when given, must
// outlive the Supervisor.
#pragma once

#include <sys/types.h>

#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jobguard/job/process.hpp"

namespace jobguard {
class Lease;
}

namespace jobguard::job {

struct SupervisorOptions {
  // The command (argv[0] looked up on PATH) and the variables added to the
  // inherited environment (see ProcessOptions: credentials are not inherited).
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  // Time between the stop signal (SIGTERM, or the forwarded signal) and
  // SIGKILL to the group; also how long CMD may stay stopped (SIGTTIN...)
  // before it is stopped for good. Zero: SIGKILL at once.
  std::chrono::milliseconds grace{10000};
  // Hard timeout from CMD's start. Zero (the default): none.
  std::chrono::milliseconds timeout{0};
  // For a lock that is not renewed: stop CMD as on a lost lease after this
  // (the lock's safe time at CMD's start). Zero (the default): none.
  std::chrono::milliseconds safe_time{0};
  // Watch this lease: its loss stops CMD, and after a SIGCONT to jobguard (a
  // stop of jobguard itself) a lease whose safe time ran out is treated as
  // lost at once. Not owned; must outlive the Supervisor. Null: none.
  Lease* lease = nullptr;
  // Catch forwarded_signals() and forward each to CMD's group, with SIGKILL
  // after `grace` (plus SIGCONT, handled as above). Several Supervisors with
  // this set on one process each forward to their own CMD.
  bool forward_signals = false;
  // Put CMD's group in the terminal's foreground (ProcessOptions::foreground).
  bool foreground = false;
};

// How supervision ended. Exactly one per Supervisor.
enum class Ending {
  exited,           // CMD ended on its own (any status, any signal not ours)
  lease_lost,       // the lease was lost / the safe time ran out; CMD was stopped
  timed_out,        // the hard timeout passed; CMD was stopped
  signaled,         // a forwarded signal (or forward()) ended it
  stopped,          // CMD stayed stopped (SIGTTIN, SIGTSTP...) past the grace and was killed
  failed_to_start,  // CMD could not be spawned
};
std::string_view to_string(Ending e) noexcept;

struct CmdOutcome {
  Ending ending = Ending::exited;
  ExitStatus status;   // CMD's exit (not set for failed_to_start)
  int signal = 0;      // signaled: the forwarded signal; stopped: the stop signal
  int error = 0;       // failed_to_start: errno (ENOENT: not found, EACCES...)
  std::string detail;  // why we stopped it (the lease's reason...) or the spawn error
  // One line for a log: "exit status 3", "lease lost: ...; killed by signal 15".
  std::string describe() const;
};

// Something a log should say while CMD runs.
struct SupervisorEvent {
  enum class Kind {
    stopping,   // we are stopping CMD (cause: lease_lost, timed_out, signaled, stopped)
    suspended,  // CMD was stopped by `signal`; it is killed after the grace unless continued
    resumed,    // CMD continued
    renewed,    // the watched lease was renewed since the last event
  };
  Kind kind;
  Ending cause = Ending::exited;
  int signal = 0;
  std::string message;  // one line, ready for a log
};

class Supervisor {
 public:
  using DoneHandler = std::function<void(const CmdOutcome&)>;
  using EventHandler = std::function<void(const SupervisorEvent&)>;
  // Thread-safe: asks the Supervisor to stop CMD for `why` (lease_lost or
  // timed_out). A no-op after the Supervisor is gone or has ended.
  using RemoteStop = std::function<void(Ending why, std::string detail)>;

  // Starts CMD now. `on_done` runs once on `ex` (never from the constructor,
  // also not for failed_to_start). Throws jobguard::Error(invalid_argument)
  // for an empty argv.
  Supervisor(boost::asio::any_io_executor ex, SupervisorOptions options, DoneHandler on_done,
             EventHandler on_event = {});
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // CMD's pid and its process group; -1 if it did not start.
  pid_t pid() const noexcept;
  pid_t pgid() const noexcept;
  bool done() const noexcept;

  // Sends `sig` to CMD's group with SIGKILL after the grace (Ending::signaled
  // unless CMD is already being stopped for another cause).
  void forward(int sig);
  // Stops CMD: SIGTERM to the group, SIGKILL after the grace. The first cause wins.
  void stop(Ending why, std::string detail);
  // SIGKILL to the group now (a second ^C); the cause stays as it was, or
  // `signaled` (SIGKILL) if there was none.
  void kill();
  RemoteStop remote_stop();

  // The signals jobguard forwards: every catchable one whose default action
  // ends the process and that is not a fault (HUP INT QUIT USR1 USR2 ALRM TERM
  // STKFLT VTALRM PROF IO PWR XCPU XFSZ). SIGPIPE is ignored instead.
  static const std::vector<int>& forwarded_signals();
  // Makes this process ignore SIGPIPE (idempotent; every constructor calls it).
  static void ignore_sigpipe();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace jobguard::job
