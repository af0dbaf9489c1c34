// The guarded runner against a real redis-server (one per test, so a test can
// stop it) and the shared throwaway PostgreSQL cluster.
#include "jobguard/job/runner.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <optional>
#include <sstream>
#include <thread>

#include "jobguard/testing/embedded_redis.hpp"
#include "jobguard/error.hpp"
#include "jobguard/guard/completion.hpp"
#include "jobguard/guard/idempotency.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/event_log.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/redis/client.hpp"
#include "support/redis_fixture.hpp"
#ifndef JOBGUARD_TESTS_WITHOUT_POSTGRES
#include "support/postgres_fixture.hpp"
#endif

using namespace std::chrono_literals;
using namespace jobguard;
using job::Consequence;
using job::Outcome;
using job::RedisDownPolicy;

namespace {

// The high row's tables and the durable records are in the binary's shared
// PostgreSQL; a Redis-only build has the other rows only.
#ifndef JOBGUARD_TESTS_WITHOUT_POSTGRES
using RunnerBase = test::PostgresTest;
#else
using RunnerBase = ::testing::Test;
#endif

class RunnerTest : public RunnerBase {
 protected:
  void SetUp() override {
    ++iteration();
    server = std::make_unique<EmbeddedRedis>();
    server->start();
    client = std::make_unique<redis::Client>(options());
    ASSERT_TRUE(client->wait_connected(5s));
    trust_new_server(*client);  // a fresh server: no quarantine (docs/lock-safety.md)
    locks = LockService::create(*client, KeyBuilder(prefix()));
    leases = LeaseScheduler::create(locks);
  }
  void TearDown() override {
    leases.reset();
    locks.reset();
    client.reset();
    server.reset();
  }

  redis::ConnectionOptions options() const {
    redis::ConnectionOptions o;
    o.host = server->host();
    o.port = server->port();
    // Short: the Redis-down tests wait out one deadline per call.
    o.connect_timeout = 300ms;
    o.command_timeout = 300ms;
    return o;
  }

  // Unique per test: classes are metric series and completion job kinds
  // (the PostgreSQL table is shared by the whole binary).
  // (the PostgreSQL table is shared by the whole binary), and per iteration
  // so --gtest_repeat starts from nothing.
  static int& iteration() {
    static int n = 0;
    return n;
  }
  static std::string cls_name() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    // Names are capped at 64 characters; test names fit once truncated.
    return ("r" + std::to_string(iteration()) + "." + std::string(info->name())).substr(0, 64);
  }
#ifndef JOBGUARD_TESTS_WITHOUT_POSTGRES
  static std::string table(const std::string& what) { return name(what + std::to_string(iteration())); }
#endif
  static std::string prefix() { return "jgt"; }

  job::LockClass low_class() const {
    return job::LockClass{.name = cls_name(),
                          .key_pattern = "invoice:{id}",
                          .consequence = Consequence::low,
                          .ttl = 5s,
                          .owner = "tests",
                          .protects = "a counter"};
  }

  job::LockClass moderate_class() const {
    auto c = low_class();
    c.consequence = Consequence::moderate;
    return c;
  }

  // Until the service's state gate has checked the server, a claim goes step
  // by step (and a moderate one claims its key before the effect): one run
  // first, so the next goes through the one-call claim.
  static void warm(job::GuardedRunner& runner) {
    ASSERT_EQ(runner.run({.id = "warm", .run_id = "r"}, [](job::JobContext&) { return std::string(); }).outcome,
              Outcome::completed);
  }

  observe::LockClassSnapshot metrics() const { return *observe::Registry::global().snapshot(cls_name()); }

  std::unique_ptr<EmbeddedRedis> server;
  std::unique_ptr<redis::Client> client;
  std::shared_ptr<LockService> locks;
  std::shared_ptr<LeaseScheduler> leases;
};

// Collects the runner's event lines.
struct Lines {
  std::mutex mu;
  std::vector<std::string> lines;
  observe::EventLog log{observe::LogFormat::json, [this](std::string_view l) {
                          std::lock_guard lk(mu);
                          lines.emplace_back(l);
                        }};
  bool any(std::string_view needle) {
    std::lock_guard lk(mu);
    for (auto& l : lines)
      if (l.find(needle) != std::string::npos) return true;
    return false;
  }
};

}  // namespace

TEST_F(RunnerTest, LowClassRunsOnceRecordsAndSkipsTheRetryWithALogLine) {
  guard::RedisCompletionStore done(*client);
  Lines lines;
  job::GuardedRunner runner(leases, low_class(), {.completions = &done, .log = &lines.log});
  int runs = 0;
  std::string seen_key;
  auto effect = [&](job::JobContext& ctx) {
    ++runs;
    seen_key = ctx.lock_key();
    EXPECT_TRUE(ctx.guarded());
    EXPECT_GT(ctx.safe_time_left(), 4s);
    ctx.ensure();
    return std::string("charged");
  };
  auto r1 = runner.run({.id = "48291", .run_id = "2026-11"}, effect);
  EXPECT_EQ(r1.outcome, Outcome::completed) << r1.detail;
  EXPECT_EQ(r1.result, "charged");
  EXPECT_FALSE(r1.fail_open);
  EXPECT_EQ(seen_key, "jgt:lock:{invoice:48291}");
  // Released: the key is gone once the run returns.
  EXPECT_EQ(client->exec({"EXISTS", seen_key}).integer, 0);

  auto r2 = runner.run({.id = "48291", .run_id = "2026-11"}, effect);
  EXPECT_EQ(r2.outcome, Outcome::already_done);
  EXPECT_EQ(r2.result, "charged");
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(lines.any("\"event\":\"skipped\""));
  EXPECT_TRUE(lines.any("\"outcome\":\"already_done\""));

  // Another run id of the same unit is new work.
  auto r3 = runner.run({.id = "48291", .run_id = "2026-12"}, effect);
  EXPECT_EQ(r3.outcome, Outcome::completed);
  EXPECT_EQ(runs, 2);
}

TEST_F(RunnerTest, BusyWhenAnotherWorkerHoldsTheLockAndNothingRuns) {
  guard::RedisCompletionStore done(*client);
  job::GuardedRunner runner(leases, low_class(), {.completions = &done});
  auto other = locks->acquire("invoice:7", LockOptions{.ttl = 5s});
  ASSERT_TRUE(other);
  int runs = 0;
  auto r = runner.run({.id = "7", .run_id = "r"}, [&](job::JobContext&) {
    ++runs;
    return std::string();
  });
  EXPECT_EQ(r.outcome, Outcome::busy);
  EXPECT_NE(r.detail.find("invoice:7"), std::string::npos) << r.detail;
  EXPECT_EQ(runs, 0);
  EXPECT_FALSE(done.find(cls_name(), "invoice:7", "r"));
  EXPECT_TRUE(other->release());  // the runner did not touch the other worker's lock
}

