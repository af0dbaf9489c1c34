// Fault tests of the fencing story: several real `jobguard run
// --fence` workers add 1 to one PostgreSQL row through a fenced UPDATE
// (`... WHERE fence < $JOBGUARD_FENCE`) and record every attempt in an audit
// table, while the test
//   - pauses a holder (jobguard and its CMD) with SIGSTOP past the TTL, lets
//     other workers take the lock and write, then resumes it: its late write
//     is attempted (it ignores SIGTERM) and must be rejected;
//   - kills a holder (jobguard and its CMD) with SIGKILL mid-critical-section;
//   - restarts Redis without persistence (lock keys gone) three times, once
//     while a holder is paused;
//   - fails Redis over to a replica (kill -9 the primary, REPLICAOF NO ONE)
//     while a holder is paused, and points new workers at the replica.
// Then, from the audit table and the row: no accepted write with a fence at
// or below an earlier accepted one (no stale write, no regression), every
// worker that exited 0 had its write accepted (no legitimate write rejected),
// every rejected write belongs to a worker that reported its lease lost (70),
// and fences issued after a restart/failover exceed every earlier fence.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <fstream>
#include <memory>
#include <pqxx/pqxx>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/postgres_fixture.hpp"
#include "support/redis_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;

// A holder the test stops or kills has a short TTL, so the others wait little
// for it. The others renew theirs, and a longer one lets a loaded host (ASan,
// two tests at once) stall a renewal without losing a legitimate holder's
// lease. max_ttl, the quarantine after a restart or failover, covers both.
constexpr const char* kTtl = "600ms";
constexpr auto kTtlMs = 600ms;
constexpr const char* kNormalTtl = "2s";
constexpr const char* kMaxTtl = "2s";

// The worker's CMD. $1 name, $2 marker file, $3 socket dir, $4 port, $5 "1"
// to ignore SIGTERM (a paused holder must still attempt its late write when it
// resumes, whatever jobguard does then), $6/$7 table names, $8 a go file or
// "". The wait after the marker is the critical section: 0.3 s for a normal
// worker; for one the test stops or kills, until the test creates the go
// file (never, for a killed one), so the signal lands in it however late a
// loaded host lets the test send it. The write is ONE statement, so the
// fenced UPDATE and its audit row commit together.
constexpr const char* kWorkerScript = R"(set -e
if [ "$5" = 1 ]; then trap '' TERM; fi
pgrp=$(cut -d' ' -f5 /proc/$$/stat)
printf '%s %s\n' "$JOBGUARD_FENCE" "$pgrp" > "$2.tmp"
mv "$2.tmp" "$2"
if [ -n "$8" ]; then
  while [ ! -e "$8" ]; do sleep 0.01; done
else
  sleep 0.3
fi
/usr/bin/psql -X -q -v ON_ERROR_STOP=1 -h "$3" -p "$4" -U postgres -d postgres \
  -v fence="$JOBGUARD_FENCE" -v writer="$1" -v token="$JOBGUARD_TOKEN" -v acct="$6" -v audit="$7" <<'SQL'
WITH u AS (UPDATE :"acct" SET balance = balance + 1, fence = :fence, writer = :'writer'
           WHERE id = 1 AND fence < :fence RETURNING 1)
INSERT INTO :"audit" (fence, accepted, writer, token)
SELECT :fence, EXISTS (SELECT 1 FROM u), :'writer', :'token';
SQL
)";

enum class Role { normal, paused, killed };

struct Worker {
  std::string name;
  int epoch = 0;  // Redis incarnation it acquired in (restarts/failovers before its start)
  Role role = Role::normal;
  std::string marker;
  std::string go;  // the paused or killed CMD's go file; "" for a normal one
  std::unique_ptr<Subprocess> proc;
  SubprocessResult result;
  bool done = false;
};

struct AuditRow {
  std::int64_t id = 0, fence = 0;
  bool accepted = false;
  std::string writer;
};


