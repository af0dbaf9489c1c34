// jobguard's locks shared with the lock helpers of two other stacks, each as
// its users run it: Laravel's Cache::lock (Illuminate RedisLock over php-redis)
// and redis-py's redis.lock.Lock, in real PHP and Python processes
// (tests/interop/peer_laravel.php, peer_redis_py.py), against a private
// redis-server, beside the library (LockService, LeaseScheduler in this
// process) and `jobguard run` (the real binary). docs/interop.md is what these
// tests back: the key each side uses, owner-safe release both ways, renewal.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "support/cli_fixture.hpp"
#include "support/critical_section.hpp"
#include "support/subprocess.hpp"

extern char** environ;

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;
using Clock = std::chrono::steady_clock;

const std::string kScripts = std::string(JOBGUARD_SOURCE_DIR) + "/tests/interop/";

// A peer in `serve` mode: one request per line on its stdin, one answer line
// on its stdout, over pipes. Closing its stdin ends it; the destructor kills
// what did not end within a second, so a failing test leaves no peer behind.
// Threads: one owner.
class Peer {
 public:
  Peer(std::string name, Args argv) : name_(std::move(name)) {
    // A peer that died makes the next request's write fail with EPIPE; the
    // default SIGPIPE would kill the whole test binary instead.
    ::signal(SIGPIPE, SIG_IGN);
    int in[2], out[2];
    // CLOEXEC: other threads of this test spawn `jobguard run` meanwhile, and
    // a copy of the write end in one of them would keep the peer from EOF.
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    char tmpl[] = "/tmp/jobguard-peer.XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp");
    dir_ = tmpl;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, (dir_ + "/err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const int rc = ::posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    in_ = in[1];
    out_ = out[0];
    if (rc != 0) throw std::runtime_error(fmt::format("spawn {}: {}", argv[0], std::strerror(rc)));
  }
  ~Peer() {
    ::close(in_);
    int st = 0;
    const auto until = Clock::now() + 1s;
    while (::waitpid(pid_, &st, WNOHANG) == 0) {
      if (Clock::now() > until) {
        ::kill(pid_, SIGKILL);
        while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
        }
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    ::close(out_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  void send(const std::string& request) {
    const std::string line = request + "\n";
    if (::write(in_, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
      ADD_FAILURE() << name_ << ": cannot send '" << request << "': " << std::strerror(errno) << "; stderr: " << err();
  }
  // The next answer line; nullopt when none came within `timeout`.
  std::optional<std::string> answer(std::chrono::milliseconds timeout) {
    const auto until = Clock::now() + timeout;
    for (;;) {
      if (const auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      pollfd p{out_, POLLIN, 0};
      const int n = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(0, left.count())));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return std::nullopt;
      char chunk[512];
      const ssize_t got = ::read(out_, chunk, sizeof chunk);
      if (got <= 0) return std::nullopt;  // EOF: the peer died (its stderr says why)
      buf_.append(chunk, static_cast<std::size_t>(got));
    }
  }
  std::string ask(const std::string& request, std::chrono::milliseconds timeout = 10s) {
    send(request);
    auto a = answer(timeout);
    if (!a) {
      ADD_FAILURE() << name_ << ": no answer to '" << request << "'; stderr: " << err();
      return "(no answer)";
    }
    return *a;
  }
  std::string err() const { return read_file(dir_ + "/err"); }
  const std::string& name() const { return name_; }

 private:
  std::string name_, dir_;
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  std::string buf_;
};

// The shared log of critical sections: "enter ID key=K" and "exit ID
// holder=ok|mismatch:..." lines appended with O_APPEND by every holder, so
// file order is the order they happened in. Returns one line per violation:
// an enter while someone is inside, an exit by a non-holder, a holder that did
// not find its own token in the key, a key other than `key`, a kind (the ID
// before '-') that never got in, a count other than `pairs`.
std::vector<std::string> check_log(const std::string& text, const std::string& key,
                                   const std::vector<std::string>& kinds, int pairs) {
  std::vector<std::string> problems;
  std::map<std::string, int> seen;
  std::optional<std::pair<std::string, int>> holder;
  int count = 0, n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    ++n;
    std::istringstream words(line);
    std::string ev, id, attr;
    words >> ev >> id >> attr;
    if (ev == "enter") {
      if (holder) problems.push_back(fmt::format("line {}: {} entered while {} (line {}) was inside", n, id, holder->first, holder->second));
      holder = std::make_pair(id, n);
      if (attr != "key=" + key) problems.push_back(fmt::format("line {}: {} used {}, expected key={}", n, id, attr, key));
      ++seen[id.substr(0, id.find('-'))];
      ++count;
    } else if (ev == "exit") {
      if (!holder || holder->first != id) problems.push_back(fmt::format("line {}: exit of {} but {} held it", n, id, holder ? holder->first : "nobody"));
      holder.reset();
      if (attr != "holder=ok") problems.push_back(fmt::format("line {}: {} did not find its own token in the key ({})", n, id, attr));
    } else {
      problems.push_back(fmt::format("line {}: unreadable: {}", n, line));
    }
  }
  if (holder) problems.push_back(fmt::format("end of log: {} (line {}) never exited", holder->first, holder->second));
  for (const auto& k : kinds)
    if (!seen.count(k)) problems.push_back(fmt::format("no worker of kind {} ever got the lock", k));
  if (count != pairs) problems.push_back(fmt::format("expected {} critical sections, the log has {}", pairs, count));
  return problems;
}

class InteropPeers : public CliTest {
 protected:
  std::string resource() const {
    return fmt::format("t:{}", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  // jobguard's key for the resource, from the library's own KeyBuilder.
  std::string lock_key() const { return KeyBuilder().lock_key(resource()); }
  std::string port() const { return std::to_string(server->port()); }

  Args peer_argv(const std::string& kind) const {
    if (kind == "laravel") return {JOBGUARD_PHP, kScripts + "peer_laravel.php", "--host", server->host(), "--port", port()};
    return {JOBGUARD_PYTHON3, kScripts + "peer_redis_py.py", "--host", server->host(), "--port", port()};
  }
  std::unique_ptr<Peer> serve(const std::string& kind) const {
    auto a = peer_argv(kind);
    a.push_back("serve");
    return std::make_unique<Peer>(kind, std::move(a));
  }

  // jobguard --redis URL run FLAGS -- CMD
  Args run_args(const Args& flags, const Args& cmd) const {
    Args a{jobguard_binary(), "--redis", url(), "run"};
    a.insert(a.end(), flags.begin(), flags.end());
    a.push_back("--");
    a.insert(a.end(), cmd.begin(), cmd.end());
    return a;
  }
  // CMD for `jobguard run`: writes its $JOBGUARD_TOKEN to `tok` (renamed into
  // place, so a reader never sees half of it), then waits for `go`.
  Args hold_until(const std::string& tok, const std::string& go) const {
    return {"sh", "-c",
            "printf '%s %s\\n' \"$JOBGUARD_KEY\" \"$JOBGUARD_TOKEN\" > \"$0.tmp\" && mv \"$0.tmp\" \"$0\"; "
            "while [ ! -e \"$1\" ]; do sleep 0.01; done",
            tok, go};
  }
  // The token (and key) a `hold_until` CMD wrote, once it has.
  std::pair<std::string, std::string> read_token(const std::string& tok, Subprocess& jg) {
    EXPECT_TRUE(eventually([&] { return std::filesystem::exists(tok); }, 20s)) << jg.err();
    std::istringstream in(read_file(tok));
    std::string key, token;
    in >> key >> token;
    return {key, token};
  }
  void touch(const std::string& path) const { std::ofstream(path) << "go\n"; }
  std::string get() const { return admin("GET " + lock_key()); }
  long long pttl() const { return std::stoll(admin("PTTL " + lock_key())); }

  std::shared_ptr<LockService> service(redis::Client& c) const { return LockService::create(c); }
  // The library's raw compare-and-delete with a token of the caller's choice.
  static bool release_as(LockService& svc, const std::string& resource, const std::string& token) {
    std::promise<bool> done;
    svc.async_release(resource, token, [&](const Error& e, bool ours) {
      EXPECT_FALSE(e) << e.what();
      done.set_value(ours);
    });
    return done.get_future().get();
  }
  static bool extend_as(LockService& svc, const std::string& resource, const std::string& token,
                        std::chrono::milliseconds ttl) {
    std::promise<bool> done;
    svc.async_extend(resource, token, ttl, [&](const Error& e, bool ours) {
      EXPECT_FALSE(e) << e.what();
      done.set_value(ours);
    });
    return done.get_future().get();
  }
  // "ok TOKEN" -> TOKEN
  static std::string token_of(const std::string& answer) {
    EXPECT_EQ(answer.substr(0, 3), "ok ") << answer;
    return answer.size() > 3 ? answer.substr(3) : "";
  }
  // Total SET calls the server has run (the peers' attempts: jobguard
  // acquires, renews and releases through scripts).
  long long set_calls() const {
    const std::string info = admin("INFO commandstats");
    const auto at = info.find("cmdstat_set:calls=");
    return at == std::string::npos ? 0 : std::stoll(info.substr(at + 18));
  }
};

TEST(InteropLogCheck, RejectsOverlapForeignTokensWrongKeysAndMissingKinds) {
  const std::string k = "jobguard:lock:{r}";
  EXPECT_TRUE(check_log("enter a-1 key=" + k + "\nexit a-1 holder=ok\nenter b-1 key=" + k + "\nexit b-1 holder=ok\n", k,
                        {"a", "b"}, 2).empty());
  EXPECT_FALSE(check_log("enter a-1 key=" + k + "\nenter b-1 key=" + k + "\nexit b-1 holder=ok\nexit a-1 holder=ok\n", k,
                         {}, 2).empty());
  EXPECT_FALSE(check_log("enter a-1 key=" + k + "\nexit a-1 holder=mismatch:\"x\"\n", k, {}, 1).empty());
  EXPECT_FALSE(check_log("enter a-1 key=laravel_database_" + k + "\nexit a-1 holder=ok\n", k, {}, 1).empty());
  EXPECT_FALSE(check_log("enter a-1 key=" + k + "\nexit a-1 holder=ok\n", k, {"a", "b"}, 1).empty());
  EXPECT_FALSE(check_log("enter a-1 key=" + k + "\nexit a-1 holder=ok\n", k, {"a"}, 2).empty());
}

// Every kind of holder on one key at once: 2 Laravel and 2 redis-py worker
// processes, 2 library threads and 2 loops of `jobguard run`.
TEST_F(InteropPeers, MutualExclusionAmongLaravelPythonLibraryAndRun) {
  const std::string log = file("critical-sections.log");
  const std::string key = lock_key();
  constexpr int kPeerIterations = 10, kLibIterations = 10, kRunIterations = 6;

  std::vector<std::unique_ptr<Subprocess>> peers;
  for (const std::string kind : {"laravel", "python"}) {
    for (int n = 1; n <= 2; ++n) {
      auto a = peer_argv(kind);
      const std::string id = fmt::format("{}-{}", kind == "laravel" ? "lv" : "py", n);
      a.insert(a.end(), {"loop", "--resource", resource(), "--id", id, "--log", log, "--iterations",
                         std::to_string(kPeerIterations), "--hold-ms", "5", "--ttl-ms", "5000", "--deadline-s", "60"});
      peers.push_back(std::make_unique<Subprocess>(std::move(a)));
    }
  }

  auto client = make_client();
  auto svc = service(*client);
  std::vector<std::string> failures(4);
  std::vector<std::thread> threads;
  for (int n = 0; n < 2; ++n) {
    threads.emplace_back([&, n] {
      try {
        for (int i = 0; i < kLibIterations; ++i) {
          auto lock = svc->acquire(resource(), LockOptions{.ttl = 5s, .wait = 30s, .job_id = "interop"});
          if (!lock) throw std::runtime_error("busy for 30 s");
          append_line(log, fmt::format("enter lib-{} key={}\n", n + 1, lock->key()));
          const bool mine = admin("GET " + key) == lock->token();
          std::this_thread::sleep_for(5ms);
          append_line(log, fmt::format("exit lib-{} holder={}\n", n + 1, mine ? "ok" : "mismatch"));
          if (!lock->release()) throw std::runtime_error("release found the lock no longer ours");
        }
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(n)] = e.what();
      }
    });
  }
  for (int n = 0; n < 2; ++n) {
    threads.emplace_back([&, n] {
      // CMD reads the key it was told about with redis-cli and checks it
      // holds the token it was told about.
      const Args cmd{"sh", "-c",
                     "echo \"enter jg-$0 key=$JOBGUARD_KEY\" >> \"$1\"; "
                     "v=\"$(redis-cli -h \"$2\" -p \"$3\" --no-auth-warning GET \"$JOBGUARD_KEY\")\"; sleep 0.005; "
                     "if [ -n \"$JOBGUARD_TOKEN\" ] && [ \"$v\" = \"$JOBGUARD_TOKEN\" ]; then h=ok; else h=\"mismatch:$v\"; fi; "
                     "echo \"exit jg-$0 holder=$h\" >> \"$1\"",
                     std::to_string(n + 1), log, server->host(), port()};
      for (int i = 0; i < kRunIterations; ++i) {
        Subprocess p(run_args({"--key", resource(), "--ttl", "5s", "--wait", "30s"}, cmd));
        const auto r = p.wait_or_kill(60s);
        if (r.status != 0) {
          failures[static_cast<std::size_t>(2 + n)] = fmt::format("jobguard run exited {}: {}", r.status, r.err);
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) EXPECT_EQ(f, "");
  for (auto& p : peers) {
    const auto r = p->wait_or_kill(90s);
    EXPECT_EQ(r.status, 0) << r.err;
  }
  const auto problems = check_log(read_file(log), key, {"lv", "py", "lib", "jg"},
                                  4 * kPeerIterations + 2 * kLibIterations + 2 * kRunIterations);
  for (const auto& p : problems) ADD_FAILURE() << p;
  if (!problems.empty()) ADD_FAILURE() << "log:\n" << read_file(log);
}

// A peer's release (and redis-py's extend) with a token that is not the
// holder's leaves jobguard's lock alone; the same request with the holder's
// token does release it, so the refusals were about the token and not about
// some other key.
TEST_F(InteropPeers, PeersCannotReleaseOrExtendTheLibrarysLock) {
  auto client = make_client();
  auto svc = service(*client);
  for (const std::string kind : {"laravel", "python"}) {
    SCOPED_TRACE(kind);
    auto peer = serve(kind);
    EXPECT_EQ(peer->ask("key " + resource()), "key " + lock_key());
    auto lock = svc->acquire(resource(), LockOptions{.ttl = 30s});
    ASSERT_TRUE(lock);
    EXPECT_EQ(peer->ask("release-as " + resource() + " not-" + lock->token()), "not-owned");
    EXPECT_EQ(peer->ask("acquire " + resource() + " 5000 0"), "busy");
    EXPECT_EQ(peer->ask("extend-as " + resource() + " not-" + lock->token() + " 600000"),
              kind == "python" ? "not-owned" : "unsupported");
    EXPECT_EQ(get(), lock->token());
    EXPECT_LE(pttl(), 30000);  // no foreign extend landed
    EXPECT_EQ(peer->ask("release-as " + resource() + " " + lock->token()), "released");
    EXPECT_EQ(get(), "(nil)");
    EXPECT_FALSE(lock->release());  // and jobguard is told it was no longer its lock
  }
}

TEST_F(InteropPeers, PeersCannotReleaseOrExtendTheRunsLock) {
  const std::string tok = file("tok"), go = file("go");
  Subprocess jg(run_args({"--key", resource(), "--ttl", "30s"}, hold_until(tok, go)));
  const auto [key, token] = read_token(tok, jg);
  ASSERT_FALSE(token.empty());
  EXPECT_EQ(key, lock_key());
  for (const std::string kind : {"laravel", "python"}) {
    SCOPED_TRACE(kind);
    auto peer = serve(kind);
    EXPECT_EQ(peer->ask("key " + resource()), "key " + key);
    EXPECT_EQ(peer->ask("release-as " + resource() + " not-" + token), "not-owned");
    EXPECT_EQ(peer->ask("acquire " + resource() + " 5000 0"), "busy");
    EXPECT_EQ(peer->ask("extend-as " + resource() + " not-" + token + " 600000"),
              kind == "python" ? "not-owned" : "unsupported");
    EXPECT_EQ(get(), token);
    EXPECT_LE(pttl(), 30000);
  }
  touch(go);
  const auto r = jg.wait_or_kill(30s);
  EXPECT_EQ(r.status, 0) << r.err;  // not 70: its lease was never lost
  EXPECT_EQ(get(), "(nil)");        // jobguard released it itself
}

// The expire-then-reacquire race from jobguard's side: the library's lock
// expired (nothing renewed it), a peer took the key, and now neither the
// stale Lock's release or extend, nor a compare-and-delete with any other
// token, touches the peer's lock.
TEST_F(InteropPeers, TheLibraryCannotReleaseOrExtendAPeersLock) {
  auto client = make_client();
  auto svc = service(*client);
  for (const std::string kind : {"laravel", "python"}) {
    SCOPED_TRACE(kind);
    auto peer = serve(kind);
    auto stale = svc->acquire(resource(), LockOptions{.ttl = 200ms});
    ASSERT_TRUE(stale);
    ASSERT_TRUE(eventually([&] { return get() == "(nil)"; }, 10s));
    const std::string theirs = token_of(peer->ask("acquire " + resource() + " 30000 0"));
    EXPECT_FALSE(stale->extend());
    EXPECT_FALSE(release_as(*svc, resource(), "not-" + theirs));
    EXPECT_FALSE(extend_as(*svc, resource(), "not-" + theirs, 600000ms));
    EXPECT_FALSE(stale->release());
    EXPECT_EQ(get(), theirs);
    EXPECT_GT(pttl(), 1000);  // still the peer's TTL, not the stale lock's 200 ms
    EXPECT_EQ(peer->ask("release"), "released");
    // Positive control: the same call with the peer's token reaches its key.
    EXPECT_FALSE(release_as(*svc, resource(), theirs));  // gone already
    const std::string again = token_of(peer->ask("acquire " + resource() + " 30000 0"));
    EXPECT_TRUE(release_as(*svc, resource(), again));
    EXPECT_EQ(get(), "(nil)");
  }
}

// The same race for `jobguard run`: jobguard is stopped (SIGSTOP) past its
// TTL, a peer takes the key, and when jobguard resumes it finds its lease
// lost, stops CMD and exits 70, and leaves the peer's lock alone. (A lost
// lease sends no release at all; the compare-and-delete itself is what the
// library test above puts against a peer's token.)
TEST_F(InteropPeers, TheRunCannotReleaseAPeersLockAfterLosingIt) {
  for (const std::string kind : {"laravel", "python"}) {
    SCOPED_TRACE(kind);
    const std::string tok = file("tok-" + kind), go = file("go-" + kind);
    auto peer = serve(kind);
    Subprocess jg(run_args({"--key", resource(), "--ttl", "500ms", "--grace", "2s"}, hold_until(tok, go)));
    const auto [key, token] = read_token(tok, jg);
    ASSERT_FALSE(token.empty());
    jg.signal(SIGSTOP);
    ASSERT_TRUE(eventually([&] { return get() == "(nil)"; }, 10s));
    const std::string theirs = token_of(peer->ask("acquire " + resource() + " 30000 0"));
    jg.signal(SIGCONT);
    const auto r = jg.wait_or_kill(30s);
    EXPECT_EQ(r.status, 70) << r.err;
    EXPECT_EQ(get(), theirs);
    EXPECT_EQ(peer->ask("release"), "released");
  }
}

// The race a release script exists for, on `jobguard run`'s own release: its
// key is deleted under it (Laravel's forceRelease(), or an operator's DEL),
// a peer takes the key, and CMD ends before jobguard's next renewal (ttl/3
// away) could notice. Its compare-and-delete must leave the peer's lock.
TEST_F(InteropPeers, TheRunsReleaseLeavesAPeersLockTakenAfterAForceRelease) {
  for (const std::string kind : {"laravel", "python"}) {
    SCOPED_TRACE(kind);
    const std::string tok = file("tok-" + kind), go = file("go-" + kind);
    auto peer = serve(kind);
    Subprocess jg(run_args({"--key", resource(), "--ttl", "30s"}, hold_until(tok, go)));
    const auto [key, token] = read_token(tok, jg);
    ASSERT_FALSE(token.empty());
    if (kind == "laravel") {
      EXPECT_EQ(peer->ask("force-release " + resource()), "force-released");
    } else {
      EXPECT_EQ(admin("DEL " + key), "1");  // redis-py has no force release
    }
    const std::string theirs = token_of(peer->ask("acquire " + resource() + " 30000 0"));
    touch(go);
    const auto r = jg.wait_or_kill(30s);
    EXPECT_EQ(get(), theirs) << r.err;
    // CMD's own status; the release that found another token is reported.
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("no longer ours"), std::string::npos) << r.err;
    EXPECT_EQ(peer->ask("release"), "released");
  }
}

// The operator's CLI on a peer's lock: `locks show` and `locks ls` name the
// peer's whole value as the holder, and `locks release --holder` with any other holder is
// refused (75) and leaves it; with the peer's value it releases it, and the
// peer's own release then finds it no longer its lock.
TEST_F(InteropPeers, LocksReleaseWithAnotherHolderLeavesAPeersLock) {
  for (const std::string kind : {"laravel", "python"}) {
    SCOPED_TRACE(kind);
    auto peer = serve(kind);
    const std::string theirs = token_of(peer->ask("acquire " + resource() + " 30000 0"));
    const auto show = run_jobguard({"--redis", url(), "--json", "locks", "show", resource()});
    EXPECT_EQ(show.status, 0) << show.err;
    EXPECT_NE(show.out.find("\"holder\":\"" + theirs + "\""), std::string::npos) << show.out;
    const auto ls = run_jobguard({"--redis", url(), "locks", "ls"});
    EXPECT_EQ(ls.status, 0) << ls.err;
    EXPECT_NE(ls.out.find(resource() + "  " + theirs), std::string::npos) << ls.out;
    const auto refused = run_jobguard(
        {"--redis", url(), "locks", "release", resource(), "--reason", "interop", "--holder", "not-" + theirs});
    EXPECT_EQ(refused.status, 75) << refused.err;
    EXPECT_EQ(get(), theirs);
    const auto released = run_jobguard(
        {"--redis", url(), "locks", "release", resource(), "--reason", "interop", "--holder", theirs});
    EXPECT_EQ(released.status, 0) << released.err;
    EXPECT_EQ(get(), "(nil)");
    EXPECT_EQ(peer->ask("release"), "not-owned");
  }
}

// A holder on jobguard's side keeps its lock well past its TTL by renewing
// it, while a Laravel and a redis-py worker wait on the same key: neither gets
// in until it lets go, then both do.
class InteropRenewWhilePeersWait : public InteropPeers {
 protected:
  // `token` is the holder's; `holding` says whether it still holds (its
  // lease not lost); `let_go` releases it. Holds for 2.5 TTLs.
  void hold_against_waiters(const std::string& token, std::chrono::milliseconds ttl,
                            const std::function<bool()>& holding, const std::function<void()>& let_go) {
    auto lv = serve("laravel");
    auto py = serve("python");
    const long long sets_before = set_calls();
    lv->send("acquire " + resource() + " 5000 30000");
    py->send("acquire " + resource() + " 5000 30000");
    const auto until = Clock::now() + ttl * 5 / 2;
    int checks = 0;
    while (Clock::now() < until) {
      ASSERT_EQ(get(), token) << "after " << checks << " checks";
      ASSERT_TRUE(holding());
      ASSERT_FALSE(lv->answer(0ms)) << "Laravel got in while jobguard held the lock";
      ASSERT_FALSE(py->answer(0ms)) << "redis-py got in while jobguard held the lock";
      ++checks;
      std::this_thread::sleep_for(20ms);
    }
    // Both peers were trying all along (SET NX each time).
    EXPECT_TRUE(eventually([&] { return set_calls() >= sets_before + 4; }, 10s));
    let_go();
    // One of them gets it first; the other waits for that one's release.
    std::vector<Peer*> waiting{lv.get(), py.get()};
    const auto deadline = Clock::now() + 30s;
    while (!waiting.empty() && Clock::now() < deadline) {
      for (auto it = waiting.begin(); it != waiting.end();) {
        if (auto a = (*it)->answer(10ms)) {
          EXPECT_EQ(a->substr(0, 3), "ok ") << (*it)->name() << ": " << *a;
          EXPECT_EQ((*it)->ask("release"), "released") << (*it)->name();
          it = waiting.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto* p : waiting) ADD_FAILURE() << p->name() << " never got in; stderr: " << p->err();
  }
};

TEST_F(InteropRenewWhilePeersWait, TheRunRenewsItsLease) {
  const std::string tok = file("tok"), go = file("go");
  Subprocess jg(run_args({"--key", resource(), "--ttl", "1s"}, hold_until(tok, go)));
  const auto [key, token] = read_token(tok, jg);
  ASSERT_FALSE(token.empty());
  hold_against_waiters(token, 1s, [&] { return jg.running(); }, [&] { touch(go); });
  const auto r = jg.wait_or_kill(30s);
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_F(InteropRenewWhilePeersWait, TheLibrarysLeaseRenewsIt) {
  auto client = make_client();
  auto svc = service(*client);
  auto sched = LeaseScheduler::create(svc);
  auto lease = sched->acquire(resource(), LockOptions{.ttl = 1s});
  ASSERT_TRUE(lease);
  hold_against_waiters(lease->token(), 1s, [&] { return !lease->lost(); }, [&] { EXPECT_TRUE(lease->release()); });
  EXPECT_GE(lease->renewals(), 2u);
}

// A redis-py holder extends its own lock (extend adds time, reacquire resets
// the TTL) past its timeout while `jobguard run --wait` waits; jobguard gets
// in only after the release.
TEST_F(InteropPeers, PythonExtendsItsOwnLockWhileTheRunWaits) {
  auto py = serve("python");
  const std::string theirs = token_of(py->ask("acquire " + resource() + " 1000 0"));
  const std::string entered = file("entered");
  Subprocess jg(run_args({"--key", resource(), "--ttl", "5s", "--wait", "30s"},
                         {"sh", "-c", "echo in > \"$0\"", entered}));
  EXPECT_EQ(py->ask("extend 2000"), "extended");
  EXPECT_GT(pttl(), 1000);  // more than its own 1 s timeout: only extend gives that
  const auto until = Clock::now() + 1600ms;  // past its 1 s timeout, kept by extend/reacquire
  for (int i = 0; Clock::now() < until; ++i) {
    EXPECT_EQ(py->ask(i % 2 ? "extend 500" : "reacquire"), i % 2 ? "extended" : "reacquired");
    ASSERT_EQ(get(), theirs);
    ASSERT_FALSE(std::filesystem::exists(entered)) << "jobguard ran CMD while redis-py held the lock";
    ASSERT_TRUE(jg.running()) << jg.err();
    std::this_thread::sleep_for(300ms);
  }
  EXPECT_EQ(py->ask("release"), "released");
  const auto r = jg.wait_or_kill(30s);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(entered));
}

// Illuminate's locks cannot be extended: a Laravel holder's lock ends at its
// TTL (whole seconds). A holder that dies without releasing frees the key
// then, and a waiting `jobguard run` gets in.
TEST_F(InteropPeers, LaravelCannotExtendAndItsTtlFreesTheKeyForTheRun) {
  const std::string entered = file("entered");
  auto lv = serve("laravel");
  token_of(lv->ask("acquire " + resource() + " 1000 0"));
  EXPECT_EQ(lv->ask("extend 5000"), "unsupported");
  EXPECT_LE(pttl(), 1000);
  Subprocess jg(run_args({"--key", resource(), "--ttl", "5s", "--wait", "30s"},
                         {"sh", "-c", "echo in > \"$0\"", entered}));
  lv.reset();  // the worker ends without releasing: its lock stays until its TTL
  const auto r = jg.wait_or_kill(30s);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(entered));
}

}  // namespace
}  // namespace jobguard::test