TEST_F(RunnerTest, FailClosedWithRedisStoppedDoesNotRunAndSaysWhy) {
  guard::RedisCompletionStore done(*client);
  Lines lines;
  auto cls = low_class();
  cls.on_redis_down = RedisDownPolicy::fail_closed;
  job::GuardedRunner runner(leases, cls, {.completions = &done, .log = &lines.log});
  const auto before = observe::Registry::global().lock_class(cls_name()).redis_errors_total.value();
  server->stop();
  int runs = 0;
  auto r = runner.run({.id = "1", .run_id = "r"}, [&](job::JobContext&) {
    ++runs;
    return std::string();
  });
  EXPECT_EQ(r.outcome, Outcome::redis_unavailable) << r.detail;
  EXPECT_NE(r.detail.find("lock class '" + cls_name() + "' is fail-closed"), std::string::npos) << r.detail;
  EXPECT_FALSE(r.fail_open);
  EXPECT_EQ(runs, 0);
  EXPECT_GT(metrics().redis_errors_total, before);
  EXPECT_EQ(metrics().fail_open_total, 0u);
  EXPECT_TRUE(lines.any("redis_unavailable"));
}

#ifndef JOBGUARD_TESTS_WITHOUT_POSTGRES
TEST_F(RunnerTest, FailClosedLockClaimWithRedisStoppedAfterTheRecordCheck) {
  // The record store is PostgreSQL (reachable); only the lock's Redis is
  // down: the claim itself meets the outage and the class's policy decides.
  guard::PgCompletionStore done(pg_options());
  auto cls = low_class();
  job::GuardedRunner runner(leases, cls, {.completions = &done});
  server->stop();
  int runs = 0;
  auto r = runner.run({.id = "2", .run_id = "r"}, [&](job::JobContext&) {
    ++runs;
    return std::string();
  });
  EXPECT_EQ(r.outcome, Outcome::redis_unavailable);
  EXPECT_NE(r.detail.find("fail-closed"), std::string::npos) << r.detail;
  EXPECT_EQ(runs, 0);
  EXPECT_FALSE(done.find(cls_name(), "invoice:2", "r"));
}

TEST_F(RunnerTest, FailOpenWithRedisStoppedRunsLoudlyCountsAndStillRecordsDurably) {
  guard::PgCompletionStore done(pg_options());
  Lines lines;
  auto cls = low_class();
  cls.on_redis_down = RedisDownPolicy::fail_open;
  job::GuardedRunner runner(leases, cls, {.completions = &done, .log = &lines.log});
  server->stop();
  int runs = 0;
  std::string idem;
  auto effect = [&](job::JobContext& ctx) {
    ++runs;
    EXPECT_FALSE(ctx.guarded());
    EXPECT_TRUE(ctx.lock_key().empty());
    ctx.ensure();  // nothing to run out
    idem = ctx.idempotency_key();
    return std::string("ok");
  };
  auto r = runner.run({.id = "3", .run_id = "r"}, effect);
  EXPECT_EQ(r.outcome, Outcome::completed) << r.detail;
  EXPECT_TRUE(r.fail_open);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(metrics().fail_open_total, 1u);
  EXPECT_TRUE(lines.any("\"event\":\"fail_open\""));
  EXPECT_TRUE(lines.any("WITHOUT the lock"));
  // Derived without Redis, so the downstream can still dedupe.
  EXPECT_EQ(idem, cls_name() + "/invoice:3/r");
  // The durable record stops the retry even while Redis is still down.
  auto again = runner.run({.id = "3", .run_id = "r"}, effect);
  EXPECT_EQ(again.outcome, Outcome::already_done);
  EXPECT_EQ(runs, 1);
}
#endif  // the PostgreSQL record store

TEST_F(RunnerTest, ModerateClaimsTheIdempotencyKeyAndReplaysOneACrashedWorkerCompleted) {
  guard::RedisCompletionStore done(*client);
  guard::RedisIdempotencyStore idem(*client);
  auto cls = moderate_class();
  job::GuardedRunner runner(leases, cls, {.completions = &done, .idempotency = &idem});
  int runs = 0;
  std::string key;
  auto effect = [&](job::JobContext& ctx) {
    ++runs;
    key = ctx.idempotency_key();
    EXPECT_EQ(ctx.idempotency_key("sub-9"), key + "/sub-9");
    return std::string("ch_1");
  };
  auto r = runner.run({.id = "10", .run_id = "2026-11"}, effect);
  ASSERT_EQ(r.outcome, Outcome::completed) << r.detail;
  EXPECT_EQ(key, cls_name() + "/invoice:10/2026-11");
  auto b = idem.begin(key, "2026-11", 1s);
  EXPECT_EQ(b.status, guard::BeginStatus::completed);
  EXPECT_EQ(b.result, "ch_1");

  // A worker charged unit 11 and completed its key, then died before the
  // completion record: the next run must not charge again.
  const std::string k11 = cls_name() + "/invoice:11/2026-11";
  auto c = idem.begin(k11, "2026-11", 5s);
  ASSERT_EQ(c.status, guard::BeginStatus::claimed);
  idem.complete(k11, c.owner, "ch_crashed");
  auto r11 = runner.run({.id = "11", .run_id = "2026-11"}, effect);
  EXPECT_EQ(r11.outcome, Outcome::already_done);
  EXPECT_EQ(r11.result, "ch_crashed");
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(done.find(cls_name(), "invoice:11", "2026-11"));  // and the record is written now

  // A failed effect frees its key at once: the retry runs without waiting out the claim.
  bool fail = true;
  auto flaky = [&](job::JobContext&) -> std::string {
    if (fail) throw std::runtime_error("gateway 502");
    return "ch_2";
  };
  auto f = runner.run({.id = "12", .run_id = "2026-11"}, flaky);
  EXPECT_EQ(f.outcome, Outcome::failed);
  EXPECT_NE(f.detail.find("gateway 502"), std::string::npos);
  fail = false;
  EXPECT_EQ(runner.run({.id = "12", .run_id = "2026-11"}, flaky).outcome, Outcome::completed);
}

TEST_F(RunnerTest, ModerateWaitsOutTheClaimOfAWorkerThatDiedMidEffect) {
  guard::RedisCompletionStore done(*client);
  guard::RedisIdempotencyStore idem(*client);
  auto cls = moderate_class();
  Lines lines;
  job::GuardedRunner runner(leases, cls, {.completions = &done, .idempotency = &idem, .log = &lines.log});
  // The dead worker's claim: it began the effect and never came back. Its
  // lock is gone (expired); its claim passes in 300 ms.
  const std::string key = cls_name() + "/invoice:20/2026-11";
  ASSERT_EQ(idem.begin(key, "2026-11", 300ms).status, guard::BeginStatus::claimed);
  int runs = 0;
  auto r = runner.run({.id = "20", .run_id = "2026-11"}, [&](job::JobContext&) {
    ++runs;
    return std::string("ch_20");
  });
  EXPECT_EQ(r.outcome, Outcome::completed) << r.detail;
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(lines.any("idempotency_wait"));

  // A live claim that outlasts our lock time is busy, not waited for.
  const std::string k21 = cls_name() + "/invoice:21/2026-11";
  ASSERT_EQ(idem.begin(k21, "2026-11", 60s).status, guard::BeginStatus::claimed);
  auto busy = runner.run({.id = "21", .run_id = "2026-11"}, [&](job::JobContext&) {
    ++runs;
    return std::string();
  });
  EXPECT_EQ(busy.outcome, Outcome::busy);
  EXPECT_NE(busy.detail.find("in progress"), std::string::npos) << busy.detail;
  EXPECT_EQ(runs, 1);
}

