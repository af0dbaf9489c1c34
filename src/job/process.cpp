#include "jobguard/job/process.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <optional>
#include <system_error>

#include "jobguard/error.hpp"

extern char** environ;

namespace jobguard::job {

namespace asio = boost::asio;
using std::chrono::milliseconds;

std::string ExitStatus::describe() const {
  if (signaled) {
    const char* name = ::strsignal(signal);
    return fmt::format("killed by signal {} ({})", signal, name ? name : "?");
  }
  return fmt::format("exit status {}", code);
}

namespace {

class SpawnAttrs {
 public:
  SpawnAttrs() {
    posix_spawnattr_init(&attr_);
    sigset_t defaults, empty;
    sigemptyset(&defaults);
    // A parent started in the background by a non-interactive shell ignores
    // SIGINT/SIGQUIT, and a parent with a Redis client may ignore SIGPIPE;
    // ignored dispositions survive exec, so reset the ones CMD relies on.
    for (int s : {SIGINT, SIGTERM, SIGQUIT, SIGHUP, SIGPIPE, SIGCHLD}) sigaddset(&defaults, s);
    sigemptyset(&empty);
    posix_spawnattr_setsigdefault(&attr_, &defaults);
    posix_spawnattr_setsigmask(&attr_, &empty);
    // pgroup 0: the child leads a new group whose id is its pid.
    posix_spawnattr_setpgroup(&attr_, 0);
    posix_spawnattr_setflags(&attr_, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  }
  ~SpawnAttrs() { posix_spawnattr_destroy(&attr_); }
  SpawnAttrs(const SpawnAttrs&) = delete;
  SpawnAttrs& operator=(const SpawnAttrs&) = delete;
  const posix_spawnattr_t* get() const { return &attr_; }

 private:
  posix_spawnattr_t attr_;
};

std::vector<std::string> build_env(const std::vector<std::pair<std::string, std::string>>& extra) {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry(*e);
    const auto name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [k, v] : extra) replaced = replaced || k == name;
    if (!replaced) out.emplace_back(entry);
  }
  for (const auto& [k, v] : extra) out.push_back(k + "=" + v);
  return out;
}

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));  // close-on-exec by default
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace

struct Process::Impl : std::enable_shared_from_this<Process::Impl> {
  explicit Impl(asio::any_io_executor ex) : pidfd(ex), sigchld(ex), kill_timer(ex), drain_timer(ex) {}

  asio::posix::stream_descriptor pidfd;
  asio::signal_set sigchld;
  asio::steady_timer kill_timer;
  asio::steady_timer drain_timer;
  ExitHandler on_exit;
  pid_t pid = -1;
  bool reaped = false;
  bool reported = false;
  bool terminating = false;
  bool kill_sent = false;
  int drain_polls_after_kill = 0;
  std::optional<std::chrono::steady_clock::time_point> kill_at;
  ExitStatus status;

  bool group_alive() const { return pid > 0 && ::kill(-pid, 0) == 0; }

  void signal_group(int sig) {
    if (pid <= 0) return;
    // The group outlives its leader while members remain; ESRCH means it is gone.
    ::kill(-pid, sig);
  }