class FencingFault : public RedisTest {
 protected:
  void SetUp() override {
    RedisTest::SetUp();
    char tmpl[] = "/tmp/jobguard-fault-test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    resource_ = fmt::format("t:fault:{}:acct:1", info->name());
    std::string base = fmt::format("t_fault_{}", info->name());
    std::transform(base.begin(), base.end(), base.begin(), [](unsigned char ch) { return std::tolower(ch); });
    acct_ = base + "_accounts";
    audit_ = base + "_audit";
    pg_ = &shared_postgres();
    sql(fmt::format("DROP TABLE IF EXISTS {0}; DROP TABLE IF EXISTS {1};"
                    "CREATE TABLE {0} (id int PRIMARY KEY, balance bigint NOT NULL, fence bigint NOT NULL, writer text);"
                    "INSERT INTO {0} VALUES (1, 0, 0, NULL);"
                    "CREATE TABLE {1} (id bigserial PRIMARY KEY, fence bigint NOT NULL, accepted bool NOT NULL,"
                    " writer text NOT NULL, token text NOT NULL);",
                    acct_, audit_));
  }
  void TearDown() override {
    // Stopped holders first: a SIGKILL to a stopped process is delivered, but
    // its CMD group would otherwise stay stopped forever.
    for (auto& w : workers_) kill_group(*w, SIGKILL);
    workers_.clear();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    RedisTest::TearDown();
  }

  void sql(const std::string& statements) {
    pqxx::connection c(pg_->url());
    pqxx::work w(c);
    w.exec(statements);
    w.commit();
  }

  Worker& start_worker(const std::string& redis_url, Role role) {
    auto w = std::make_unique<Worker>();
    w->name = fmt::format("w{}", workers_.size());
    w->epoch = epoch_;
    w->role = role;
    w->marker = dir_ + "/" + w->name + ".marker";
    if (role != Role::normal) w->go = dir_ + "/" + w->name + ".go";
    w->proc = std::make_unique<Subprocess>(std::vector<std::string>{
        // max_ttl: after a restart or failover the server is quarantined
        // (docs/lock-safety.md) for 2 s, which the workers' --wait covers.
        jobguard_binary(), "--redis", redis_url + "?max_ttl=" + kMaxTtl, "run", "--key", resource_, "--ttl",
        role == Role::normal ? kNormalTtl : kTtl, "--wait", "10s", "--fence",
        "--", "sh", "-c", kWorkerScript, "jobguard-fault-worker", w->name, w->marker, pg_->dir(), std::to_string(pg_->port()),
        role == Role::paused ? "1" : "0", acct_, audit_, w->go});
    workers_.push_back(std::move(w));
    return *workers_.back();
  }

  bool has_marker(const Worker& w) const { return std::filesystem::exists(w.marker); }
  // {fence, CMD's process group (field 5 of /proc/PID/stat)} from the marker.
  std::pair<std::int64_t, pid_t> marker(const Worker& w) const {
    std::istringstream in(read_file(w.marker));
    std::int64_t fence = 0;
    pid_t pid = 0;
    in >> fence >> pid;
    return {fence, pid};
  }

  // The holder as a whole (jobguard and CMD's process group), like a VM
  // freeze or a crash of the host.
  void kill_group(Worker& w, int sig) {
    if (w.done) return;
    if (has_marker(w)) {
      const pid_t pg = marker(w).second;
      if (pg > 1) ::kill(-pg, sig);
    }
    w.proc->signal(sig);
    if (sig == SIGKILL && has_marker(w) && marker(w).second > 1) ::kill(-marker(w).second, SIGCONT);
  }

  // Starts a holder that will be stopped in its critical section (jobguard and
  // CMD). Returns once it is stopped.
  Worker& start_paused_holder(const std::string& redis_url) {
    Worker& v = start_worker(redis_url, Role::paused);
    EXPECT_TRUE(eventually([&] { return has_marker(v); }, 10s)) << v.name << ": " << v.proc->err();
    const pid_t pg = marker(v).second;
    // kill(-0) or kill(-1) would stop the test itself or everything.
    if (pg <= 1 || ::getpgid(pg) != pg) {
      ADD_FAILURE() << "marker of " << v.name << " names no process group: " << read_file(v.marker);
      return v;
    }
    ::kill(-pg, SIGSTOP);
    v.proc->signal(SIGSTOP);
    return v;
  }

  void resume(Worker& v) {
    // CMD first: its late write is on its way before jobguard, back from the
    // stop, notices the lost lease and sends SIGTERM (which CMD ignores).
    // Its critical section ends with the go file, made before it runs on.
    std::ofstream(v.go).put('\n');
    if (marker(v).second > 1) ::kill(-marker(v).second, SIGCONT);
    std::this_thread::sleep_for(20ms);
    v.proc->signal(SIGCONT);
  }

  void finish(Worker& w) {
    if (w.done) return;
    w.result = w.proc->wait_or_kill(30s);
    w.done = true;
  }
  void finish_all() {
    for (auto& w : workers_) finish(*w);
  }