TEST_F(RunnerTest, AnEffectThatOutlivesItsLockIsRecordedAndSaidLoudly) {
  guard::RedisCompletionStore done(*client);
  Lines lines;
  auto cls = low_class();
  cls.ttl = 200ms;
  cls.min_time_left = 10ms;
  job::GuardedRunner runner(leases, cls, {.completions = &done, .log = &lines.log});
  auto r = runner.run({.id = "slow", .run_id = "r"}, [&](job::JobContext&) {
    std::this_thread::sleep_for(300ms);
    return std::string("late");
  });
  EXPECT_EQ(r.outcome, Outcome::completed);
  EXPECT_NE(r.detail.find("outlived its lock"), std::string::npos) << r.detail;
  EXPECT_TRUE(lines.any("overran_lock"));
  EXPECT_TRUE(done.find(cls_name(), "invoice:slow", "r"));  // the record states the fact and stops a third run
}

#ifndef JOBGUARD_TESTS_WITHOUT_POSTGRES
TEST_F(RunnerTest, HighCommitsTheEffectAndItsRecordTogetherOrNeither) {
  const std::string table = RunnerTest::table("acct");
  {
    guard::PgConnection c(pg_options());
    c.exec("CREATE TABLE " + table + " (id text PRIMARY KEY, balance int NOT NULL, fence bigint NOT NULL DEFAULT 0)");
    c.exec("INSERT INTO " + table + " VALUES ('a', 0, 0), ('b', 0, 0)");
  }
  auto cls = low_class();
  cls.consequence = Consequence::high;
  job::GuardedRunner runner(leases, cls, {.postgres = pg_options()});
  auto write = [&](job::JobContext& ctx) {
    EXPECT_NE(ctx.transaction(), nullptr);
    EXPECT_TRUE(ctx.fence().has_value());  // high: the Redis grant carries a fencing token
    auto res = ctx.transaction()->fenced_update(
        guard::FencedUpdate{.table = table, .assignments = "balance = balance + 10", .id = ctx.unit().id},
        *ctx.fence());
    if (!res.accepted()) throw Error(errc::stale_fence, "ledger refused the write");
    if (ctx.unit().id == "b") throw std::runtime_error("provider said no after the write");
    return std::string("+10");
  };
  auto ra = runner.run({.id = "a", .run_id = "r"}, write);
  EXPECT_EQ(ra.outcome, Outcome::completed) << ra.detail;
  EXPECT_TRUE(ra.fence.has_value());
  auto rb = runner.run({.id = "b", .run_id = "r"}, write);
  EXPECT_EQ(rb.outcome, Outcome::failed);

  guard::PgConnection c(pg_options());
  auto bal = c.exec("SELECT id, balance FROM " + table + " ORDER BY id");
  EXPECT_EQ(bal.rows[0][1], std::optional<std::string>("10"));
  EXPECT_EQ(bal.rows[1][1], std::optional<std::string>("0"));  // rolled back with its (absent) record
  auto recs = c.exec("SELECT entity, result FROM jobguard_completions WHERE job_kind = $1 ORDER BY entity",
                     {cls_name()});
  ASSERT_EQ(recs.rows.size(), 1u);
  EXPECT_EQ(recs.rows[0][0], std::optional<std::string>("invoice:a"));
  EXPECT_EQ(recs.rows[0][1], std::optional<std::string>("+10"));

  auto again = runner.run({.id = "a", .run_id = "r"}, write);
  EXPECT_EQ(again.outcome, Outcome::already_done);
  EXPECT_EQ(again.result, "+10");
  EXPECT_EQ(c.exec("SELECT balance FROM " + table + " WHERE id = 'a'").rows[0][0], std::optional<std::string>("10"));
}

// The connection breaks while COMMIT is in flight: the effect and its record
// may or may not have committed, so the run is in doubt, not failed, and the
// record decides on the next run. The COMMIT is held at a deferred trigger
// waiting for an advisory lock this test holds, and its backend is
// terminated once pg_stat_activity shows it waiting there.
TEST_F(RunnerTest, HighCommitWhoseConnectionBreaksIsInDoubtAndTheRecordDecides) {
  const std::string table = RunnerTest::table("doubt");
  const std::string key = std::to_string(700000 + iteration());
  guard::PgConnection holder(pg_options());
  holder.exec("CREATE TABLE " + table + " (id text PRIMARY KEY)");
  holder.exec("CREATE FUNCTION " + table + "_hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM "
              "pg_advisory_lock(" + key + "); PERFORM pg_advisory_unlock(" + key + "); RETURN NULL; END $$");
  holder.exec("CREATE CONSTRAINT TRIGGER " + table + "_at_commit AFTER INSERT ON " + table +
              " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION " + table + "_hold()");
  holder.exec("SELECT pg_advisory_lock(" + key + ")");

  auto cls = low_class();
  cls.consequence = Consequence::high;
  auto po = pg_options();
  po.statement_timeout = 60s;  // the held COMMIT is ended by the kill, not by a timeout
  job::GuardedRunner runner(leases, cls, {.postgres = po});
  auto insert = [&](job::JobContext& ctx) {
    ctx.transaction()->exec("INSERT INTO " + table + " VALUES ($1)", {ctx.unit().id});
    return std::string("inserted");
  };
  std::atomic<bool> killed{false};
  std::thread killer([&] {
    guard::PgConnection watch(pg_options());
    const bool seen = test::eventually(
        [&] {
          auto r = watch.exec(
              "SELECT pid FROM pg_stat_activity WHERE query = 'COMMIT' AND state = 'active' AND wait_event_type = "
              "'Lock' AND pid <> pg_backend_pid()");
          if (r.rows.empty()) return false;
          watch.exec("SELECT pg_terminate_backend($1::int)", {r.rows[0][0].value()});
          return true;
        },
        30s);
    killed = seen;
  });
  const auto r = runner.run({.id = "d", .run_id = "r"}, insert);
  killer.join();
  ASSERT_TRUE(killed) << "the COMMIT was never seen waiting; outcome " << job::to_string(r.outcome) << ": " << r.detail;
  EXPECT_EQ(r.outcome, Outcome::in_doubt) << r.detail;
  EXPECT_FALSE(r.ok());
  EXPECT_STREQ(job::to_string(r.outcome), "in_doubt");
  EXPECT_NE(r.detail.find("COMMIT"), std::string::npos) << r.detail;

  // The terminated backend rolled back: the record says not done, and the
  // next run does the work once.
  holder.exec("SELECT pg_advisory_unlock(" + key + ")");
  EXPECT_EQ(holder.exec("SELECT count(*) FROM " + table).rows[0][0], std::optional<std::string>("0"));
  const auto again = runner.run({.id = "d", .run_id = "r"}, insert);
  EXPECT_EQ(again.outcome, Outcome::completed) << again.detail;
  EXPECT_EQ(holder.exec("SELECT count(*) FROM " + table).rows[0][0], std::optional<std::string>("1"));
}

