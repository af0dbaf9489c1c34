#include "jobguard/testing/embedded_postgres.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/testing/embedded_redis.hpp"
#include "testing/spawn.hpp"

namespace jobguard {
namespace detail {
// What EmbeddedPostgres::abandon() stops from another thread.
struct PgChildren {
  std::mutex mu;
  bool abandoned = false;
  pid_t tool = -1;  // initdb or cp, while make_cluster() runs it
};
}  // namespace detail

namespace {

using testing_detail::on_spawner_thread;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Who the server and its tools run as: ourselves, or `postgres` when we are
// root (PostgreSQL refuses to run as root).
struct RunAs {
  bool drop = false;
  uid_t uid = 0;
  gid_t gid = 0;
};

RunAs run_as() {
  RunAs r;
  if (::geteuid() != 0) return r;
  const passwd* pw = ::getpwnam("postgres");
  if (pw == nullptr)
    throw Error(errc::invalid_argument, "running as root and there is no `postgres` user to run PostgreSQL as");
  r.drop = true;
  r.uid = pw->pw_uid;
  r.gid = pw->pw_gid;
  return r;
}

// Forks argv as `who`, its stdout and stderr appended to `log`, in its own
// process group (a Ctrl-C aimed at the CLI must not reach the server before
// the CLI decides how to stop it), killed when this process dies.
pid_t spawn_as(const RunAs& who, std::vector<std::string> args, const std::string& log, const std::string& cwd) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  int fork_errno = 0;
  const pid_t pid = on_spawner_thread([&] {
    const pid_t p = ::fork();
    if (p == 0) {
      // Only async-signal-safe calls from here: the parent has other threads.
      ::setpgid(0, 0);
      if (who.drop) {
        if (::setgroups(1, &who.gid) != 0 || ::setgid(who.gid) != 0 || ::setuid(who.uid) != 0) ::_exit(126);
      }
      // After the credentials change, which clears the parent-death signal.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
      if (fd < 0) ::_exit(125);
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      const int null = ::open("/dev/null", O_RDONLY);
      if (null >= 0) ::dup2(null, STDIN_FILENO);
      ::close_range(3, ~0U, 0);
      if (::chdir(cwd.c_str()) != 0) ::_exit(124);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    if (p < 0) fork_errno = errno;
    return p;
  });
  if (pid < 0) throw Error(errc::invalid_argument, fmt::format("fork: {}", std::strerror(fork_errno)));
  return pid;
}

// Runs a tool to completion; throws with its output when it fails. With
// `children`, it is started only if they are not abandoned, and its pid (its
// process group's: spawn_as) is there while it runs, for
// EmbeddedPostgres::abandon() on another thread.
void run_tool(const RunAs& who, const std::vector<std::string>& args, const std::string& log, const std::string& cwd,
              const char* what, detail::PgChildren* children = nullptr) {
  pid_t pid = -1;
  if (children != nullptr) {
    std::lock_guard<std::mutex> g(children->mu);
    if (children->abandoned) throw Error(errc::postgres_unavailable, fmt::format("{}: abandoned", what));
    pid = children->tool = spawn_as(who, args, log, cwd);
  } else {
    pid = spawn_as(who, args, log, cwd);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (children != nullptr) {
    std::lock_guard<std::mutex> g(children->mu);
    children->tool = -1;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  throw Error(errc::invalid_argument, fmt::format("{} failed (exit {}{}): {}", what, code,
                                                  code == 127 ? ", not found?" : "", slurp(log)));
}

// Whether a process of group `pgid` is still alive: a zombie is not (it
// writes nothing, and its reaper may be an init that never reaps).
bool group_alive(pid_t pgid) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string stat = slurp(e.path().string() + "/stat");
    // "pid (comm) S ppid pgrp ...": comm may hold anything but the last ')'.
    const auto close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size()) continue;
    std::istringstream in(stat.substr(close + 2));
    char state = 0;
    long ppid = 0, pgrp = 0;
    if (!(in >> state >> ppid >> pgrp)) continue;
    if (pgrp == pgid && state != 'Z' && state != 'X') return true;
  }
  return false;
}

void hand_to(const RunAs& who, const std::string& path) {
  if (who.drop && ::chown(path.c_str(), who.uid, who.gid) != 0)
    throw Error(errc::invalid_argument, fmt::format("chown {}: {}", path, std::strerror(errno)));
}

}  // namespace

EmbeddedPostgres::EmbeddedPostgres(EmbeddedPostgresOptions options)
    : opts_(std::move(options)), children_(std::make_unique<detail::PgChildren>()) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "jobguard-pg-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr)
    throw Error(errc::invalid_argument, fmt::format("mkdtemp {}: {}", tmpl, std::strerror(errno)));
  dir_ = tmpl;
  try {
    hand_to(run_as(), dir_);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    throw;
  }
}