  std::vector<AuditRow> audit() {
    pqxx::connection c(pg_->url());
    pqxx::work tx(c);
    std::vector<AuditRow> rows;
    for (const auto& r : tx.exec(fmt::format("SELECT id, fence, accepted, writer FROM {} ORDER BY id", audit_)))
      rows.push_back({r[0].as<std::int64_t>(), r[1].as<std::int64_t>(), r[2].as<bool>(), r[3].as<std::string>()});
    return rows;
  }
  // The highest fence an accepted write has stored so far.
  std::int64_t stored_fence() {
    pqxx::connection c(pg_->url());
    pqxx::work tx(c);
    return tx.exec(fmt::format("SELECT fence FROM {} WHERE id = 1", acct_))[0][0].as<std::int64_t>();
  }

  // Every invariant of the acceptance criteria, from the database and the
  // workers' exit statuses. Returns {accepted, rejected}.
  std::pair<int, int> check_invariants() {
    finish_all();
    const auto rows = audit();
    std::map<std::string, const Worker*> by_name;
    for (const auto& w : workers_) by_name[w->name] = w.get();
    std::map<std::string, std::vector<const AuditRow*>> rows_of;
    for (const auto& r : rows) rows_of[r.writer].push_back(&r);

    int accepted = 0, rejected = 0, exit0 = 0;
    std::int64_t max_accepted = 0;
    std::string last_writer;
    for (const auto& r : rows) {
      const Worker* w = by_name.at(r.writer);
      if (r.accepted) {
        // No stale write accepted and no fencing-token regression: accepted
        // writes, in the order they took the row lock, have rising fences.
        EXPECT_GT(r.fence, max_accepted) << "stale write accepted: " << r.writer << " fence " << r.fence;
        max_accepted = std::max(max_accepted, r.fence);
        last_writer = r.writer;
        ++accepted;
        EXPECT_EQ(w->result.status, 0) << r.writer << " wrote (accepted) but exited " << w->result.status << ": "
                                       << w->result.err;
      } else {
        // A rejected write must come from a holder whose lease was lost, and
        // jobguard must have said so.
        EXPECT_LE(r.fence, max_accepted);
        ++rejected;
        EXPECT_EQ(w->role, Role::paused) << "legitimate write rejected: " << r.writer << " fence " << r.fence;
        EXPECT_EQ(w->result.status, 70) << r.writer << " was rejected but jobguard exited " << w->result.status << ": "
                                        << w->result.err;
      }
    }
    for (const auto& w : workers_) {
      const auto& mine = rows_of[w->name];
      switch (w->role) {
        case Role::normal:
          EXPECT_EQ(w->result.status, 0) << w->name << ": " << w->result.err;
          if (mine.size() != 1) {
            ADD_FAILURE() << w->name << " wrote " << mine.size() << " times";
            break;
          }
          EXPECT_TRUE(mine[0]->accepted) << "legitimate write rejected: " << w->name;
          break;
        case Role::paused:
          EXPECT_EQ(w->result.status, 70) << w->name << ": " << w->result.err;
          if (mine.size() != 1) {
            ADD_FAILURE() << w->name << " (paused) wrote " << mine.size() << " times";
            break;
          }
          EXPECT_FALSE(mine[0]->accepted) << "stale write of paused holder " << w->name << " accepted";
          break;
        case Role::killed:
          EXPECT_TRUE(mine.empty()) << w->name << " was killed before its write but wrote";
          break;
      }
      if (w->result.status == 0) ++exit0;
    }
    EXPECT_EQ(accepted, exit0);

    // Fences issued in a Redis incarnation exceed every fence issued before
    // it: a restart without persistence or a failover never goes backwards.
    std::map<int, std::pair<std::int64_t, std::int64_t>> span;  // epoch -> {min, max}
    for (const auto& w : workers_) {
      if (!has_marker(*w)) continue;
      const auto f = marker(*w).first;
      auto [it, fresh] = span.try_emplace(w->epoch, f, f);
      if (!fresh) it->second = {std::min(it->second.first, f), std::max(it->second.second, f)};
    }
    std::int64_t before = 0;
    for (const auto& [epoch, mm] : span) {
      EXPECT_GT(mm.first, before) << "fence regression in Redis incarnation " << epoch;
      before = std::max(before, mm.second);
    }

    pqxx::connection c(pg_->url());
    pqxx::work tx(c);
    const auto row = tx.exec(fmt::format("SELECT balance, fence, writer FROM {} WHERE id = 1", acct_))[0];
    EXPECT_EQ(row[0].as<std::int64_t>(), accepted);
    EXPECT_EQ(row[1].as<std::int64_t>(), max_accepted);
    if (!last_writer.empty()) {
      EXPECT_EQ(row[2].as<std::string>(), last_writer);
    }
    return {accepted, rejected};
  }