TEST_F(RunnerTest, HighWithAStaleFenceReportsStaleAndCountsIt) {
  const std::string table = RunnerTest::table("ledger");
  {
    guard::PgConnection c(pg_options());
    // A newer holder already wrote with a token far in the future.
    c.exec("CREATE TABLE " + table + " (id text PRIMARY KEY, v int NOT NULL, fence bigint NOT NULL)");
    c.exec("INSERT INTO " + table + " VALUES ('s', 0, 9223372036854775000)");
  }
  auto cls = low_class();
  cls.consequence = Consequence::high;
  job::GuardedRunner runner(leases, cls, {.postgres = pg_options()});
  auto r = runner.run({.id = "s", .run_id = "r"}, [&](job::JobContext& ctx) {
    auto res = ctx.transaction()->fenced_update(
        guard::FencedUpdate{.table = table, .assignments = "v = 1", .id = "s"},
        *ctx.fence());
    if (!res.accepted()) throw Error(errc::stale_fence, "ledger refused fence " + std::to_string(*ctx.fence()));
    return std::string();
  });
  EXPECT_EQ(r.outcome, Outcome::stale) << r.detail;
  EXPECT_EQ(metrics().stale_writes_rejected_total, 1u);
}

TEST_F(RunnerTest, HighClassFailOpenIsStillSerialisedAndRecordedByPostgres) {
  auto cls = low_class();
  cls.consequence = Consequence::high;
  cls.on_redis_down = RedisDownPolicy::fail_open;
  job::GuardedRunner runner(leases, cls, {.postgres = pg_options()});
  server->stop();
  int runs = 0;
  auto effect = [&](job::JobContext& ctx) {
    ++runs;
    EXPECT_FALSE(ctx.fence().has_value());
    EXPECT_NE(ctx.transaction(), nullptr);
    return std::string("x");
  };
  auto r = runner.run({.id = "h", .run_id = "r"}, effect);
  EXPECT_EQ(r.outcome, Outcome::completed) << r.detail;
  EXPECT_TRUE(r.fail_open);
  EXPECT_EQ(runner.run({.id = "h", .run_id = "r"}, effect).outcome, Outcome::already_done);
  EXPECT_EQ(runs, 1);
}

TEST_F(RunnerTest, ChunkCheckpointsLetARunResumeAfterTheWorkerCrashed) {
  char tmpl[] = "/tmp/jobguard-chunks-XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  close(fd);
  const std::string log = tmpl;
  guard::PgCompletionStore done(pg_options());
  auto cls = moderate_class();
  cls.long_running = true;
  cls.ttl = 600ms;
  cls.hard_timeout = 60s;
  cls.wait = 5s;  // the survivor waits out the dead worker's lock
  const job::Unit unit{.id = "big", .run_id = "2026-11", .chunks = 10};
  const auto conn = options();
  const auto pg = pg_options();

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The worker that crashes: its own client and scheduler, a real process
    // death (SIGKILL: no destructor, no release) in the middle of chunk 6.
    redis::Client c(conn);
    auto s = LeaseScheduler::create(LockService::create(c, KeyBuilder(prefix())));
    guard::PgCompletionStore store(pg);
    job::GuardedRunner r(s, cls, {.completions = &store});
    r.run(unit, [&](job::JobContext& ctx) {
      if (ctx.chunk() == 6) ::raise(SIGKILL);
      std::ofstream(log, std::ios::app) << "A" << ctx.chunk() << "\n" << std::flush;
      return std::string();
    });
    _exit(3);  // not reached
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "status " << st;

  job::GuardedRunner runner(leases, cls, {.completions = &done});
  auto r = runner.run(unit, [&](job::JobContext& ctx) {
    std::ofstream(log, std::ios::app) << "B" << ctx.chunk() << "\n" << std::flush;
    return std::string();
  });
  EXPECT_EQ(r.outcome, Outcome::completed) << r.detail;
  EXPECT_EQ(r.chunks_skipped, 6);
  EXPECT_EQ(r.chunks_run, 4);

  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "A0\nA1\nA2\nA3\nA4\nA5\nB6\nB7\nB8\nB9\n");
  ::unlink(tmpl);
  EXPECT_TRUE(done.find(cls_name(), "invoice:big", "2026-11"));
  EXPECT_EQ(runner.run(unit, [](job::JobContext&) { return std::string(); }).outcome, Outcome::already_done);
}
#endif  // the PostgreSQL row

TEST_F(RunnerTest, LostLeaseStopsAChunkedUnitBeforeTheNextChunk) {
  guard::RedisCompletionStore done(*client);
  auto cls = low_class();
  cls.long_running = true;
  cls.ttl = 3s;
  cls.hard_timeout = 60s;
  job::GuardedRunner runner(leases, cls, {.completions = &done});
  std::vector<int> ran;
  auto r = runner.run({.id = "L", .run_id = "r", .chunks = 5}, [&](job::JobContext& ctx) {
    ran.push_back(ctx.chunk());
    if (ctx.chunk() == 1) {
      // An operator force-releases the lock (or it expired during a pause).
      client->exec({"DEL", ctx.lock_key()});
      EXPECT_TRUE(test::eventually([&] { return ctx.stop_token().stop_requested(); }, 5s));
    }
    return std::string();
  });
  EXPECT_EQ(r.outcome, Outcome::lease_lost) << r.detail;
  EXPECT_EQ(ran, (std::vector<int>{0, 1}));
  EXPECT_TRUE(done.find(cls_name(), "invoice:L", "r#chunk-1"));  // chunk 1's effect ran: its checkpoint stands
  EXPECT_FALSE(done.find(cls_name(), "invoice:L", "r"));
}

