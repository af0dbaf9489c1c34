// with_redis [--untrusted] [--runs N] PROGRAM [ARGS...]
// Starts a private redis-server (jobguard::testing's EmbeddedRedis), runs
// PROGRAM N times (default 1) with JOBGUARD_REDIS_URL naming it, and exits
// with the first non-zero status (128+N for a signal), else 0. The server is
// trusted as new first (trust_new_server) unless --untrusted: then it is as
// a user meets a Redis just provisioned, and PROGRAM takes the documented
// steps itself (`jobguard server trust`).
#include <jobguard/lock.hpp>
#include <jobguard/redis/client.hpp>
#include <jobguard/testing/embedded_redis.hpp>
#include <spawn.h>
#include <sys/wait.h>

#include <cstdlib>
#include <iostream>
#include <string>

extern char** environ;

int main(int argc, char** argv) {
  int runs = 1, first = 1;
  bool trusted = true;
  if (argc > first && std::string(argv[first]) == "--untrusted") {
    trusted = false;
    ++first;
  }
  if (argc > first + 2 && std::string(argv[first]) == "--runs") {
    runs = std::stoi(argv[first + 1]);
    first += 2;
  }
  if (first >= argc) {
    std::cerr << "usage: with_redis [--untrusted] [--runs N] PROGRAM [ARGS...]\n";
    return 64;
  }
  jobguard::EmbeddedRedis server;
  server.start();
  if (trusted) {
    // A server this harness just started empty: trusted, so its first grants
    // are not held back by the lock-state quarantine (docs/lock-safety.md).
    jobguard::redis::Client client(jobguard::redis::parse_url(server.url()));
    jobguard::trust_new_server(client);
  }
  ::setenv("JOBGUARD_REDIS_URL", server.url().c_str(), 1);
  for (int i = 0; i < runs; ++i) {
    pid_t pid = 0;
    if (int rc = ::posix_spawn(&pid, argv[first], nullptr, nullptr, argv + first, environ); rc != 0) {
      std::cerr << "with_redis: cannot run " << argv[first] << ": error " << rc << "\n";
      return 127;
    }
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid) return 70;
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    if (WEXITSTATUS(status) != 0) return WEXITSTATUS(status);
  }
  return 0;
}