EmbeddedPostgres::~EmbeddedPostgres() {
  stop_immediate();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string EmbeddedPostgres::url() const { return fmt::format("postgresql://postgres@127.0.0.1:{}/postgres", port_); }

void EmbeddedPostgres::initdb(const std::string& data_dir, const EmbeddedPostgresOptions& options) {
  initdb_into(data_dir, options, nullptr);
}

void EmbeddedPostgres::initdb_into(const std::string& data_dir, const EmbeddedPostgresOptions& options,
                                   detail::PgChildren* children) {
  const RunAs who = run_as();
  const std::filesystem::path parent = std::filesystem::path(data_dir).parent_path();
  const std::string log = data_dir + ".initdb.log";
  run_tool(who,
           {options.bin_dir + "/initdb", "-D", data_dir, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8",
            "--locale=C"},
           log, parent.string(), "initdb", children);
  std::error_code ec;
  std::filesystem::remove(log, ec);
}

void EmbeddedPostgres::make_cluster() {
  if (std::filesystem::exists(data_dir() + "/PG_VERSION")) return;
  if (::access((opts_.bin_dir + "/postgres").c_str(), X_OK) != 0)
    throw Error(errc::postgres_unavailable,
                fmt::format("no PostgreSQL server in {} (Debian: postgresql-15)", opts_.bin_dir));
  if (opts_.template_data_dir.empty()) {
    initdb_into(data_dir(), opts_, children_.get());
  } else {
    run_tool(run_as(), {"/bin/cp", "-a", opts_.template_data_dir, data_dir()}, dir_ + "/copy.log", dir_,
             "copying the template cluster", children_.get());
  }
}

void EmbeddedPostgres::spawn() {
  std::vector<std::string> args = {opts_.bin_dir + "/postgres", "-D", data_dir(), "-p", std::to_string(port_),
                                   "-k", dir_, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                                   "-c", "full_page_writes=off"};
  for (const auto& s : opts_.settings) args.insert(args.end(), {"-c", s});
  std::lock_guard<std::mutex> g(children_->mu);
  if (children_->abandoned) throw Error(errc::postgres_unavailable, fmt::format("postgres in {}: abandoned", dir_));
  pid_ = spawn_as(run_as(), std::move(args), dir_ + "/server.log", dir_);
}

bool EmbeddedPostgres::wait_ready(std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  const std::string pidfile = data_dir() + "/postmaster.pid";
  while (std::chrono::steady_clock::now() < until) {
    int status = 0;
    const pid_t pid = pid_.load();
    if (pid <= 0) return false;  // stopped by another thread (stop_immediate)
    if (::waitpid(pid, &status, WNOHANG) == pid) {  // exited: port taken, bad settings...
      pid_ = -1;
      return false;
    }
    // What pg_ctl -w reads: line 1 the postmaster's pid (a server left over
    // from elsewhere cannot fool us), line 8 its status.
    std::ifstream in(pidfile);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    if (lines.size() >= 8 && lines[0] == std::to_string(pid) && lines[7].rfind("ready", 0) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

void EmbeddedPostgres::start() {
  if (pid_ > 0) return;
  make_cluster();
  // A port picked free can be taken by someone else before the server binds it.
  for (int attempt = 0; attempt < 5; ++attempt) {
    port_ = pick_free_port();
    spawn();
    if (wait_ready(opts_.start_timeout)) return;
    if (pid_ > 0) signal_and_reap(SIGKILL);
  }
  throw Error(errc::postgres_unavailable,
              fmt::format("postgres did not start on 127.0.0.1:{}: {}", port_, slurp(dir_ + "/server.log")));
}

void EmbeddedPostgres::signal_and_reap(int sig) {
  const pid_t pid = pid_.load();
  if (pid <= 0) return;
  ::kill(pid, sig);
  int status = 0;
  if (sig != SIGKILL) {
    for (int i = 0; i < 3000; ++i) {
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      // ECHILD: reaped by the other thread (start()'s wait_ready) meanwhile.
      if (r == pid || (r < 0 && errno == ECHILD)) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid, SIGKILL);
  }
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

void EmbeddedPostgres::abandon() {
  pid_t tool = -1;
  {
    // After this, nothing is started (spawn(), run_tool check under the same
    // lock), and what was started has published its pid.
    std::lock_guard<std::mutex> g(children_->mu);
    children_->abandoned = true;
    tool = children_->tool;
  }
  if (tool > 0) {
    // initdb runs postgres itself (bootstrap, then single-user mode), in its
    // process group: the whole group goes, or a backend left behind keeps
    // writing into the directory the caller is about to remove. Reaping it
    // is the waiting thread's (run_tool).
    ::kill(-tool, SIGKILL);
    for (int i = 0; i < 500 && group_alive(tool); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  signal_and_reap(SIGQUIT);
}

void EmbeddedPostgres::stop() { signal_and_reap(SIGINT); }

void EmbeddedPostgres::stop_immediate() { signal_and_reap(SIGQUIT); }

}  // namespace jobguard