TEST_F(RunnerTest, HardTimeoutReportsTimedOut) {
  guard::RedisCompletionStore done(*client);
  auto cls = low_class();
  cls.long_running = true;
  cls.ttl = 3s;
  cls.hard_timeout = 200ms;
  cls.min_time_left = 10ms;
  job::GuardedRunner runner(leases, cls, {.completions = &done});
  auto r = runner.run({.id = "T", .run_id = "r", .chunks = 50}, [&](job::JobContext& ctx) {
    // Chunk 0 outlasts the hard timeout: the lease's loop says so, and the
    // next chunk must not start. Waiting for that word, not a fixed 400 ms,
    // keeps a slow loop (a sanitizer's, on a busy host) from running on.
    if (ctx.chunk() == 0) {
      EXPECT_TRUE(test::eventually([&] { return ctx.stop_token().stop_requested(); }, 10s));
    }
    return std::string();
  });
  EXPECT_EQ(r.outcome, Outcome::timed_out) << r.detail;
  EXPECT_EQ(r.chunks_run, 1);
}

TEST_F(RunnerTest, ShortTtlIsCheckedBeforeTheSideEffect) {
  // The lease's time is read from a clock the test moves: each chunk takes
  // 150 ms of it, whatever the host's scheduler does to the real time.
  ManualClock clock;
  auto own_leases = LeaseScheduler::create(
      LockService::create(*client, LockServiceOptions{.keys = KeyBuilder(prefix()), .clock = &clock}));
  guard::RedisCompletionStore done(*client);
  auto cls = low_class();
  cls.ttl = 300ms;
  cls.min_time_left = 100ms;
  job::GuardedRunner runner(own_leases, cls, {.completions = &done});
  std::vector<int> ran;
  auto r = runner.run({.id = "S", .run_id = "r", .chunks = 3}, [&](job::JobContext& ctx) {
    ran.push_back(ctx.chunk());
    clock.advance(150ms);  // chunk 1 starts with ~145 ms left, chunk 2 with none
    return std::string();
  });
  EXPECT_EQ(r.outcome, Outcome::lease_lost) << r.detail;
  EXPECT_NE(r.detail.find("ms needed"), std::string::npos) << r.detail;
  EXPECT_EQ(ran, (std::vector<int>{0, 1}));
}

