// A private redis-server: a child process on a free loopback port, in its own
// temporary directory, stopped when this object dies. A test fixture, not part
// of the library proper: it lives in the `jobguard::testing` target (link it
// from your tests to start a throwaway server; redis-server must be on PATH).
// jobguard's own tests use it, and the CLI when asked for an "embedded" Redis
// (`jobguard demo`, `jobguard bench --embedded`).
//
// Threads: not thread-safe; one owner. The child is killed (SIGKILL) and
// reaped in the destructor, so nothing outlives the owner.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace jobguard {

struct EmbeddedRedisOptions {
  std::string server_binary = "redis-server";  // looked up on PATH
  // Extra `--name value` arguments (e.g. {"--requirepass", "s3cret"}).
  std::vector<std::string> extra_args{};
  // Persistence is off by default (`--save "" --appendonly no`): tests that
  // need a restart to lose data rely on it.
  bool persistence = false;
  // TLS: when cert/key/ca are set the server also listens with --tls-port on
  // a second free port, and url() names that one.
  std::string tls_cert_file{}, tls_key_file{}, tls_ca_file{};
  // How long start() waits for the server to answer. Default 10 s.
  std::chrono::milliseconds start_timeout{10000};
  // Use this port instead of picking a free one (0 = pick).
  std::uint16_t port = 0;
  // When set, written to <dir>/redis.conf and passed as the first argument
  // (before the command-line options, which override it). redis-sentinel
  // needs a config file it can rewrite: `sentinel monitor ...` here and
  // "--sentinel" in extra_args.
  std::string config_text{};
  // Added to the server's environment ("NAME=value"), e.g. an LD_PRELOAD
  // shim a fault test moves the server's clock with. Also on restart().
  std::vector<std::string> env{};
};

class EmbeddedRedis {
 public:
  explicit EmbeddedRedis(EmbeddedRedisOptions options = {});
  ~EmbeddedRedis();
  EmbeddedRedis(const EmbeddedRedis&) = delete;
  EmbeddedRedis& operator=(const EmbeddedRedis&) = delete;

  // Starts the server and waits until *this* server answers (INFO server shows
  // our child's pid: a parallel test racing for the port cannot fool us).
  // Throws jobguard::Error when it cannot.
  void start();
  // SIGTERM, then SIGKILL after 5 s; reaps the child. No-op when not running.
  void stop();
  // SIGKILL without a chance to save: the "crash" fault.
  void kill();
  // Stops and starts again on the same port; data is lost unless persistence.
  void restart();
  void pause();   // SIGSTOP
  void resume();  // SIGCONT

  bool running() const noexcept { return pid_ > 0; }
  pid_t pid() const noexcept { return pid_; }
  // The plain port (always open: readiness checks and admin use it).
  std::uint16_t port() const noexcept { return port_; }
  // The TLS port when TLS is configured, else 0.
  std::uint16_t tls_port() const noexcept { return tls_port_; }
  const std::string& host() const noexcept { return host_; }
  const std::string& dir() const noexcept { return dir_; }
  // redis://127.0.0.1:PORT/0 (rediss:// with ?ca=... when TLS).
  std::string url() const;

 private:
  void spawn();
  bool wait_ready(std::chrono::milliseconds timeout);

  EmbeddedRedisOptions opts_;
  std::string host_ = "127.0.0.1";
  std::string dir_;
  std::uint16_t port_ = 0;
  std::uint16_t tls_port_ = 0;
  pid_t pid_ = -1;
};

// A free TCP port on 127.0.0.1 at the time of the call (bind to 0, read, close).
std::uint16_t pick_free_port();

}  // namespace jobguard
