#include "support/postgres_fixture.hpp"

#include <fmt/format.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "jobguard/testing/embedded_postgres.hpp"
#include "jobguard/testing/embedded_redis.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

const char* kBin = "/usr/lib/postgresql/15/bin/";

// PostgreSQL refuses to run as root: as root, run its tools as `postgres`.
std::vector<std::string> as_postgres(std::vector<std::string> argv) {
  if (::geteuid() != 0) return argv;
  std::vector<std::string> out = {"runuser", "-u", "postgres", "--"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

int run_command_or_throw(const std::vector<std::string>& argv, const char* what) {
  std::string log;
  const int rc = run_command(argv, &log);
  if (rc != 0) throw std::runtime_error(fmt::format("{} failed ({}): {}", what, rc, log));
  return rc;
}

// initdb costs a second or more of CPU, and every PostgreSQL test is a
// process of its own (ctest runs each test alone), so each would pay it.
// One cluster is initialised per build tree and copied: a copy of a
// stopped, cleanly initialised data directory is the same cluster, and the
// template itself is never started. Made under a name of this process's own
// and renamed into place, so a parallel test sees the whole template or none.
std::string template_cluster() {
  static const std::string path = [] {
    const std::filesystem::path cache = std::filesystem::path(JOBGUARD_BINARY_DIR) / "test-cache";
    const std::filesystem::path tmpl = cache / "pg15-template";
    if (std::filesystem::exists(tmpl / "PG_VERSION")) return tmpl.string();
    std::filesystem::create_directories(cache);
    if (::geteuid() == 0) {
      const passwd* pw = ::getpwnam("postgres");
      if (pw == nullptr) throw std::runtime_error("no `postgres` user to run the test cluster as");
      if (::chown(cache.c_str(), pw->pw_uid, pw->pw_gid) != 0)
        throw std::runtime_error(fmt::format("chown {}: {}", cache.string(), std::strerror(errno)));
    }
    const std::string mine = fmt::format("{}.{}", tmpl.string(), ::getpid());
    std::error_code ec;
    std::filesystem::remove_all(mine, ec);
    // The same cluster `jobguard demo`'s embedded PostgreSQL makes.
    EmbeddedPostgres::initdb(mine);
    if (::rename(mine.c_str(), tmpl.c_str()) != 0) {
      // Another test process got there first: theirs is as good as ours.
      std::filesystem::remove_all(mine, ec);
      if (!std::filesystem::exists(tmpl / "PG_VERSION"))
        throw std::runtime_error(fmt::format("rename {} -> {}: {}", mine, tmpl.string(), std::strerror(errno)));
    }
    return tmpl.string();
  }();
  return path;
}

}  // namespace

int run_command(const std::vector<std::string>& argv, std::string* out) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  char buf[4096];
  ssize_t n;
  std::string collected;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) collected.append(buf, static_cast<std::size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (out) *out += collected;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

PostgresServer::PostgresServer() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "jobguard-pg-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr)
    throw std::runtime_error(fmt::format("mkdtemp {}: {}", tmpl, std::strerror(errno)));
  dir_ = tmpl;
  if (::geteuid() == 0) {
    // The postgres user must own the cluster; 711 lets it reach the socket dir.
    const passwd* pw = ::getpwnam("postgres");
    if (pw == nullptr) throw std::runtime_error("no `postgres` user to run the test cluster as");
    if (::chown(dir_.c_str(), pw->pw_uid, pw->pw_gid) != 0)
      throw std::runtime_error(fmt::format("chown {}: {}", dir_, std::strerror(errno)));
  }
  ::chmod(dir_.c_str(), 0711);
}

PostgresServer::~PostgresServer() {
  try {
    stop();
  } catch (...) {
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string PostgresServer::url() const {
  return fmt::format("postgresql://postgres@127.0.0.1:{}/postgres", port_);
}

void PostgresServer::start() {
  std::string log;
  if (!std::filesystem::exists(dir_ + "/data/PG_VERSION"))
    run_command_or_throw(as_postgres({"cp", "-a", template_cluster(), dir_ + "/data"}), "copying the template cluster");
  // A port picked free can be taken by a parallel test before we bind it: retry.
  for (int attempt = 0; attempt < 5; ++attempt) {
    port_ = pick_free_port();
    log.clear();
    const std::string opts =
        fmt::format("-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off -c full_page_writes=off", port_, dir_);
    const int rc = run_command(as_postgres({std::string(kBin) + "pg_ctl", "-D", dir_ + "/data", "-l",
                                            dir_ + "/server.log", "-o", opts, "-w", "-t", "30", "start"}),
                               &log);
    if (rc == 0) {
      running_ = true;
      return;
    }
  }
  throw std::runtime_error(fmt::format("pg_ctl start failed: {} {}", log, read_file(dir_ + "/server.log")));
}

void PostgresServer::stop() {
  if (!running_) return;
  running_ = false;
  run_command(as_postgres({std::string(kBin) + "pg_ctl", "-D", dir_ + "/data", "-m", "immediate", "-w", "-t", "30",
                           "stop"}));
}

void PostgresServer::make_standby() {
  if (running_) {
    // A fast (clean) shutdown: recovery from it is consistent at once, so the
    // standby accepts connections without any WAL from a primary.
    std::string log;
    const int rc = run_command(
        as_postgres({std::string(kBin) + "pg_ctl", "-D", dir_ + "/data", "-m", "fast", "-w", "-t", "30", "stop"}), &log);
    if (rc != 0) throw std::runtime_error(fmt::format("pg_ctl stop failed ({}): {}", rc, log));
    running_ = false;
  }
  std::ofstream(dir_ + "/data/standby.signal") << "";
}

PostgresServer& shared_postgres() {
  static std::unique_ptr<PostgresServer> server = [] {
    auto s = std::make_unique<PostgresServer>();
    s->start();
    return s;
  }();
  return *server;
}

void PostgresTest::SetUpTestSuite() { guard::pg_migrate(pg_options()); }

guard::PgOptions PostgresTest::pg_options() {
  guard::PgOptions o;
  o.url = shared_postgres().url();
  o.connect_timeout = std::chrono::seconds(3);
  o.statement_timeout = std::chrono::milliseconds(5000);
  return o;
}

std::string PostgresTest::name(const std::string& suffix) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string raw = fmt::format("t_{}_{}_{}", info->test_suite_name(), info->name(), suffix);
  std::string out;
  for (char c : raw) out.push_back(std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::tolower(c)) : '_');
  // PostgreSQL truncates identifiers at 63 bytes: keep long names distinct.
  if (out.size() > 60) out = fmt::format("{}_{:08x}", out.substr(0, 50), std::hash<std::string>{}(out) & 0xffffffffu);
  return out;
}

}  // namespace jobguard::test