TEST_F(RunnerTest, DeclarationsThatBreakTheDecisionMatrixAreRefused) {
  guard::RedisCompletionStore done(*client);
  guard::RedisIdempotencyStore idem(*client);
  auto expect_refused = [&](job::LockClass cls, job::RunnerBackends b, const std::string& needle) {
    try {
      job::GuardedRunner r(leases, cls, std::move(b));
      ADD_FAILURE() << "accepted; wanted an error with " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::invalid_argument));
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto high = low_class();
  high.consequence = Consequence::high;
  expect_refused(high, {}, "needs PostgreSQL");
#ifdef JOBGUARD_TESTS_WITHOUT_POSTGRES
  // A Redis-only build: refused by name even with PostgreSQL's options given.
  expect_refused(high, {.postgres = guard::PgOptions{.url = "postgresql://postgres@127.0.0.1:1/postgres"}},
                 "built without it (JOBGUARD_WITH_POSTGRES=OFF)");
#endif
  expect_refused(low_class(), {}, "needs a completion store");
  expect_refused(low_class(), {.completions = &done, .idempotency = &idem}, "moderate row");
  auto lr = low_class();
  lr.long_running = true;
  expect_refused(lr, {.completions = &done}, "hard_timeout");
  // Every acquire would refuse it: refused once, here, not at each job.
  auto too_long = low_class();
  too_long.ttl = leases->service().max_ttl() + std::chrono::seconds(1);
  expect_refused(too_long, {.completions = &done}, "is above the max TTL");

  job::GuardedRunner ok(leases, low_class(), {.completions = &done});
  auto bad_unit = [&](job::Unit u, const std::string& needle) {
    try {
      ok.run(u, [](job::JobContext&) { return std::string(); });
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  bad_unit({.id = "", .run_id = "r"}, "without id");
  bad_unit({.id = "x", .run_id = ""}, "without run_id");
  bad_unit({.id = "a b", .run_id = "r"}, "invoice:a b");
}

namespace {

// Injection: the runner reads a plain lock's safe time from the lock
// service's clock and counts into the service's registry (or its own), so a
// test crosses a TTL by moving a clock, and its numbers stay out of the
// process-wide registry.
TEST_F(RunnerTest, ClockAndRegistryComeFromTheLockServiceOrTheBackends) {
  ManualClock clock;
  observe::Registry mine;
  auto svc = LockService::create(*client, LockServiceOptions{.keys = KeyBuilder(prefix()), .clock = &clock,
                                                              .metrics = &mine});
  auto own_leases = LeaseScheduler::create(svc);
  guard::RedisCompletionStore done(*client, {.prefix = "jgt:clock:done:"});
  job::GuardedRunner runner(own_leases, low_class(), {.completions = &done});
  std::chrono::milliseconds before{0}, after{0};
  bool refused = false;
  auto r = runner.run({.id = "7", .run_id = "r"}, [&](job::JobContext& ctx) {
    before = ctx.safe_time_left();
    clock.advance(6s);  // past the 5 s TTL, without sleeping
    after = ctx.safe_time_left();
    try {
      ctx.ensure();
    } catch (const Error& e) {
      refused = e.code() == make_error_code(errc::lease_lost);
    }
    return std::string();
  });
  EXPECT_EQ(r.outcome, Outcome::completed) << r.detail;
  EXPECT_GT(before, 4s);
  EXPECT_EQ(after.count(), 0);
  EXPECT_TRUE(refused) << "ensure() must refuse once the clock passed the lock's safe time";
  EXPECT_EQ(r.elapsed, 6s) << "elapsed is read from the same clock";
  ASSERT_TRUE(mine.snapshot(cls_name()).has_value());
  EXPECT_EQ(mine.snapshot(cls_name())->acquisitions_total, 1u);
  EXPECT_FALSE(observe::Registry::global().snapshot(cls_name()).has_value())
      << "the run counted into the process-wide registry";

  // RunnerBackends::registry wins over the service's.
  observe::Registry theirs;
  job::GuardedRunner other(own_leases, low_class(), {.completions = &done, .registry = &theirs});
  auto r2 = other.run({.id = "7", .run_id = "r"}, [](job::JobContext&) { return std::string(); });
  EXPECT_EQ(r2.outcome, Outcome::already_done) << r2.detail;
  ASSERT_TRUE(theirs.snapshot(cls_name()).has_value());
}


// (These tests count commands: their services read the server's clock only
// in their checks and grants, without the clock probe's TIME.)
// A moderate job whose record and key live in Redis beside its lock is one
// call to claim (record checked, lock granted, key claimed) and one to
// finish (key completed, record written, lock released): the client counts
// what it sent. The lock's numbers are counted as the step-by-step path
// counts them.
// The one-call finish releases like Lock::release: it wakes the waiter that
// has waited longest (the head of the default-mode line), not the herd. The
// line is reversed by hand: Redis hands a message to a channel's subscribers
// in the order they subscribed, so a herd would be won in arrival order.
TEST_F(RunnerTest, OneCallFinishWakesTheLongestWaitingWaiterNotTheHerd) {
  auto svc = LockService::create(*client, LockServiceOptions{.keys = KeyBuilder(prefix()), .quarantine = {.recheck = 1h, .clock_probe = 0ms}});
  auto own = LeaseScheduler::create(svc);
  guard::RedisCompletionStore done(*client);
  guard::RedisIdempotencyStore idem(*client);
  auto cls = moderate_class();
  cls.ttl = 30s;  // no renewal while the test counts commands
  job::GuardedRunner runner(own, cls, {.completions = &done, .idempotency = &idem});
  for (const char* id : {"48", "49"})
    ASSERT_EQ(runner.run({.id = id, .run_id = "r"}, [](job::JobContext&) { return std::string("ok"); }).outcome,
              Outcome::completed);
  std::promise<void> inside, go;
  auto go_f = go.get_future().share();
  std::thread job([&] {
    auto r = runner.run({.id = "50", .run_id = "r"}, [&](job::JobContext&) {
      inside.set_value();
      go_f.wait_for(20s);
      return std::string("ok");
    });
    EXPECT_EQ(r.outcome, Outcome::completed) << r.detail;
  });
  ASSERT_EQ(inside.get_future().wait_for(10s), std::future_status::ready);
  const std::string resource = "invoice:50";
  const std::string line = KeyBuilder(prefix()).waiters_key(resource);
  const LockOptions slow{.ttl = 10s, .wait = 20s, .backoff_min = 10s, .backoff_max = 10s};
  std::vector<std::unique_ptr<redis::Client>> clients;
  std::vector<std::shared_ptr<LockService>> services;
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::optional<Lock>> held(2);
  std::vector<std::thread> waiters;
  for (int i = 0; i < 2; ++i) {
    clients.push_back(std::make_unique<redis::Client>(options()));
    ASSERT_TRUE(clients.back()->wait_connected(5s));
    services.push_back(
        LockService::create(*clients.back(), LockServiceOptions{.keys = KeyBuilder(prefix()), .quarantine = {.recheck = 1h, .clock_probe = 0ms}}));
    waiters.emplace_back([&, i] {
      auto l = services[i]->acquire(resource, slow);
      std::lock_guard g(mu);
      order.push_back(i);
      held[i] = std::move(l);
    });
    ASSERT_TRUE(test::eventually([&] { return client->exec({"ZCARD", line}).integer == i + 1; }, 5s));
  }
  auto in_line = client->exec(redis::Command{"ZRANGE", line, "0", "-1", "WITHSCORES"});
  ASSERT_TRUE(in_line.is_array() && in_line.elements.size() == 4);
  client->exec(redis::Command{"ZADD", line, "XX", in_line.elements[1].str, in_line.elements[2].str,
                              in_line.elements[3].str, in_line.elements[0].str});
  // The waiter behind the head: a herd would have it try too (one call on
  // its client); its own poll is 5-10 s away.
  const auto behind0 = clients[0]->stats().commands;
  const auto c0 = client->stats().commands;
  go.set_value();
  job.join();
  EXPECT_EQ(client->stats().commands - c0, 1u) << "the one-call finish";
  auto granted = [&] {
    std::lock_guard g(mu);
    return order.size();
  };
  ASSERT_TRUE(test::eventually([&] { return granted() == 1; }, 5s)) << "the finish woke nobody (their poll is 10 s)";
  std::this_thread::sleep_for(100ms);
  {
    std::lock_guard g(mu);
    EXPECT_EQ(order, std::vector<int>{1}) << "the head of the line, not the first subscriber";
  }
  EXPECT_EQ(clients[0]->stats().commands, behind0) << "the waiter behind the head was woken too (a herd)";
  EXPECT_EQ(client->exec({"ZCARD", line}).integer, 1);
  {
    std::lock_guard g(mu);
    ASSERT_TRUE(held[order.back()]);
    EXPECT_TRUE(held[order.back()]->release());
  }
  ASSERT_TRUE(test::eventually([&] { return granted() == 2; }, 5s));
  for (auto& t : waiters) t.join();
  ASSERT_TRUE(held[order[1]]) << "the second waiter, woken by the first's release";
  EXPECT_TRUE(held[order[1]]->release());
  held.clear();
  services.clear();
}

TEST_F(RunnerTest, ModerateRunIsOneRoundTripToClaimAndOneToFinish) {
  // No state-gate recheck during the test: its check would be a command too.
  auto svc = LockService::create(*client, LockServiceOptions{.keys = KeyBuilder(prefix()), .quarantine = {.recheck = 1h, .clock_probe = 0ms}});
  auto own = LeaseScheduler::create(svc);
  guard::RedisCompletionStore done(*client);
  guard::RedisIdempotencyStore idem(*client);
  auto cls = moderate_class();
  job::GuardedRunner runner(own, cls, {.completions = &done, .idempotency = &idem});
  int runs = 0;
  std::string lock_key, idem_key;
  long long key_during_effect = -1;
  auto effect = [&](job::JobContext& ctx) {
    ++runs;
    lock_key = ctx.lock_key();
    idem_key = ctx.idempotency_key();
    // Held while the effect runs; the key is written by the finish only
    // (its lease would end with the lock: docs/runner.md).
    EXPECT_FALSE(client->exec({"GET", lock_key}).is_nil());
    key_during_effect = client->exec({"EXISTS", "jobguard:idem:" + idem_key}).integer;
    return std::string("ch_40");
  };
  // Warm: the service's state gate has checked the server (until then a
  // claim goes step by step), and the scripts are loaded (a first EVALSHA
  // answers NOSCRIPT and is sent again as EVAL).
  for (const char* id : {"38", "39"}) ASSERT_EQ(runner.run({.id = id, .run_id = "r"}, effect).outcome, Outcome::completed);
  const auto before = metrics();

  auto commands = [&] { return client->stats().commands; };
  // What the two scripts cost the server is their redis.calls: counted per
  // command name from INFO commandstats (the scripts' own calls included).
  auto server_calls = [&] {
    std::map<std::string, long> n;
    const std::string text = client->exec({"INFO", "commandstats"}).str;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      const auto colon = line.find(':'), calls = line.find("calls=");
      if (line.rfind("cmdstat_", 0) != 0 || colon == std::string::npos || calls == std::string::npos) continue;
      n[line.substr(8, colon - 8)] = std::stol(line.substr(calls + 6));
    }
    return n;
  };
  const auto s0 = server_calls();
  auto c0 = commands();
  auto r = runner.run({.id = "40", .run_id = "r"}, effect);
  const auto ran_with = commands() - c0 - 2;  // less the effect's own GET and EXISTS
  auto s1 = server_calls();
  ASSERT_EQ(r.outcome, Outcome::completed) << r.detail;
  EXPECT_EQ(ran_with, 3u) << "the claim's SET NX PX and EXISTS (no script: composed.hpp's plain form), the finish";
  auto delta = [&](const std::string& cmd) { return s1[cmd] - (s0.count(cmd) ? s0.at(cmd) : 0); };
  // A unit's first attempt: one EXISTS finds neither its record nor its key,
  // so the claim reads neither again and writes only the lock; the finish
  // reads the clock once for both the key and the record, reads the key and
  // writes each once.
  EXPECT_EQ(delta("exists"), 2) << "the claim's, and the effect's look at the key";
  EXPECT_EQ(key_during_effect, 0) << "the key is not written before the effect";
  EXPECT_EQ(delta("get"), 3)
      << "the effect's look at the lock, the release's, and the key's owner at the finish only (with the key "
         "missing, so is the record)";
  EXPECT_EQ(delta("time"), 1) << "the finish's, for the key and the record";
  EXPECT_EQ(delta("set"), 3) << "the grant, the key completed and the record: one SET each, their expiry in it";
  EXPECT_EQ(delta("pexpire") + delta("hset") + delta("hmget"), 0) << "key and record are strings (stored.lua)";
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(client->exec({"EXISTS", lock_key}).integer, 0) << "released";
  auto rec = done.find(cls_name(), "invoice:40", "r");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->result, "ch_40");
  auto b = idem.begin(idem_key, "r", 1s);
  EXPECT_EQ(b.status, guard::BeginStatus::completed);
  EXPECT_EQ(b.result, "ch_40");
  const auto after = metrics();
  EXPECT_EQ(after.acquisitions_total - before.acquisitions_total, 1u);
  EXPECT_EQ(after.releases_total - before.releases_total, 1u);
  EXPECT_EQ(after.hold_seconds.count - before.hold_seconds.count, 1u);
  EXPECT_EQ(after.wait_seconds.count - before.wait_seconds.count, 1u);

  // The retry of finished work: the plain claim is granted and its EXISTS
  // finds the record; the grant is handed back unused (not counted), the
  // record read, and nothing runs or is written.
  const auto record_before = client->exec({"GET", done.key_for(cls_name(), "invoice:40", "r")}).str;
  auto again = runner.run({.id = "40", .run_id = "r"}, effect);
  EXPECT_EQ(again.outcome, Outcome::already_done);
  EXPECT_EQ(again.result, "ch_40");
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(client->exec({"EXISTS", lock_key}).integer, 0) << "the grant was given back";
  EXPECT_EQ(client->exec({"GET", done.key_for(cls_name(), "invoice:40", "r")}).str, record_before);
  const auto again_m = metrics();
  EXPECT_EQ(again_m.acquisitions_total, after.acquisitions_total);
  EXPECT_EQ(again_m.releases_total, after.releases_total);

  // Busy (try-once): one round trip (SET NX PX and EXISTS), the other
  // worker's lock and nothing else touched.
  auto other = svc->acquire("invoice:41", LockOptions{.ttl = 5s});
  ASSERT_TRUE(other);
  c0 = commands();
  auto busy = runner.run({.id = "41", .run_id = "r"}, effect);
  EXPECT_EQ(busy.outcome, Outcome::busy);
  EXPECT_NE(busy.detail.find("invoice:41"), std::string::npos) << busy.detail;
  EXPECT_EQ(commands() - c0, 2u);
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(client->exec({"EXISTS", "jobguard:idem:" + cls_name() + "/invoice:41/r"}).integer, 0)
      << "no key claimed without the lock";
  EXPECT_EQ(metrics().contended_total - after.contended_total, 1u);
  EXPECT_TRUE(other->release());
}

// The plain claim (SET NX PX, then EXISTS: composed.hpp) skips acquire.lua's
// eviction check, so it is used only where the server does not evict: on a
// server that does, a unit's first claim is the script again, which compares
// evicted_keys with the gate's count in the same call as the grant.
TEST_F(RunnerTest, OnAServerThatEvictsTheClaimIsTheScriptThatChecksEvictions) {
  guard::RedisCompletionStore done(*client);
  guard::RedisIdempotencyStore idem(*client);
  auto script_runs = [&] {
    const std::string text = client->exec({"INFO", "commandstats"}).str;
    std::int64_t n = 0;
    for (const std::string name : {"evalsha", "eval"}) {
      const auto line = text.find("cmdstat_" + name + ":calls=");
      if (line == std::string::npos) continue;
      n += std::stoll(text.substr(line + name.size() + 15));
      const auto failed = text.find("failed_calls=", line);
      if (failed != std::string::npos) n -= std::stoll(text.substr(failed + 13));
    }
    return n;
  };
  // One unit through `svc`'s runner after two warm ones (the gate checked,
  // the scripts loaded): the scripts the server ran for it.
  auto scripts_for_one_run = [&](std::shared_ptr<LockService> svc, const std::string& tag) {
    job::GuardedRunner runner(LeaseScheduler::create(svc), moderate_class(),
                              {.completions = &done, .idempotency = &idem});
    auto effect = [](job::JobContext&) { return std::string("ok"); };
    for (const char* id : {"a", "b"})
      EXPECT_EQ(runner.run({.id = tag + id, .run_id = "r"}, effect).outcome, Outcome::completed);
    const auto before = script_runs();
    EXPECT_EQ(runner.run({.id = tag + "c", .run_id = "r"}, effect).outcome, Outcome::completed);
    return script_runs() - before;
  };
  auto service = [&] {
    return LockService::create(*client, LockServiceOptions{.keys = KeyBuilder(prefix()), .quarantine = {.recheck = 1h, .clock_probe = 0ms}});
  };
  EXPECT_EQ(scripts_for_one_run(service(), "keep-"), 1) << "the finish; the claim is plain";
  // Evicting, with room to spare: what matters is that it may evict.
  client->exec({"CONFIG", "SET", "maxmemory", "1gb"});
  client->exec({"CONFIG", "SET", "maxmemory-policy", "allkeys-lru"});
  EXPECT_EQ(scripts_for_one_run(service(), "evict-"), 2) << "the claim's script and the finish";
}

// The finish finds the key taken over while the effect ran (its lease passed
// and another worker claimed it): nothing is recorded by the one call, and
// the steps report it as they always have — the key is not ours, lease lost.
TEST_F(RunnerTest, OneCallFinishLeavesAKeyTakenOverToTheStepsWhichReportIt) {
  guard::RedisCompletionStore done(*client);
  guard::RedisIdempotencyStore idem(*client);
  auto cls = moderate_class();
  job::GuardedRunner runner(leases, cls, {.completions = &done, .idempotency = &idem});
  auto r = runner.run({.id = "50", .run_id = "r"}, [&](job::JobContext& ctx) {
    client->exec({"DEL", "jobguard:idem:" + ctx.idempotency_key()});
    EXPECT_EQ(idem.begin(ctx.idempotency_key(), "r", 60s, "another-worker").status, guard::BeginStatus::claimed);
    return std::string("ch_50");
  });
  EXPECT_EQ(r.outcome, Outcome::lease_lost) << r.detail;
  EXPECT_NE(r.detail.find("another-worker"), std::string::npos) << r.detail;
  EXPECT_FALSE(done.find(cls_name(), "invoice:50", "r")) << "a record for an effect whose key was not ours";
  EXPECT_EQ(client->exec({"EXISTS", "jgt:lock:{invoice:50}"}).integer, 0) << "the lock is released all the same";
}

// The key's write deferred to the finish: a run whose lock was lost while
// another run of the unit holds it now writes neither key nor record (the
// holder does, when it ends) and reports the lost lock.
TEST_F(RunnerTest, ADeferredKeyIsLeftToTheRunThatHoldsTheLockNow) {
  guard::RedisCompletionStore done(*client);
  guard::RedisIdempotencyStore idem(*client);
  auto cls = moderate_class();
  job::GuardedRunner runner(leases, cls, {.completions = &done, .idempotency = &idem});
  warm(runner);
  std::optional<Lock> other;
  std::string key;
  auto r = runner.run({.id = "51", .run_id = "r"}, [&](job::JobContext& ctx) {
    key = ctx.idempotency_key();
    EXPECT_EQ(client->exec({"EXISTS", "jobguard:idem:" + key}).integer, 0) << "deferred";
    client->exec({"DEL", ctx.lock_key()});  // our lock expired...
    other = leases->service().acquire("invoice:51", LockOptions{.ttl = 5s});  // ...and another run holds it
    EXPECT_TRUE(other);
    return std::string("ch_51");
  });
  ASSERT_TRUE(other);
  EXPECT_EQ(r.outcome, Outcome::lease_lost) << r.detail;
  EXPECT_NE(r.detail.find("the lock is held by"), std::string::npos) << r.detail;
  EXPECT_FALSE(done.find(cls_name(), "invoice:51", "r")) << "the holder records it when it ends";
  EXPECT_EQ(client->exec({"EXISTS", "jobguard:idem:" + key}).integer, 0);
  EXPECT_EQ(client->exec({"GET", "jgt:lock:{invoice:51}"}).str, other->token()) << "the holder's lock untouched";
  EXPECT_TRUE(other->release());
}

// A run that outlived its lock with nobody after it still states the fact:
// key and record written, the key with the same fields a claim and a
// complete leave, so no reader can tell the two paths apart.
TEST_F(RunnerTest, ADeferredKeyIsWrittenByARunThatOutlivedItsLockAlone) {
  guard::RedisCompletionStore done(*client);
  guard::RedisIdempotencyStore idem(*client);
  auto cls = moderate_class();
  job::GuardedRunner runner(leases, cls, {.completions = &done, .idempotency = &idem});
  warm(runner);
  std::string key;
  auto r = runner.run({.id = "52", .run_id = "r"}, [&](job::JobContext& ctx) {
    key = ctx.idempotency_key();
    EXPECT_EQ(client->exec({"EXISTS", "jobguard:idem:" + key}).integer, 0) << "deferred";
    client->exec({"DEL", ctx.lock_key()});
    return std::string("ch_52");
  });
  EXPECT_EQ(r.outcome, Outcome::completed) << r.detail;
  auto rec = done.find(cls_name(), "invoice:52", "r");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->result, "ch_52");
  auto b = idem.begin(key, "r", 1s);
  EXPECT_EQ(b.status, guard::BeginStatus::completed);
  EXPECT_EQ(b.result, "ch_52");

  // The stored key's head (stored.lua: 'i1 <state> <since> <lease_until>
  // <done>'), numbers as N: the same fields in both.
  auto fields = [&](const std::string& k) {
    const std::string v = client->exec({"GET", "jobguard:idem:" + k}).str;
    return std::regex_replace(v.substr(0, v.find('\n')), std::regex("[0-9]+"), "N");
  };
  const std::string stepwise = cls_name() + "/stepwise";
  auto c = idem.begin(stepwise, "r", 30s);
  idem.complete(stepwise, c.owner, "x");
  EXPECT_EQ(fields(key), fields(stepwise));
  EXPECT_EQ(fields(key), "iN completed N N N");
  EXPECT_GT(client->exec({"PTTL", "jobguard:idem:" + key}).integer, 0) << "kept for the store's retention";
}

