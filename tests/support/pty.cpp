#include "support/pty.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace jobguard::test {

PtyProcess::PtyProcess(std::vector<std::string> argv, std::vector<std::pair<std::string, std::string>> env) {
  // Built before the fork: the child only execs.
  std::vector<std::string> envs;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry(*e);
    const auto name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& kv : env) replaced = replaced || kv.first == name;
    if (!replaced) envs.emplace_back(entry);
  }
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);

  pid_ = ::forkpty(&master_, nullptr, nullptr, nullptr);
  if (pid_ < 0) throw std::runtime_error(std::string("forkpty: ") + std::strerror(errno));
  if (pid_ == 0) {
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP, SIGTTIN, SIGTTOU, SIGTSTP}) ::signal(s, SIG_DFL);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::fcntl(master_, F_SETFL, ::fcntl(master_, F_GETFL) | O_NONBLOCK);
  ::fcntl(master_, F_SETFD, FD_CLOEXEC);
}

PtyProcess::~PtyProcess() {
  if (pid_ > 0 && !status_) {
    ::kill(-pid_, SIGKILL);  // a session leader: its group id is its pid
    ::kill(pid_, SIGKILL);
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
  if (master_ >= 0) ::close(master_);
}

void PtyProcess::write(std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(master_, text.data(), text.size());
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    if (n < 0) throw std::runtime_error(std::string("write to pty: ") + std::strerror(errno));
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

void PtyProcess::drain() {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(master_, buf, sizeof buf);
    if (n > 0) {
      screen_.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return;  // EAGAIN: nothing more now; EIO: every slave side is closed
  }
}

const std::string& PtyProcess::screen() {
  drain();
  return screen_;
}

std::optional<int> PtyProcess::wait_for(std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!status_) {
    drain();  // a child blocked on a full terminal would never exit
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
      break;
    }
    if (std::chrono::steady_clock::now() >= until) return std::nullopt;
    pollfd p{master_, POLLIN, 0};
    ::poll(&p, 1, 5);
  }
  drain();
  return status_;
}

}  // namespace jobguard::test