  // n workers at once against one key; they queue with --wait.
  void round(const std::string& redis_url, int n) {
    std::vector<Worker*> started;
    for (int i = 0; i < n; ++i) started.push_back(&start_worker(redis_url, Role::normal));
    for (auto* w : started) finish(*w);
  }

  std::string dir_, resource_, acct_, audit_;
  PostgresServer* pg_ = nullptr;
  std::vector<std::unique_ptr<Worker>> workers_;
  int epoch_ = 0;
};

TEST_F(FencingFault, PausesKillsAndRedisRestartsWithoutPersistence) {
  const std::string url = server->url();
  int restarts = 0;
  auto restart = [&] {
    server->restart();
    ++restarts;
    ++epoch_;
    ASSERT_EQ(admin("DBSIZE"), "0") << "restart must lose every key (no persistence)";
  };

  round(url, 4);
  restart();

  // A holder stopped past its TTL while others take the lock and write.
  {
    Worker& v = start_paused_holder(url);
    const auto paused_fence = marker(v).first;
    round(url, 3);
    ASSERT_GT(stored_fence(), paused_fence) << "nobody wrote over the paused holder";
    resume(v);
    finish(v);
  }
  restart();

  // A holder crashed (jobguard and CMD killed) mid-critical-section.
  {
    Worker& k = start_worker(url, Role::killed);
    ASSERT_TRUE(eventually([&] { return has_marker(k); }, 10s)) << k.proc->err();
    kill_group(k, SIGKILL);
    finish(k);
    EXPECT_TRUE(k.result.signaled) << k.result.status;
    round(url, 3);
  }

  // Redis restarts while a holder is stopped: the lock is gone at once and
  // the fresh server issues the next fences.
  {
    Worker& v = start_paused_holder(url);
    const auto paused_fence = marker(v).first;
    restart();
    round(url, 3);
    ASSERT_GT(stored_fence(), paused_fence);
    std::this_thread::sleep_for(kTtlMs);  // stopped past the TTL in any case
    resume(v);
    finish(v);
  }
  round(url, 2);

  const auto [accepted, rejected] = check_invariants();
  EXPECT_EQ(restarts, 3);
  EXPECT_EQ(rejected, 2);
  EXPECT_EQ(accepted, 15);
  std::cout << fmt::format("[fault] workers {} accepted {} rejected {} redis restarts {}\n", workers_.size(), accepted,
                           rejected, restarts);
}

TEST_F(FencingFault, FailoverToAReplica) {
  EmbeddedRedis replica;
  replica.start();
  ASSERT_EQ(redis_command_at("127.0.0.1", replica.port(), fmt::format("REPLICAOF 127.0.0.1 {}", server->port())), "OK");
  ASSERT_TRUE(eventually([&] { return redis_command_at("127.0.0.1", replica.port(), "INFO replication").find("master_link_status:up") !=
                                      std::string::npos; },
                         10s))
      << redis_command_at("127.0.0.1", replica.port(), "INFO replication");

  round(server->url(), 3);

  // The holder is stopped in its critical section; its lock key has reached
  // the replica; the primary dies and the replica is promoted.
  Worker& v = start_paused_holder(server->url());
  const auto paused_fence = marker(v).first;
  const std::string lock_key = "jobguard:lock:{" + resource_ + "}";
  ASSERT_TRUE(eventually([&] { return redis_command_at("127.0.0.1", replica.port(), "EXISTS " + lock_key) == "1"; }, 5s));
  server->kill();
  ASSERT_EQ(redis_command_at("127.0.0.1", replica.port(), "REPLICAOF NO ONE"), "OK");
  ++epoch_;

  // New workers on the promoted replica: they wait out the replicated lock's
  // TTL, then write with fences above everything the primary issued.
  round(replica.url(), 3);
  ASSERT_GT(stored_fence(), paused_fence) << "nobody wrote over the paused holder";
  resume(v);
  finish(v);
  round(replica.url(), 2);

  const auto [accepted, rejected] = check_invariants();
  EXPECT_EQ(rejected, 1);
  EXPECT_EQ(accepted, 8);
  std::cout << fmt::format("[fault] failover: workers {} accepted {} rejected {}\n", workers_.size(), accepted, rejected);
}

}  // namespace
}  // namespace jobguard::test
