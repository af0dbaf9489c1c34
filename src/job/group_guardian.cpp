#include "group_guardian.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <system_error>
#include <unordered_set>
#include <vector>

namespace jobguard::job::detail {

namespace {

constexpr std::size_t kMaxGroups = std::size_t{1} << 16;

// The guardian's list. Only the forked child writes it (its copy-on-write
// copy): after a fork of a multi-threaded process the child may not allocate,
// so the room is reserved here, untouched (and so unbacked) in the parent.
pid_t g_listed[kMaxGroups];

// The guardian: raw system calls only (the child of a multi-threaded fork may
// call nothing that takes a lock another thread might have held). Messages
// are int32s, one or more per datagram: +pgid lists a group, -pgid unlists it.
[[noreturn]] void guardian_main(int fd) {
  std::size_t n = 0;
  for (;;) {
    std::int32_t msg[1024];
    const long r = ::syscall(SYS_read, fd, msg, sizeof msg);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;  // EOF: our owner is gone (or closed us on purpose)
    for (long i = 0; i < r / static_cast<long>(sizeof(std::int32_t)); ++i) {
      const std::int32_t v = msg[i];
      if (v > 0) {
        if (n < kMaxGroups) g_listed[n++] = v;
      } else if (v < 0) {
        for (std::size_t j = 0; j < n; ++j) {
          if (g_listed[j] == -v) {
            g_listed[j] = g_listed[--n];
            break;
          }
        }
      }
    }
  }
  for (std::size_t j = 0; j < n; ++j) ::syscall(SYS_kill, -static_cast<long>(g_listed[j]), SIGKILL);
  ::syscall(SYS_exit_group, 0);
  for (;;) {
  }
}

struct State {
  std::mutex m;
  int fd = -1;         // our end; only this process holds it (close-on-exec)
  pid_t child = -1;    // the guardian
  pid_t owner = -1;    // the process that started it: a fork of ours needs its own
  std::unordered_set<pid_t> live;
};

// Set on the thread that forks the guardian, which holds the lock already.
thread_local bool t_forking_guardian = false;

State& state() {
  // Never destroyed: a Process may end during static destruction.
  static State* s = [] {
    auto* st = new State;
    // A fork (anyone's) while another thread holds the lock would leave the
    // child's copy locked for ever: hold it across every fork.
    ::pthread_atfork([] { if (!t_forking_guardian) state().m.lock(); },
                     [] { if (!t_forking_guardian) state().m.unlock(); },
                     [] { if (!t_forking_guardian) state().m.unlock(); });
    return st;
  }();
  return *s;
}

bool send_all(int fd, const std::int32_t* v, std::size_t n) {
  while (n > 0) {
    const std::size_t chunk = n < 1024 ? n : 1024;
    ssize_t r;
    do r = ::send(fd, v, chunk * sizeof *v, MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    if (r != static_cast<ssize_t>(chunk * sizeof *v)) return false;
    v += chunk;
    n -= chunk;
  }
  return true;
}

// Ends the guardian we have, if any. It is killed before its end closes: at
// EOF it would kill every group it lists, and those are still running.
void drop_guardian(State& s) {
  if (s.child > 0) {
    ::kill(s.child, SIGKILL);
    int st = 0;
    while (::waitpid(s.child, &st, 0) < 0 && errno == EINTR) {
    }
  }
  if (s.fd >= 0) ::close(s.fd);
  s.fd = -1;
  s.child = -1;
}

void start_guardian(State& s) {
  drop_guardian(s);
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    throw std::system_error(errno, std::generic_category(), "starting the process-group guardian (socketpair)");
  // Every signal blocked across the fork: the child must never run one of our
  // handlers (Asio's would write to our own signal pipe), and it keeps the
  // mask, so nothing but SIGKILL and SIGSTOP ever reaches it.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  t_forking_guardian = true;
  const pid_t c = ::fork();
  if (c == 0) {
    // Its own session: a signal to our process group (a ^C, a `kill -- -pgid`
    // by a service manager) must leave it alive to see our end close.
    ::setsid();
    int fd = sv[1];
    if (fd != 3) fd = ::dup2(sv[1], 3);
    const int null = ::open("/dev/null", O_RDWR);
    for (int i = 0; i < 3; ++i)
      if (null >= 0 && null != i) ::dup2(null, i);
    // Holding no descriptor of ours: a pipe of a CMD's output kept open here
    // would hold off its reader's EOF, a socket would keep a peer's
    // connection half alive.
    if (::syscall(SYS_close_range, 4U, ~0U, 0U) != 0)
      for (int i = 4; i < 65536; ++i) ::close(i);
    guardian_main(fd < 0 ? sv[1] : fd);
  }
  const int fork_errno = errno;
  t_forking_guardian = false;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ::close(sv[1]);
  if (c < 0) {
    ::close(sv[0]);
    throw std::system_error(fork_errno, std::generic_category(), "starting the process-group guardian (fork)");
  }
  s.fd = sv[0];
  s.child = c;
  s.owner = ::getpid();
  std::vector<std::int32_t> all_live(s.live.begin(), s.live.end());
  if (!send_all(s.fd, all_live.data(), all_live.size())) {
    const int e = errno;
    drop_guardian(s);
    throw std::system_error(e, std::generic_category(), "starting the process-group guardian (send)");
  }
}

// A fork of this process inherits our state but not our guardian's duty: the
// guardian must see EOF when *its* owner dies, so the child lets go of it.
void adopt(State& s) {
  const pid_t me = ::getpid();
  if (s.owner == me) return;
  if (s.fd >= 0) ::close(s.fd);
  s.fd = -1;
  s.child = -1;
  s.live.clear();
  s.owner = me;
}

}  // namespace

void guard_group(pid_t pgid) {
  auto& s = state();
  std::lock_guard lock(s.m);
  adopt(s);
  if (s.live.size() >= kMaxGroups)
    throw std::system_error(EAGAIN, std::generic_category(), "too many commands supervised at once");
  s.live.insert(pgid);
  const auto v = static_cast<std::int32_t>(pgid);
  if (s.fd >= 0 && send_all(s.fd, &v, 1)) return;
  try {
    start_guardian(s);  // lists every live group, this one included
  } catch (...) {
    s.live.erase(pgid);
    throw;
  }
}

void ensure_guardian() {
  auto& s = state();
  std::lock_guard lock(s.m);
  adopt(s);
  if (s.fd < 0) start_guardian(s);
}

void unguard_group(pid_t pgid) noexcept {
  auto& s = state();
  std::lock_guard lock(s.m);
  adopt(s);
  if (s.live.erase(pgid) == 0) return;
  const auto v = -static_cast<std::int32_t>(pgid);
  // A failed send means the guardian is gone, and with it its list; the next
  // guard_group starts another with only the live groups.
  if (s.fd >= 0 && !send_all(s.fd, &v, 1)) drop_guardian(s);
}

pid_t guardian_pid() noexcept {
  auto& s = state();
  std::lock_guard lock(s.m);
  return s.owner == ::getpid() ? s.child : -1;
}

}  // namespace jobguard::job::detail
