#include "jobguard/job/process.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <system_error>

#include "group_guardian.hpp"
#include "jobguard/error.hpp"

extern char** environ;

namespace jobguard::job {

namespace asio = boost::asio;

std::string ExitStatus::describe() const {
  if (signaled) {
    const char* name = ::strsignal(signal);
    return fmt::format("killed by signal {} ({})", signal, name ? name : "?");
  }
  return fmt::format("exit status {}", code);
}

namespace {

bool withheld(std::string_view name) {
  if (name.substr(0, 9) != "JOBGUARD_") return false;
  auto ends = [&](std::string_view s) { return name.size() > 9 + s.size() && name.substr(name.size() - s.size()) == s; };
  return ends("_URL") || ends("_PASSWORD");
}

class SpawnAttrs {
 public:
  // `pgroup` 0: CMD leads a new process group, its own.
  explicit SpawnAttrs(pid_t pgroup) {
    posix_spawnattr_init(&attr_);
    // Every disposition back to default: ignored ones survive exec, and
    // jobguard ignores SIGPIPE (so must CMD not: `cmd | head -1` relies on it),
    // and a parent started in the background by a non-interactive shell
    // ignores SIGINT/SIGQUIT.
    sigset_t defaults, empty;
    sigfillset(&defaults);
    sigdelset(&defaults, SIGKILL);
    sigdelset(&defaults, SIGSTOP);
    sigemptyset(&empty);
    posix_spawnattr_setsigdefault(&attr_, &defaults);
    posix_spawnattr_setsigmask(&attr_, &empty);
    posix_spawnattr_setpgroup(&attr_, pgroup);
    posix_spawnattr_setflags(&attr_, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  }
  ~SpawnAttrs() { posix_spawnattr_destroy(&attr_); }
  SpawnAttrs(const SpawnAttrs&) = delete;
  SpawnAttrs& operator=(const SpawnAttrs&) = delete;
  const posix_spawnattr_t* get() const { return &attr_; }

 private:
  posix_spawnattr_t attr_;
};

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));  // close-on-exec by default
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

class SpawnFiles {
 public:
  // --foreground: CMD's new group takes the terminal in the child, before the
  // exec, so CMD can never read it from the background (and be stopped by
  // SIGTTIN) in the moment before we could hand it over.
  explicit SpawnFiles(bool foreground) {
    posix_spawn_file_actions_init(&fa_);
    if (foreground) posix_spawn_file_actions_addtcsetpgrp_np(&fa_, STDIN_FILENO);
  }
  ~SpawnFiles() { posix_spawn_file_actions_destroy(&fa_); }
  SpawnFiles(const SpawnFiles&) = delete;
  SpawnFiles& operator=(const SpawnFiles&) = delete;
  const posix_spawn_file_actions_t* get() const { return &fa_; }

 private:
  posix_spawn_file_actions_t fa_;
};

// tcsetpgrp from a process that is not in the foreground raises SIGTTOU
// unless it is blocked (termios(3)); block it on this thread for the call.
bool set_foreground(pid_t pgrp) {
  sigset_t ttou, old;
  sigemptyset(&ttou);
  sigaddset(&ttou, SIGTTOU);
  ::pthread_sigmask(SIG_BLOCK, &ttou, &old);
  const bool ok = ::tcsetpgrp(STDIN_FILENO, pgrp) == 0;
  const int saved = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = saved;
  return ok;
}

void reap_blocking(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

std::vector<std::string> child_environment(const std::vector<std::pair<std::string, std::string>>& extra) {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry(*e);
    const auto name = entry.substr(0, entry.find('='));
    bool replaced = withheld(name);
    for (const auto& [k, v] : extra) replaced = replaced || k == name;
    if (!replaced) out.emplace_back(entry);
  }
  for (const auto& [k, v] : extra) out.push_back(k + "=" + v);
  return out;
}

struct Process::Impl : std::enable_shared_from_this<Process::Impl> {
  explicit Impl(asio::any_io_executor ex) : pidfd(ex), sigchld(ex) {}

  asio::posix::stream_descriptor pidfd;
  asio::signal_set sigchld;
  ExitHandler on_exit;
  StopHandler on_stop;
  pid_t pid = -1;           // CMD, the leader of its own group (pgid == pid)
  bool group_ended = false;  // killed and unlisted; from here on only the reap
  bool reaped = false;
  bool reported = false;
  bool stopped = false;
  pid_t restore_pgrp = -1;  // --foreground: the terminal's group before CMD
  ExitStatus status;

