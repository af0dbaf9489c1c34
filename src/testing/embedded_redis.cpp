#include <arpa/inet.h>
#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "jobguard/testing/embedded_redis.hpp"
#include "jobguard/error.hpp"
#include "testing/spawn.hpp"

namespace jobguard {
using testing_detail::on_spawner_thread;

std::uint16_t pick_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error(errc::invalid_argument, fmt::format("socket(): {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error(errc::invalid_argument, fmt::format("cannot pick a free port: {}", std::strerror(e)));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

EmbeddedRedis::EmbeddedRedis(EmbeddedRedisOptions options) : opts_(std::move(options)) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "jobguard-redis-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr)
    throw Error(errc::invalid_argument, fmt::format("mkdtemp {}: {}", tmpl, std::strerror(errno)));
  dir_ = tmpl;
}

EmbeddedRedis::~EmbeddedRedis() {
  if (pid_ > 0) {
    ::kill(pid_, SIGCONT);  // a paused server cannot act on SIGKILL's cleanup otherwise
    kill();
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string EmbeddedRedis::url() const {
  if (!opts_.tls_cert_file.empty())
    return fmt::format("rediss://{}:{}/0?ca={}", host_, tls_port_, opts_.tls_ca_file);
  return fmt::format("redis://{}:{}/0", host_, port_);
}

void EmbeddedRedis::spawn() {
  std::vector<std::string> args = {opts_.server_binary};
  if (!opts_.config_text.empty()) {
    const std::string conf = dir_ + "/redis.conf";
    // Rewritten on every start: a sentinel rewrites its file as it learns,
    // and a restart starts over from what the owner asked for.
    std::FILE* f = std::fopen(conf.c_str(), "w");
    if (f == nullptr) throw Error(errc::invalid_argument, fmt::format("cannot write {}: {}", conf, std::strerror(errno)));
    std::fwrite(opts_.config_text.data(), 1, opts_.config_text.size(), f);
    std::fclose(f);
    args.push_back(conf);
  }
  args.insert(args.end(), {"--bind", host_,
                                   "--port", std::to_string(port_),
                                   "--dir", dir_,
                                   "--logfile", dir_ + "/redis.log",
                                   "--protected-mode", "no",
                                   "--daemonize", "no"});
  if (!opts_.persistence) args.insert(args.end(), {"--save", "", "--appendonly", "no"});
  if (!opts_.tls_cert_file.empty()) {
    args.insert(args.end(), {"--tls-port", std::to_string(tls_port_), "--tls-cert-file", opts_.tls_cert_file,
                             "--tls-key-file", opts_.tls_key_file, "--tls-ca-cert-file", opts_.tls_ca_file,
                             "--tls-auth-clients", "no"});
  }
  args.insert(args.end(), opts_.extra_args.begin(), opts_.extra_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Built before fork: the child of a threaded parent may not allocate.
  std::vector<std::string> env_strings;
  std::vector<char*> envp;
  if (!opts_.env.empty()) {
    for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
    env_strings.insert(env_strings.end(), opts_.env.begin(), opts_.env.end());
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
  }

  const pid_t parent = ::getpid();
  int fork_errno = 0;
  const pid_t pid = on_spawner_thread([&] {
    const pid_t p = ::fork();
    if (p == 0) {
      // Child: die with the parent so a crashed test leaves no server behind.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::setpgid(0, 0);  // a Ctrl-C aimed at the CLI must not reach the server first
      ::close_range(3, ~0U, 0);
      if (envp.empty()) ::execvp(argv[0], argv.data());
      else ::execvpe(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    if (p < 0) fork_errno = errno;
    return p;
  });
  if (pid < 0) throw Error(errc::invalid_argument, fmt::format("fork: {}", std::strerror(fork_errno)));
  pid_ = pid;
}

bool EmbeddedRedis::wait_ready(std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {  // exited: port taken, bad args...
      pid_ = -1;
      return false;
    }
    timeval tv{0, 200000};
    redisContext* c = redisConnectWithTimeout(host_.c_str(), port_, tv);
    if (c != nullptr && c->err == 0) {
      redisSetTimeout(c, tv);
      // A server started with --requirepass answers INFO with NOAUTH only.
      for (std::size_t i = 0; i + 1 < opts_.extra_args.size(); ++i) {
        if (opts_.extra_args[i] != "--requirepass") continue;
        const std::string& pw = opts_.extra_args[i + 1];
        auto* a = static_cast<redisReply*>(redisCommand(c, "AUTH %b", pw.data(), pw.size()));
        if (a != nullptr) freeReplyObject(a);
      }
      auto* r = static_cast<redisReply*>(redisCommand(c, "INFO server"));
      bool ours = false;
      if (r != nullptr && r->type == REDIS_REPLY_STRING) {
        // Another test's server may own this port: only our child's pid counts.
        const std::string info(r->str, r->len);
        ours = info.find(fmt::format("process_id:{}\r", pid_)) != std::string::npos;
      }
      if (r != nullptr) freeReplyObject(r);
      redisFree(c);
      if (ours) return true;
    } else if (c != nullptr) {
      redisFree(c);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

void EmbeddedRedis::start() {
  if (pid_ > 0) return;
  const bool fixed = opts_.port != 0 || port_ != 0;
  for (int attempt = 0; attempt < 8; ++attempt) {
    if (!fixed) {
      port_ = pick_free_port();
      if (!opts_.tls_cert_file.empty()) tls_port_ = pick_free_port();
    } else if (port_ == 0) {
      port_ = opts_.port;
      if (!opts_.tls_cert_file.empty() && tls_port_ == 0) tls_port_ = pick_free_port();
    }
    spawn();
    if (wait_ready(opts_.start_timeout)) return;
    if (pid_ > 0) kill();
    // A fixed port (restart) may still be in TIME_WAIT or held by a dying server.
    if (fixed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw Error(errc::not_connected,
              fmt::format("redis-server did not start on {}:{} (see {}/redis.log)", host_, port_, dir_));
}

void EmbeddedRedis::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGCONT);
  ::kill(pid_, SIGTERM);
  for (int i = 0; i < 500; ++i) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill();
}

void EmbeddedRedis::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

void EmbeddedRedis::restart() {
  stop();
  start();
}

void EmbeddedRedis::pause() {
  if (pid_ > 0) ::kill(pid_, SIGSTOP);
}

void EmbeddedRedis::resume() {
  if (pid_ > 0) ::kill(pid_, SIGCONT);
}

}  // namespace jobguard
