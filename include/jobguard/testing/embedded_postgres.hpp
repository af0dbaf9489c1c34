// A private PostgreSQL server: a fresh cluster (initdb, or a copy of a
// template cluster) in its own temporary directory, the postmaster a child
// process on a free loopback port, stopped and its directory removed when this
// object dies. A test fixture like EmbeddedRedis, in the `jobguard::testing`
// target: jobguard's own tests use it, and `jobguard demo` for its completion
// records when no --postgres URL is given.
//
// Trust authentication, user `postgres`, fsync off: a throwaway server for
// tests and demos, never for data that must survive.
//
// PostgreSQL refuses to run as root: as root, initdb and the server run as
// the `postgres` user (which must exist; Debian's postgresql package makes
// it), and the temporary directory is handed to that user.
//
// Threads: not thread-safe; one owner. The postmaster is started directly
// (not through pg_ctl, which would detach it) with a parent-death signal, so
// it dies with the owning process even when that process is killed; its
// backends notice the postmaster's death and leave too.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace jobguard {
namespace detail {
struct PgChildren;  // what abandon() stops from another thread (the source's)
}  // namespace detail

struct EmbeddedPostgresOptions {
  // Where initdb and postgres live (Debian: postgresql-15).
  std::string bin_dir = "/usr/lib/postgresql/15/bin";
  // When set: an initdb'd, stopped cluster copied instead of running initdb
  // (initdb costs a second or more of CPU; tests that each start a server
  // make one template and copy it). Empty: initdb into the temporary directory.
  std::string template_data_dir{};
  // How long start() waits for the server to accept connections. Default 30 s.
  std::chrono::milliseconds start_timeout{30000};
  // Extra `-c name=value` settings, after the defaults (which they override).
  std::vector<std::string> settings{};
};

class EmbeddedPostgres {
 public:
  // Creates the temporary directory; start() makes the cluster and runs it.
  explicit EmbeddedPostgres(EmbeddedPostgresOptions options = {});
  ~EmbeddedPostgres();
  EmbeddedPostgres(const EmbeddedPostgres&) = delete;
  EmbeddedPostgres& operator=(const EmbeddedPostgres&) = delete;

  // Makes the cluster on first use (initdb or the template's copy), starts
  // the postmaster and waits until *this* server is ready (its postmaster.pid
  // names our child and says "ready"). Picks another port when the chosen one
  // was taken meanwhile; every start() picks a new free port().
  // Throws jobguard::Error (errc::postgres_unavailable,
  // with the server's log) when the binaries are missing or it cannot start.
  void start();
  // Fast shutdown (SIGINT: sessions end, a checkpoint is written), SIGKILL
  // after 30 s; reaps the child. The cluster stays for the next start().
  void stop();
  // Immediate shutdown (SIGQUIT: no checkpoint, crash recovery on the next
  // start), SIGKILL after 30 s. No-op when not running.
  void stop_immediate();
  // For a thread that must stop everything while another may be in start()
  // (a signal's, before it removes dir() and exits): kills an initdb or a
  // template's copy still running, with every process it started, stops
  // the server as stop_immediate() does, and makes start() fail from then
  // on, so nothing runs in dir() any more when this returns.
  void abandon();

  bool running() const noexcept { return pid_ > 0; }
  pid_t pid() const noexcept { return pid_; }
  std::uint16_t port() const noexcept { return port_; }
  // The temporary directory (removed by the destructor).
  const std::string& dir() const noexcept { return dir_; }
  // The cluster: dir()/data.
  std::string data_dir() const { return dir_ + "/data"; }
  // postgresql://postgres@127.0.0.1:PORT/postgres
  std::string url() const;

  // Runs initdb into `data_dir` (which must not exist yet, or be empty) as
  // start() does; for making a template cluster. As root it runs as
  // `postgres`, and the parent of `data_dir` must be writable by that user.
  // Throws jobguard::Error with initdb's output when it fails.
  static void initdb(const std::string& data_dir, const EmbeddedPostgresOptions& options = {});

 private:
  static void initdb_into(const std::string& data_dir, const EmbeddedPostgresOptions& options,
                          detail::PgChildren* children);
  void make_cluster();
  void spawn();
  bool wait_ready(std::chrono::milliseconds timeout);
  void signal_and_reap(int sig);

  EmbeddedPostgresOptions opts_;
  std::string dir_;
  std::uint16_t port_ = 0;
  std::atomic<pid_t> pid_{-1};  // atomic: abandon() reads it from another thread
  std::unique_ptr<detail::PgChildren> children_;
};

}  // namespace jobguard
