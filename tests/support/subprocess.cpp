#include "support/subprocess.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace jobguard::test {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Subprocess::Subprocess(std::vector<std::string> argv, std::vector<std::pair<std::string, std::string>> env) {
  char tmpl[] = "/tmp/jobguard-subprocess.XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
  dir_ = tmpl;

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

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, (dir_ + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, (dir_ + "/err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults, empty;
  sigemptyset(&defaults);
  for (int s : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP}) sigaddset(&defaults, s);
  sigemptyset(&empty);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  const int rc = ::posix_spawnp(&pid_, args[0], &fa, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw std::runtime_error("spawn " + argv[0] + ": " + std::strerror(rc));
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !result_) {
    ::kill(pid_, SIGKILL);
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

bool Subprocess::running() { return !wait_for(std::chrono::milliseconds(0)); }

std::optional<SubprocessResult> Subprocess::wait_for(std::chrono::milliseconds timeout) {
  if (result_) return result_;
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      SubprocessResult res;
      res.signaled = WIFSIGNALED(st);
      res.status = res.signaled ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
      res.out = out();
      res.err = err();
      result_ = res;
      return result_;
    }
    if (r < 0 && errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
    if (std::chrono::steady_clock::now() >= until) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

SubprocessResult Subprocess::wait_or_kill(std::chrono::milliseconds timeout) {
  if (auto r = wait_for(timeout)) return *r;
  ::kill(pid_, SIGKILL);
  auto r = wait_for(std::chrono::seconds(10));
  SubprocessResult res = r ? *r : SubprocessResult{};
  res.status = -1;
  res.err += "\n(timed out)";
  return res;
}

void Subprocess::signal(int sig) {
  if (!result_) ::kill(pid_, sig);
}

std::string Subprocess::out() const { return read_file(dir_ + "/out"); }
std::string Subprocess::err() const { return read_file(dir_ + "/err"); }

std::string jobguard_binary() { return std::string(JOBGUARD_BINARY_DIR) + "/apps/jobguard/jobguard"; }

SubprocessResult run_jobguard(const std::vector<std::string>& args, std::chrono::milliseconds timeout,
                              std::vector<std::pair<std::string, std::string>> env) {
  std::vector<std::string> argv{jobguard_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess p(std::move(argv), std::move(env));
  return p.wait_or_kill(timeout);
}

bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  // Still in the process table: a zombie (state Z) waiting for its reaper is gone for our purposes.
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
}

std::vector<std::string> processes_naming(const std::string& needle) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = read_file(e.path().string() + "/cmdline");
    for (char& c : cmd)
      if (c == '\0') c = ' ';
    if (cmd.find(needle) != std::string::npos) found.push_back(name + ": " + cmd);
  }
  return found;
}

}  // namespace jobguard::test
