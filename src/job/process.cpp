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
  // `block_all`: start with every signal blocked (the guardian) instead of none.
  explicit SpawnAttrs(pid_t pgroup, bool block_all = false) {
    posix_spawnattr_init(&attr_);
    // Every disposition back to default: ignored ones survive exec, and
    // jobguard ignores SIGPIPE (so must CMD not: `cmd | head -1` relies on it),
    // and a parent started in the background by a non-interactive shell
    // ignores SIGINT/SIGQUIT.
    sigset_t defaults, empty;
    sigfillset(&defaults);
    sigdelset(&defaults, SIGKILL);
    sigdelset(&defaults, SIGSTOP);
    if (block_all) sigfillset(&empty);
    else sigemptyset(&empty);
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

// The guardian: /bin/sh leading CMD's new process group, every signal
// blocked, reading a pipe whose write end only we hold. At EOF — we closed it
// when CMD ended, or we died of anything, SIGKILL included — it kills the
// group, itself with it. Blocked, not ignored: signals sent to the group
// (forwarded ones, ^C with CMD in the foreground) stay pending in it, and a
// blocked SIGTTIN/SIGTTOU/SIGTSTP does not stop it. It is spawned as CMD is
// (vfork + exec), never forked: a fork copies the page tables of the whole
// process, milliseconds for a busy worker, on the event loop, once per CMD —
// that serialised every spawn of a concurrent worker.
constexpr const char* kGuardianScript = "read _; kill -KILL 0";

class SpawnFiles {
 public:
  // The guardian's descriptors: the pipe on stdin, /dev/null for output,
  // nothing else (above all no other guardian's pipe, which would hold off
  // that guardian's EOF; ours are close-on-exec too, this is the backstop).
  explicit SpawnFiles(int rfd) {
    posix_spawn_file_actions_init(&fa_);
    posix_spawn_file_actions_adddup2(&fa_, rfd, 0);
    posix_spawn_file_actions_addopen(&fa_, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa_, 1, 2);
    posix_spawn_file_actions_addclosefrom_np(&fa_, 3);
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
  explicit Impl(asio::any_io_executor ex) : pidfd(ex), guardian_pidfd(ex), sigchld(ex) {}

  asio::posix::stream_descriptor pidfd;
  asio::posix::stream_descriptor guardian_pidfd;
  asio::signal_set sigchld;
  ExitHandler on_exit;
  StopHandler on_stop;
  pid_t pid = -1;
  pid_t guardian = -1;
  int guardian_pipe = -1;  // our write end; closing it makes the guardian kill the group
  bool reaped = false;
  bool guardian_reaped = false;
  bool reported = false;
  bool stopped = false;
  pid_t restore_pgrp = -1;  // --foreground: the terminal's group before CMD
  ExitStatus status;

  void release_terminal() {
    if (restore_pgrp > 0) set_foreground(restore_pgrp);
    restore_pgrp = -1;
  }

  void close_guardian_pipe() {
    if (guardian_pipe >= 0) ::close(guardian_pipe);
    guardian_pipe = -1;
  }

  void poll() {
    while (!reaped) {
      int st = 0;
      const pid_t r = ::waitpid(pid, &st, WNOHANG | WUNTRACED | WCONTINUED);
      if (r == 0) break;
      if (r < 0) {
        if (errno == EINTR) continue;
        // ECHILD: someone else reaped it (a SIG_IGN'd SIGCHLD would do that);
        // the status is lost, report it as killed so no one mistakes it for success.
        status = ExitStatus{true, 0, SIGKILL};
        reaped = true;
      } else if (WIFSTOPPED(st)) {
        stopped = true;
        if (on_stop) on_stop(true, WSTOPSIG(st));
      } else if (WIFCONTINUED(st)) {
        stopped = false;
        if (on_stop) on_stop(false, 0);
      } else {
        status = WIFSIGNALED(st) ? ExitStatus{true, 0, WTERMSIG(st)} : ExitStatus{false, WEXITSTATUS(st), 0};
        reaped = true;
      }
    }
    if (!reaped) return;
    // CMD is over: the terminal goes back before anything else runs in our
    // group, and whatever CMD left in its group dies with the guardian, so
    // nothing of this job runs on once we report (and release the lock).
    release_terminal();
    close_guardian_pipe();
    while (!guardian_reaped) {
      int st = 0;
      const pid_t r = ::waitpid(guardian, &st, WNOHANG);
      if (r == 0) return;  // its pidfd or SIGCHLD calls us again
      if (r < 0 && errno == EINTR) continue;
      guardian_reaped = true;
    }
    if (reported) return;
    reported = true;
    boost::system::error_code ignored;
    pidfd.close(ignored);
    guardian_pidfd.close(ignored);
    sigchld.cancel();
    on_stop = nullptr;
    if (auto cb = std::move(on_exit)) {
      on_exit = nullptr;
      cb(status);
    }
  }

  void watch(asio::posix::stream_descriptor& fd) {
    fd.async_wait(asio::posix::stream_descriptor::wait_read,
                  [self = shared_from_this(), &fd](boost::system::error_code ec) {
                    if (ec || self->reported) return;
                    self->poll();
                    // A pidfd stays readable after the exit: watch it no more.
                    if (!self->reported && &fd == &self->pidfd && !self->reaped) self->watch(fd);
                  });
  }

  void watch_sigchld() {
    // Stops and continues are reported only by SIGCHLD (a pidfd signals exit);
    // it also covers kernels without pidfds.
    sigchld.async_wait([self = shared_from_this()](boost::system::error_code ec, int) {
      if (ec || self->reported) return;
      self->poll();
      if (!self->reported) self->watch_sigchld();
    });
  }
};

Process::Process(asio::any_io_executor ex, const ProcessOptions& options, ExitHandler on_exit, StopHandler on_stop)
    : impl_(std::make_shared<Impl>(ex)) {
  if (options.argv.empty() || options.argv[0].empty()) throw Error(errc::invalid_argument, "no command to run");
  std::vector<char*> argv;
  for (const auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  auto env = child_environment(options.env);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  auto fail = [&](int err, std::string_view what) {
    // std::system_error appends the errno's text.
    throw std::system_error(err, std::generic_category(),
                            what.empty() ? fmt::format("cannot run \"{}\"", options.argv[0])
                                         : fmt::format("cannot run \"{}\": {}", options.argv[0], what));
  };

  auto& s = *impl_;
  s.on_exit = std::move(on_exit);
  s.on_stop = std::move(on_stop);
  // Installed before the guardian exists so that no SIGCHLD of ours is missed.
  s.sigchld.add(SIGCHLD);
  // Asio installs its handler without SA_RESTART: every stop, continue and
  // exit of a child would then fail a blocking call on another thread (a
  // write to stderr) with EINTR. Same handler, restarting calls.
  struct sigaction sa {};
  if (::sigaction(SIGCHLD, nullptr, &sa) == 0 && !(sa.sa_flags & SA_RESTART)) {
    sa.sa_flags |= SA_RESTART;
    ::sigaction(SIGCHLD, &sa, nullptr);
  }

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) fail(errno, "pipe");
  pid_t g = -1;
  {
    SpawnFiles files(fds[0]);
    SpawnAttrs guardian_attrs(0, /*block_all=*/true);  // pgroup 0: a new group, led by the guardian
    char sh[] = "sh", dash_c[] = "-c";
    char* gargv[] = {sh, dash_c, const_cast<char*>(kGuardianScript), nullptr};
    char* genv[] = {nullptr};
    const int rc = ::posix_spawn(&g, "/bin/sh", files.get(), guardian_attrs.get(), gargv, genv);
    ::close(fds[0]);
    if (rc != 0) {
      ::close(fds[1]);
      fail(rc, "starting its guardian (/bin/sh)");
    }
  }
  s.guardian = g;
  s.guardian_pipe = fds[1];
  // From here on, a failure must end the guardian (it kills only its own group).
  auto undo = [&](int err, std::string_view what) {
    s.release_terminal();
    s.close_guardian_pipe();
    ::kill(g, SIGKILL);
    reap_blocking(g);
    s.guardian_reaped = true;
    s.reaped = s.reported = true;
    fail(err, what);
  };
  if (::getpgid(g) != g) undo(ESRCH, "the guardian process could not lead a process group");
  if (options.foreground) {
    const pid_t before = ::tcgetpgrp(STDIN_FILENO);
    if (before < 0 || !set_foreground(g)) undo(errno, "--foreground: standard input is not our terminal");
    s.restore_pgrp = before;
  }

  SpawnAttrs attrs(g);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, argv[0], nullptr, attrs.get(), argv.data(), envp.data());
  if (rc != 0) undo(rc, "");
  s.pid = pid;

  if (const int fd = open_pidfd(pid); fd >= 0) {
    s.pidfd.assign(fd);
    s.watch(s.pidfd);
  }
  if (const int fd = open_pidfd(g); fd >= 0) {
    s.guardian_pidfd.assign(fd);
    s.watch(s.guardian_pidfd);
  }
  s.watch_sigchld();
  // A SIGCHLD that came before the handler ran is not lost (the set was
  // installed first), but look once anyway: cheap, and it covers a child that
  // stopped at once.
  asio::post(ex, [self = impl_] {
    if (!self->reported) self->poll();
  });
}

Process::~Process() {
  auto& s = *impl_;
  s.on_exit = nullptr;
  s.on_stop = nullptr;
  boost::system::error_code ignored;
  s.pidfd.close(ignored);
  s.guardian_pidfd.close(ignored);
  s.sigchld.cancel();
  if (!s.reaped && s.pid > 0) {
    ::kill(-s.guardian, SIGKILL);
    reap_blocking(s.pid);
    s.reaped = true;
  }
  s.release_terminal();
  s.close_guardian_pipe();
  if (!s.guardian_reaped && s.guardian > 0) {
    reap_blocking(s.guardian);
    s.guardian_reaped = true;
  }
}

pid_t Process::pid() const noexcept { return impl_->pid; }
pid_t Process::pgid() const noexcept { return impl_->guardian; }
bool Process::running() const noexcept { return !impl_->reaped; }
bool Process::stopped() const noexcept { return impl_->stopped && !impl_->reaped; }

void Process::signal_group(int sig) {
  auto& s = *impl_;
  if (s.reaped) return;
  // The guardian is a member until the end, so the group id is ours as long
  // as CMD is unreaped.
  ::kill(-s.guardian, sig);
  if (sig != SIGCONT && sig != SIGKILL) ::kill(-s.guardian, SIGCONT);
}

void Process::kill() {
  auto& s = *impl_;
  if (s.reaped) return;
  ::kill(-s.guardian, SIGKILL);
}

}  // namespace jobguard::job