  void release_terminal() {
    if (restore_pgrp > 0) set_foreground(restore_pgrp);
    restore_pgrp = -1;
  }

  // CMD has exited (a zombie still, so the group id is still ours): what it
  // left in its group dies now, before the outcome is reported and the lock
  // released, and the guardian forgets the group while its id cannot yet be
  // reused by anyone.
  void end_group() {
    if (group_ended) return;
    group_ended = true;
    ::kill(-pid, SIGKILL);
    detail::unguard_group(pid);
  }

  // Exited? Looked at without reaping: the group must be killed first.
  void poll_exit() {
    while (!reaped) {
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) < 0) {
        if (errno == EINTR) continue;
        // ECHILD: someone else reaped it (a SIG_IGN'd SIGCHLD would do that);
        // the status is lost, report it as killed so no one mistakes it for
        // success. The group id may be anyone's now: no kill.
        status = ExitStatus{true, 0, SIGKILL};
        group_ended = true;
        detail::unguard_group(pid);
        reaped = true;
        break;
      }
      if (info.si_pid != pid) return;
      status = info.si_code == CLD_EXITED ? ExitStatus{false, info.si_status, 0} : ExitStatus{true, 0, info.si_status};
      end_group();
      reap_blocking(pid);
      reaped = true;
    }
    finish();
  }

  // Stopped or continued: only SIGCHLD tells (a pidfd signals the exit).
  void poll_stops() {
    while (!reaped) {
      siginfo_t sc{};
      if (::waitid(P_PID, static_cast<id_t>(pid), &sc, WSTOPPED | WCONTINUED | WNOHANG) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (sc.si_pid != pid) return;
      if (sc.si_code == CLD_CONTINUED) {
        stopped = false;
        if (on_stop) on_stop(false, 0);
      } else {
        stopped = true;
        if (on_stop) on_stop(true, sc.si_status);
      }
    }
  }

  void finish() {
    if (!reaped) return;
    // CMD is over: the terminal goes back before anything else runs in our group.
    release_terminal();
    if (reported) return;
    reported = true;
    boost::system::error_code ignored;
    pidfd.close(ignored);
    sigchld.cancel();
    on_stop = nullptr;
    if (auto cb = std::move(on_exit)) {
      on_exit = nullptr;
      cb(status);
    }
  }

  void watch() {
    pidfd.async_wait(asio::posix::stream_descriptor::wait_read, [self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->reported) return;
      self->poll_exit();
      // A pidfd stays readable after the exit: watch it no more.
      if (!self->reported && !self->reaped) self->watch();
    });
  }

  void watch_sigchld() {
    // Stops and continues are reported only by SIGCHLD (a pidfd signals exit);
    // it also covers kernels without pidfds.
    sigchld.async_wait([self = shared_from_this()](boost::system::error_code ec, int) {
      if (ec || self->reported) return;
      // Every SIGCHLD wakes every Process: with a pidfd for the exit, one
      // system call each, not two (a concurrent worker has dozens).
      self->poll_stops();
      if (!self->pidfd.is_open()) self->poll_exit();
      if (!self->reported) self->watch_sigchld();
    });
  }
};