  // True once the child was reaped.
  bool try_reap() {
    if (reaped) return true;
    int st = 0;
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == 0) return false;
    if (r < 0) {
      if (errno == EINTR) return false;
      // ECHILD: someone else reaped it (a SIG_IGN'd SIGCHLD would do that);
      // the status is lost, report it as killed so no one mistakes it for success.
      status = ExitStatus{true, 0, SIGKILL};
    } else if (WIFSIGNALED(st)) {
      status = ExitStatus{true, 0, WTERMSIG(st)};
    } else {
      status = ExitStatus{false, WEXITSTATUS(st), 0};
    }
    reaped = true;
    return true;
  }

  void on_reaped() {
    boost::system::error_code ignored;
    pidfd.close(ignored);
    sigchld.cancel();
    maybe_report();
  }

  // After terminate(), the job is over only when its whole group is: a shell
  // that dies first must not leave a `sleep` that ignores SIGTERM running on.
  void maybe_report() {
    if (reported || !reaped) return;
    if (terminating && group_alive() && drain_polls_after_kill < 50) {
      if (kill_sent) ++drain_polls_after_kill;  // zombies of orphans can linger: bounded
      drain_timer.expires_after(milliseconds(20));
      drain_timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
        if (!ec) self->maybe_report();
      });
      return;
    }
    reported = true;
    kill_timer.cancel();
    if (auto cb = std::move(on_exit)) {
      on_exit = nullptr;
      cb(status);
    }
  }

  void watch_pidfd() {
    pidfd.async_wait(asio::posix::stream_descriptor::wait_read,
                     [self = shared_from_this()](boost::system::error_code ec) {
                       if (ec) return;
                       if (self->try_reap()) self->on_reaped();
                       else self->watch_pidfd();
                     });
  }

  void watch_sigchld() {
    sigchld.async_wait([self = shared_from_this()](boost::system::error_code ec, int) {
      if (ec) return;
      if (self->try_reap()) self->on_reaped();
      else self->watch_sigchld();
    });
  }

  void arm_kill() {
    kill_timer.expires_at(*kill_at);
    kill_timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec) return;
      self->kill_sent = true;
      self->signal_group(SIGKILL);
      self->maybe_report();
    });
  }
};

Process::Process(asio::any_io_executor ex, const ProcessOptions& options, ExitHandler on_exit)
    : impl_(std::make_shared<Impl>(ex)) {
  if (options.argv.empty() || options.argv[0].empty()) throw Error(errc::invalid_argument, "no command to run");
  std::vector<char*> argv;
  for (const auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  auto env = build_env(options.env);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  impl_->on_exit = std::move(on_exit);
  SpawnAttrs attrs;
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, argv[0], nullptr, attrs.get(), argv.data(), envp.data());
  if (rc != 0) throw std::system_error(rc, std::generic_category(), fmt::format("cannot run \"{}\"", options.argv[0]));
  impl_->pid = pid;

  const int fd = open_pidfd(pid);
  if (fd >= 0) {
    impl_->pidfd.assign(fd);
    impl_->watch_pidfd();
  } else {
    // Without a pidfd: a SIGCHLD that arrived before the handler was installed
    // is lost, so look once after installing it.
    impl_->sigchld.add(SIGCHLD);
    impl_->watch_sigchld();
    asio::post(ex, [self = impl_] {
      if (self->try_reap()) self->on_reaped();
    });
  }
}

Process::~Process() {
  auto& s = *impl_;
  s.on_exit = nullptr;
  boost::system::error_code ignored;
  s.pidfd.close(ignored);
  s.sigchld.cancel();
  s.kill_timer.cancel();
  s.drain_timer.cancel();
  if (!s.reaped && s.pid > 0) {
    s.signal_group(SIGKILL);
    int st = 0;
    while (::waitpid(s.pid, &st, 0) < 0 && errno == EINTR) {
    }
    s.reaped = true;
  }
}

pid_t Process::pid() const noexcept { return impl_->pid; }
bool Process::running() const noexcept { return !impl_->reaped; }
bool Process::terminating() const noexcept { return impl_->terminating; }

void Process::forward(int sig) {
  if (impl_->reported) return;
  impl_->signal_group(sig);
}

void Process::terminate(milliseconds grace) {
  auto& s = *impl_;
  if (s.reported) return;
  s.terminating = true;
  const auto at = std::chrono::steady_clock::now() + std::max(grace, milliseconds(0));
  if (s.kill_at && *s.kill_at <= at) return;
  s.kill_at = at;
  s.signal_group(SIGTERM);
  if (grace.count() <= 0) {
    s.kill_sent = true;
    s.signal_group(SIGKILL);
  }
  s.arm_kill();
  s.maybe_report();
}

}  // namespace jobguard::job