// The one-call finish fails part-way (a script error: here a waiters key of
// the wrong type, after its release has run): the deferred key was never
// written, so the steps claim it then under our owner and complete it, and
// the record follows — the run is completed, not lost.
TEST_F(RunnerTest, ADeferredKeyIsClaimedByTheStepsWhenTheOneCallFinishFails) {
  guard::RedisCompletionStore done(*client);
  guard::RedisIdempotencyStore idem(*client);
  job::GuardedRunner runner(leases, moderate_class(), {.completions = &done, .idempotency = &idem});
  warm(runner);
  const std::string waiters = leases->service().keys().waiters_key("invoice:53");
  std::string key;
  auto r = runner.run({.id = "53", .run_id = "r"}, [&](job::JobContext& ctx) {
    key = ctx.idempotency_key();
    EXPECT_EQ(client->exec({"EXISTS", "jobguard:idem:" + key}).integer, 0) << "deferred";
    client->exec({"SET", waiters, "not-a-zset"});
    return std::string("ch_53");
  });
  client->exec({"DEL", waiters});
  EXPECT_EQ(r.outcome, Outcome::completed) << r.detail;
  auto rec = done.find(cls_name(), "invoice:53", "r");
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->result, "ch_53");
  auto b = idem.begin(key, "r", 1s);
  EXPECT_EQ(b.status, guard::BeginStatus::completed);
  EXPECT_EQ(b.result, "ch_53");
  EXPECT_EQ(client->exec({"EXISTS", "jgt:lock:{invoice:53}"}).integer, 0) << "released";
}

// A fenced class through the one-call claim: the token is issued by the
// grant inside it, above every earlier one, and the effect sees it.
TEST_F(RunnerTest, OneCallClaimIssuesTheFenceTheEffectSees) {
  guard::RedisCompletionStore done(*client);
  auto cls = low_class();
  cls.fenced = true;
  job::GuardedRunner runner(leases, cls, {.completions = &done});
  std::optional<std::int64_t> seen;
  std::vector<std::int64_t> fences;
  for (const char* run : {"r1", "r2"}) {
    auto r = runner.run({.id = "60", .run_id = run}, [&](job::JobContext& ctx) {
      seen = ctx.fence();
      return std::string();
    });
    ASSERT_EQ(r.outcome, Outcome::completed) << r.detail;
    ASSERT_TRUE(seen && r.fence);
    EXPECT_EQ(*seen, *r.fence);
    EXPECT_EQ(std::to_string(*seen), client->exec({"GET", locks->keys().fence_key("invoice:60")}).str);
    fences.push_back(*seen);
  }
  EXPECT_GT(fences[1], fences[0]);
}

}  // namespace