namespace {

// std::system_error appends the errno's text.
[[noreturn]] void spawn_failed(const std::string& cmd, int err, std::string_view what) {
  throw std::system_error(err, std::generic_category(),
                          what.empty() ? fmt::format("cannot run \"{}\"", cmd)
                                       : fmt::format("cannot run \"{}\": {}", cmd, what));
}

// Asio installs its handler without SA_RESTART: every stop, continue and
// exit of a child would then fail a blocking call on another thread (a
// write to stderr) with EINTR. Same handler, restarting calls.
void restart_calls_on_sigchld() {
  struct sigaction sa {};
  if (::sigaction(SIGCHLD, nullptr, &sa) == 0 && !(sa.sa_flags & SA_RESTART)) {
    sa.sa_flags |= SA_RESTART;
    ::sigaction(SIGCHLD, &sa, nullptr);
  }
}

// CMD started in its own process group (taking the terminal first with
// --foreground): its pid.
pid_t spawn(const ProcessOptions& options) {
  std::vector<char*> argv;
  for (const auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  auto env = child_environment(options.env);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  SpawnFiles files(options.foreground);
  SpawnAttrs attrs(0);
  pid_t pid = -1;
  // The spawn is vfork + exec, never a fork: a fork copies the page tables of
  // the whole process, milliseconds for a busy worker, on the event loop, once
  // per CMD — that serialised every spawn of a concurrent worker.
  const int rc = ::posix_spawnp(&pid, argv[0], files.get(), attrs.get(), argv.data(), envp.data());
  if (rc != 0) {
    // ENOTTY/EPERM from the terminal hand-over come back as the spawn's error.
    if (options.foreground && (rc == ENOTTY || rc == EPERM || rc == EINVAL))
      spawn_failed(options.argv[0], rc, "--foreground: standard input is not our terminal");
    spawn_failed(options.argv[0], rc, "");
  }
  return pid;
}

}  // namespace

Process::Process(asio::any_io_executor ex, const ProcessOptions& options, ExitHandler on_exit, StopHandler on_stop)
    : impl_(std::make_shared<Impl>(ex)) {
  if (options.argv.empty() || options.argv[0].empty()) throw Error(errc::invalid_argument, "no command to run");
  const std::string& cmd = options.argv[0];
  auto& s = *impl_;
  s.on_exit = std::move(on_exit);
  s.on_stop = std::move(on_stop);
  // Installed before CMD exists so that no SIGCHLD of ours is missed.
  s.sigchld.add(SIGCHLD);
  restart_calls_on_sigchld();

  pid_t before = -1;
  if (options.foreground) {
    before = ::tcgetpgrp(STDIN_FILENO);
    if (before < 0) spawn_failed(cmd, errno, "--foreground: standard input is not our terminal");
  }
  // The guardian first: its fork must not widen the moment between CMD's
  // start and its listing (below), in which a jobguard killed leaves CMD
  // unguarded.
  try {
    detail::ensure_guardian();
  } catch (const std::system_error& e) {
    spawn_failed(cmd, e.code().value(), "starting the process-group guardian");
  }
  const pid_t pid = spawn(options);
  s.pid = pid;
  if (options.foreground) s.restore_pgrp = before;
  // The window this leaves: a jobguard killed between the spawn's return and
  // this call (one send(2) on a guardian already running) leaves CMD
  // unguarded.
  try {
    detail::guard_group(pid);
  } catch (const std::system_error& e) {
    s.release_terminal();
    ::kill(-pid, SIGKILL);
    reap_blocking(pid);
    s.group_ended = s.reaped = s.reported = true;
    spawn_failed(cmd, e.code().value(), "starting the process-group guardian");
  }

  if (const int fd = open_pidfd(pid); fd >= 0) {
    s.pidfd.assign(fd);
    s.watch();
  }
  s.watch_sigchld();
  // A SIGCHLD that came before the handler ran is not lost (the set was
  // installed first), but look once anyway: cheap, and it covers a child that
  // stopped at once.
  asio::post(ex, [self = impl_] {
    if (self->reported) return;
    self->poll_stops();
    self->poll_exit();
  });
}

Process::~Process() {
  auto& s = *impl_;
  s.on_exit = nullptr;
  s.on_stop = nullptr;
  boost::system::error_code ignored;
  s.pidfd.close(ignored);
  s.sigchld.cancel();
  if (!s.reaped && s.pid > 0) {
    s.end_group();
    reap_blocking(s.pid);
    s.reaped = true;
  }
  s.release_terminal();
}

pid_t Process::pid() const noexcept { return impl_->pid; }
pid_t Process::pgid() const noexcept { return impl_->pid; }
bool Process::running() const noexcept { return !impl_->reaped; }
bool Process::stopped() const noexcept { return impl_->stopped && !impl_->reaped; }

void Process::signal_group(int sig) {
  auto& s = *impl_;
  // Until the group was killed, CMD is unreaped and the group id ours.
  if (s.group_ended) return;
  ::kill(-s.pid, sig);
  if (sig != SIGCONT && sig != SIGKILL) ::kill(-s.pid, SIGCONT);
}

void Process::kill() {
  auto& s = *impl_;
  if (s.group_ended) return;
  ::kill(-s.pid, SIGKILL);
}

}  // namespace jobguard::job
