// `jobguard doctor`'s checks, each against a real redis-server configured the
// bad way (and a healthy one), and the PostgreSQL checks against a real server.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <thread>

#include "jobguard/admin.hpp"
#include "jobguard/testing/embedded_redis.hpp"
#include "jobguard/ops/doctor.hpp"
#ifndef JOBGUARD_TESTS_WITHOUT_POSTGRES
#include "jobguard/guard/postgres.hpp"
#include "support/postgres_fixture.hpp"
#endif
#include "support/redis_fixture.hpp"
#include "support/cluster_redis.hpp"
#include "support/sentinel_redis.hpp"
#include "support/tls_certs.hpp"
#include "integration/ops/exposition_parser.hpp"
#include "jobguard/error.hpp"
#include "jobguard/job/catalog.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/rwlock.hpp"
#include "jobguard/semaphore.hpp"

namespace jobguard::ops {
namespace {

using namespace std::chrono_literals;

redis::ConnectionOptions options_for(const EmbeddedRedis& s) {
  redis::ConnectionOptions o;
  o.host = s.host();
  o.port = s.port();
  o.command_timeout = 3s;
  o.connect_timeout = 2s;
  return o;
}

std::unique_ptr<EmbeddedRedis> start(std::vector<std::string> args, bool persistence = false) {
  EmbeddedRedisOptions o;
  o.extra_args = std::move(args);
  o.persistence = persistence;
  auto s = std::make_unique<EmbeddedRedis>(o);
  s->start();
  return s;
}

const CheckResult& find(const std::vector<CheckResult>& rs, const std::string& name) {
  auto it = std::find_if(rs.begin(), rs.end(), [&](const CheckResult& r) { return r.name == name; });
  if (it == rs.end()) throw std::runtime_error("no check " + name);
  return *it;
}

std::string dump(const std::vector<CheckResult>& rs) {
  std::string s;
  for (const auto& r : rs) s += std::string(to_string(r.status)) + " " + r.name + ": " + r.detail + " -> " + r.advice + "\n";
  return s;
}

std::vector<CheckResult> doctor(const EmbeddedRedis& s, redis::ConnectionOptions o, DoctorOptions d = {}) {
  (void)s;
  redis::Client c(o);
  c.wait_connected(2s);
  return check_redis(c, d);
}

TEST(Doctor, AHealthyServerPassesEveryConfigurationCheck) {
  auto s = start({"--appendonly", "yes", "--maxmemory-policy", "noeviction"}, true);
  const auto rs = doctor(*s, options_for(*s));
  for (const char* name : {"connection", "role", "replicas", "eviction", "evicted_keys", "persistence", "lua", "acl",
                           "clock", "clock_steps", "cluster", "shared_workload", "replica_confirmation", "semaphores",
                           "rwlocks"})
    EXPECT_EQ(find(rs, name).status, CheckStatus::ok) << name << "\n" << dump(rs);
  EXPECT_THROW(find(rs, "sentinel"), std::runtime_error) << "no sentinel check without Sentinel";
  // Latency depends on this shared machine's load; it must at least be measured.
  EXPECT_NE(find(rs, "latency").detail.find("PING median"), std::string::npos);
  // The probe cleaned up after itself.
  EXPECT_EQ(test::redis_command_at(s->host(), s->port(), "DBSIZE"), "0");
}

TEST(Doctor, AllkeysAndVolatileEvictionPoliciesFail) {
  for (const char* policy : {"allkeys-lru", "volatile-ttl", "allkeys-random", "volatile-lfu"}) {
    auto s = start({"--maxmemory", "100mb", "--maxmemory-policy", policy});
    const auto rs = doctor(*s, options_for(*s));
    EXPECT_EQ(find(rs, "eviction").status, CheckStatus::fail) << policy << "\n" << dump(rs);
    EXPECT_NE(find(rs, "eviction").advice.find("noeviction"), std::string::npos);
  }
}

TEST(Doctor, AnEvictingPolicyWithoutMaxmemoryWarns) {
  auto s = start({"--maxmemory-policy", "allkeys-lru"});
  EXPECT_EQ(find(doctor(*s, options_for(*s)), "eviction").status, CheckStatus::warn);
}

TEST(Doctor, EvictedKeysFail) {
  auto s = start({"--maxmemory", "2mb", "--maxmemory-policy", "allkeys-random"});
  const std::string big(4096, 'x');
  redis::Client c(options_for(*s));
  ASSERT_TRUE(c.wait_connected(2s));
  for (int i = 0; i < 2000 && test::redis_command_at(s->host(), s->port(), "INFO stats").find("evicted_keys:0") !=
                                  std::string::npos;
       ++i)
    c.exec(redis::Command{"SET", "cache:" + std::to_string(i), big});
  const auto rs = check_redis(c);
  EXPECT_EQ(find(rs, "evicted_keys").status, CheckStatus::fail) << dump(rs);
}

TEST(Doctor, NoPersistenceWarnsAndRdbOrAofIsOk) {
  auto none = start({});  // the fixture's default: --save "" --appendonly no
  const auto rs = doctor(*none, options_for(*none));
  EXPECT_EQ(find(rs, "persistence").status, CheckStatus::warn) << dump(rs);
  EXPECT_NE(find(rs, "persistence").advice.find("restart"), std::string::npos);
  auto rdb = start({}, true);
  EXPECT_EQ(find(doctor(*rdb, options_for(*rdb)), "persistence").status, CheckStatus::ok);
}

TEST(Doctor, AReplicaFailsTheRoleCheckAndThePrimaryListsIt) {
  auto primary = start({});
  auto replica = start({"--replicaof", primary->host(), std::to_string(primary->port())});
  const auto rs = doctor(*replica, options_for(*replica));
  EXPECT_EQ(find(rs, "role").status, CheckStatus::fail) << dump(rs);
  ASSERT_TRUE(test::eventually(
      [&] {
        return test::redis_command_at(primary->host(), primary->port(), "INFO replication").find("state=online") !=
               std::string::npos;
      },
      10s));
  const auto prs = doctor(*primary, options_for(*primary));
  EXPECT_EQ(find(prs, "role").status, CheckStatus::ok);
  EXPECT_EQ(find(prs, "replicas").status, CheckStatus::ok) << dump(prs);
  EXPECT_NE(find(prs, "replicas").detail.find("1 replica(s)"), std::string::npos);
  // A replica that stops acknowledging (SIGSTOP) lags: WARN.
  replica->pause();
  redis::Client c(options_for(*primary));
  ASSERT_TRUE(c.wait_connected(2s));
  EXPECT_TRUE(test::eventually([&] { return find(check_redis(c), "replicas").status == CheckStatus::warn; }, 15s));
  replica->resume();
}

// Behind Sentinel: every sentinel asked, the primary they name compared with
// the client's, the quorum checked; replicas= compared with the replicas
// connected.
// Sentinels behind TLS (sentinel_tls=yes): the check asks each over TLS with
// the URL's CA, as the client does.
TEST(Doctor, AsksSentinelsBehindTlsOverTls) {
  test::TlsCerts certs;
  test::SentinelRedis dep(1, 2);
  dep.sentinel_tls(certs.server_cert(), certs.server_key(), certs.ca());
  dep.start();
  auto o = redis::parse_url(dep.tls_url("ca=" + certs.ca()));
  o.command_timeout = 3s;
  o.connect_timeout = 2s;
  redis::Client c(o);
  ASSERT_TRUE(c.wait_connected(10s));
  auto rs = check_redis(c);
  const auto& s = find(rs, "sentinel");
  EXPECT_EQ(s.status, CheckStatus::ok) << dump(rs);
  EXPECT_NE(s.detail.find("2 of 2 sentinels answer, all name it"), std::string::npos) << s.detail;
}

TEST(Doctor, UnderstandsASentinelDeploymentAndReplicaConfirmation) {
  test::SentinelRedis dep;
  dep.start();
  auto o = redis::parse_url(dep.url("replicas=2"));
  o.command_timeout = 3s;
  o.connect_timeout = 2s;
  redis::Client c(o);
  ASSERT_TRUE(c.wait_connected(5s));
  auto rs = check_redis(c);
  const auto& s = find(rs, "sentinel");
  EXPECT_EQ(s.status, CheckStatus::ok) << dump(rs);
  EXPECT_NE(s.detail.find("master 'mymaster': 3 of 3 sentinels answer, all name it"), std::string::npos) << s.detail;
  EXPECT_NE(s.detail.find(fmt::format("the client uses 127.0.0.1:{}", dep.primary_port())), std::string::npos)
      << s.detail;
  EXPECT_NE(s.detail.find("2 replica(s) known; quorum: OK"), std::string::npos) << s.detail;
  const auto& rc = find(rs, "replica_confirmation");
  EXPECT_EQ(rc.status, CheckStatus::ok) << dump(rs);
  EXPECT_NE(rc.detail.find("replicas=2 with 2 connected replica(s); confirmed with WAIT"), std::string::npos)
      << rc.detail;

  // One sentinel down: WARN, naming it.
  const auto gone = dep.sentinel(2).port();
  dep.sentinel(2).kill();
  rs = check_redis(c);
  EXPECT_EQ(find(rs, "sentinel").status, CheckStatus::warn) << dump(rs);
  EXPECT_NE(find(rs, "sentinel").detail.find(fmt::format("unreachable: 127.0.0.1:{}", gone)), std::string::npos)
      << dump(rs);

  // More replicas asked for than connected: every grant would be refused.
  auto o3 = o;
  o3.lock_replicas = 3;
  redis::Client c3(o3);
  ASSERT_TRUE(c3.wait_connected(5s));
  rs = check_redis(c3);
  EXPECT_EQ(find(rs, "replica_confirmation").status, CheckStatus::fail) << dump(rs);
}

TEST(Doctor, LuaAndPermissionsRefusedByAclFail) {
  auto s = start({});
  ASSERT_EQ(test::redis_command_at(s->host(), s->port(), "ACL SETUSER noscript on >pw ~* &* +@all -eval -evalsha"),
            "OK");
  auto o = options_for(*s);
  o.user = "noscript";
  o.password = "pw";
  const auto rs = doctor(*s, o);
  EXPECT_EQ(find(rs, "lua").status, CheckStatus::fail) << dump(rs);
  EXPECT_EQ(find(rs, "acl").status, CheckStatus::fail);
  EXPECT_NE(find(rs, "acl").detail.find("EVAL, EVALSHA"), std::string::npos) << find(rs, "acl").detail;
  EXPECT_EQ(find(rs, "acl").detail.find("PUBLISH"), std::string::npos);
}

// Every release pops the default-mode waiters' line: a user without the
// sorted-set commands could take locks and never give them back.
TEST(Doctor, SortedSetCommandsRefusedByAclFailTheAclCheck) {
  auto s = start({});
  ASSERT_EQ(test::redis_command_at(s->host(), s->port(), "ACL SETUSER noline on >pw ~* &* +@all -zpopmin -zadd"),
            "OK");
  auto o = options_for(*s);
  o.user = "noline";
  o.password = "pw";
  const auto rs = doctor(*s, o);
  EXPECT_EQ(find(rs, "acl").status, CheckStatus::fail) << dump(rs);
  EXPECT_NE(find(rs, "acl").detail.find("ZADD, ZPOPMIN"), std::string::npos) << find(rs, "acl").detail;
  EXPECT_EQ(find(rs, "acl").detail.find("ZREM"), std::string::npos) << find(rs, "acl").detail;
}

TEST(Doctor, ARenamedEvalFailsTheLuaCheck) {
  // rename-command EVAL "" (a hardening guide's advice) removes scripting
  // without any ACL: every jobguard lock operation then fails.
  auto s = start({"--rename-command", "EVAL", "", "--rename-command", "EVALSHA", ""});
  const auto rs = doctor(*s, options_for(*s));
  EXPECT_EQ(find(rs, "lua").status, CheckStatus::fail) << dump(rs);
}

TEST(Doctor, KeysOutsideThePermittedPatternFailTheAclCheck) {
  auto s = start({});
  ASSERT_EQ(test::redis_command_at(s->host(), s->port(), "ACL SETUSER cacheonly on >pw ~cache:* &* +@all"), "OK");
  auto o = options_for(*s);
  o.user = "cacheonly";
  o.password = "pw";
  const auto rs = doctor(*s, o);
  const auto& acl = find(rs, "acl");
  EXPECT_EQ(acl.status, CheckStatus::fail) << dump(rs);
  EXPECT_NE(acl.detail.find("SET"), std::string::npos) << acl.detail;
  EXPECT_NE(acl.detail.find("cacheonly"), std::string::npos);
  EXPECT_EQ(find(rs, "lua").status, CheckStatus::ok);  // EVAL itself is allowed
}

TEST(Doctor, AUserWithoutTheFleetKeysFailsTheAclCheck) {
  auto s = start({});
  ASSERT_EQ(test::redis_command_at(s->host(), s->port(), "ACL SETUSER locksonly on >pw ~jobguard:* &* +@all"), "OK");
  auto o = options_for(*s);
  o.user = "locksonly";
  o.password = "pw";
  const auto rs = doctor(*s, o);
  const auto& acl = find(rs, "acl");
  EXPECT_EQ(acl.status, CheckStatus::fail) << dump(rs);
  EXPECT_NE(acl.detail.find("HINCRBY (fleet keys)"), std::string::npos) << acl.detail;
  EXPECT_EQ(acl.detail.find("SET,"), std::string::npos) << acl.detail;  // the lock keys themselves are allowed
  EXPECT_NE(acl.advice.find("~{jobguard:fleet}:*"), std::string::npos) << acl.advice;
}

TEST(Doctor, AStalledServerFailsTheLatencyCheck) {
  auto s = start({});
  redis::Client c(options_for(*s));
  ASSERT_TRUE(c.wait_connected(2s));
  s->pause();  // SIGSTOP: the PING cannot be answered before resume
  std::optional<CheckResult> r;
  std::thread t([&] { r = check_latency(c, DoctorOptions{.pings = 1}); });
  std::this_thread::sleep_for(400ms);
  s->resume();
  t.join();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, CheckStatus::fail) << r->detail;
}

TEST(Doctor, AClockOffsetWarnsThenFails) {
  auto s = start({});
  redis::Client c(options_for(*s));
  ASSERT_TRUE(c.wait_connected(2s));
  auto skewed = [](std::chrono::milliseconds by) {
    DoctorOptions o;
    o.now = [by] { return std::chrono::system_clock::now() + by; };
    return o;
  };
  EXPECT_EQ(check_clock(c, skewed(0ms)).status, CheckStatus::ok);
  const auto w = check_clock(c, skewed(2s));
  EXPECT_EQ(w.status, CheckStatus::warn) << w.detail;
  EXPECT_NE(w.detail.find("behind"), std::string::npos) << w.detail;  // the server is behind our (skewed) clock
  EXPECT_EQ(check_clock(c, skewed(-60s)).status, CheckStatus::fail);
}

// Lock clients write each forward step of the server's clock they find to
// the lock-state record (docs/lock-safety.md, "Server clock steps"): doctor
// warns with the count and the last step, and the watch exports the count.
TEST(Doctor, ServerClockStepsFoundByLockClientsWarnAndAreCounted) {
  auto s = start({});
  redis::Client c(options_for(*s));
  c.wait_connected(2s);
  // A value with a space: sent as arguments, not as a line hiredis would split.
  ASSERT_EQ(c.exec(redis::Command{"HSET", "jobguard:epoch", "clock_steps", "2", "clock_step_last", "3001 1700000000000"})
                .integer,
            2);
  const auto rs = check_redis(c);
  EXPECT_EQ(find(rs, "clock_steps").status, CheckStatus::warn) << dump(rs);
  EXPECT_NE(find(rs, "clock_steps").detail.find("stepped forward 2 time(s), the last by 3001 ms at 2023-11-14T22:13:20Z"),
            std::string::npos)
      << dump(rs);
  const auto text = redis_facts_to_prometheus(watch_redis(c), 0);
  EXPECT_NE(text.find("\njobguard_redis_clock_steps_total 2\n"), std::string::npos) << text;
}

TEST(Doctor, ClusterModeWithoutClusterYesFails) {
  const auto bus = pick_free_port();
  auto s = start({"--cluster-enabled", "yes", "--cluster-port", std::to_string(bus)});
  const auto rs = doctor(*s, options_for(*s));
  EXPECT_EQ(find(rs, "cluster").status, CheckStatus::fail) << dump(rs);
  EXPECT_NE(find(rs, "cluster").advice.find("cluster=yes"), std::string::npos) << dump(rs);
  // With cluster=yes, a node of a cluster that serves no slots (never
  // created) is a cluster that cannot serve: FAIL, with its state.
  auto o = options_for(*s);
  o.cluster = true;
  const auto rc = doctor(*s, o);
  EXPECT_EQ(find(rc, "cluster").status, CheckStatus::fail) << dump(rc);
  EXPECT_NE(find(rc, "cluster").detail.find("state fail"), std::string::npos) << dump(rc);
}

TEST(Doctor, AHealthyClusterWithClusterYesPasses) {
  test::ClusterRedis cluster(3, 0);
  cluster.start();
  auto o = redis::parse_url(cluster.url());
  o.command_timeout = 3s;
  redis::Client c(o);
  ASSERT_TRUE(c.wait_connected(5s));
  const auto rs = check_redis(c);
  EXPECT_EQ(find(rs, "cluster").status, CheckStatus::ok) << dump(rs);
  EXPECT_NE(find(rs, "cluster").detail.find("state ok, 16384 of 16384 slots served, 3 primaries"), std::string::npos)
      << dump(rs);
  // Waiters on a cluster use sharded pub/sub: the ACL check sends SPUBLISH.
  EXPECT_EQ(find(rs, "acl").status, CheckStatus::ok) << dump(rs);
  EXPECT_EQ(find(rs, "clock_steps").status, CheckStatus::ok) << dump(rs);
  // Each primary's record counts the steps of its own clock: doctor adds
  // them up and names the node of the latest.
  const auto records = admin::lock_state_records(c);
  ASSERT_EQ(records.size(), 3u);
  for (std::size_t i = 0; i < 2; ++i) {
    redis::CallOptions on;
    on.node = records[i].node;
    c.exec(redis::Command{"HSET", records[i].key, "clock_steps", std::to_string(i + 1), "clock_step_last",
                          fmt::format("{} {}", 4000 + i, 1700000000000 + i * 1000)},
           on);
  }
  const auto stepped = check_redis(c);
  EXPECT_EQ(find(stepped, "clock_steps").status, CheckStatus::warn) << dump(stepped);
  EXPECT_NE(find(stepped, "clock_steps").detail.find("stepped forward 3 time(s), the last by 4001 ms at "
                                                     "2023-11-14T22:13:21Z (server time) on " + records[1].address),
            std::string::npos)
      << dump(stepped);
  for (std::size_t i = 0; i < cluster.size(); ++i)
    ASSERT_EQ(cluster.on(cluster.node(i).port(), "ACL SETUSER nospub on >pw ~* &* +@all -spublish"), "OK");
  auto u = o;
  u.user = "nospub";
  u.password = "pw";
  redis::Client limited(u);
  ASSERT_TRUE(limited.wait_connected(5s));
  const auto lr = check_redis(limited);
  const auto& acl = find(lr, "acl");
  EXPECT_EQ(acl.status, CheckStatus::fail) << dump(lr);
  EXPECT_NE(acl.detail.find("refused SPUBLISH"), std::string::npos) << dump(lr);
  EXPECT_NE(acl.advice.find("+spublish +ssubscribe"), std::string::npos) << dump(lr);
}

TEST(Doctor, AServerFullOfOtherKeysWarnsOfASharedWorkload) {
  auto s = start({"--enable-debug-command", "yes"});
  ASSERT_EQ(test::redis_command_at(s->host(), s->port(), "DEBUG POPULATE 5000 cache"), "OK");
  EXPECT_EQ(find(doctor(*s, options_for(*s)), "shared_workload").status, CheckStatus::warn);
  auto ours = start({"--enable-debug-command", "yes"});
  ASSERT_EQ(test::redis_command_at(ours->host(), ours->port(), "DEBUG POPULATE 5000 jobguard:lock"), "OK");
  EXPECT_EQ(find(doctor(*ours, options_for(*ours)), "shared_workload").status, CheckStatus::ok);
}

TEST(Doctor, AnUnreachableServerIsOneConnectionFailure) {
  redis::ConnectionOptions o;
  o.port = pick_free_port();  // nobody listens there
  o.command_timeout = 300ms;
  o.connect_timeout = 300ms;
  redis::Client c(o);
  const auto rs = check_redis(c);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].name, "connection");
  EXPECT_EQ(rs[0].status, CheckStatus::fail);
  EXPECT_EQ(worst(rs), CheckStatus::fail);
}

#ifndef JOBGUARD_TESTS_WITHOUT_POSTGRES
class DoctorPg : public test::PostgresTest {};

TEST_F(DoctorPg, AnUnmigratedDatabaseFailsTheSchemaCheckAndAMigratedOnePasses) {
  const auto db = name("doc");
  guard::PgConnection admin(pg_options());
  admin.exec("DROP DATABASE IF EXISTS " + db);
  admin.exec("CREATE DATABASE " + db);
  const auto base = pg_options().url;
  const auto url = base.substr(0, base.rfind('/') + 1) + db;
  auto rs = check_postgres(url);
  EXPECT_EQ(find(rs, "pg_connection").status, CheckStatus::ok) << dump(rs);
  EXPECT_EQ(find(rs, "pg_role").status, CheckStatus::ok);
  EXPECT_EQ(find(rs, "pg_schema").status, CheckStatus::fail);
  EXPECT_NE(find(rs, "pg_schema").advice.find("jobguard pg migrate"), std::string::npos);
  EXPECT_EQ(find(rs, "pg_advisory_locks").status, CheckStatus::ok);
  guard::pg_migrate(url);
  rs = check_postgres(url);
  EXPECT_EQ(find(rs, "pg_schema").status, CheckStatus::ok) << dump(rs);
  EXPECT_EQ(find(rs, "pg_clock").status, CheckStatus::ok);
}

TEST_F(DoctorPg, ABusyProbeAdvisoryLockWarns) {
  // Another session holds the probe lock, as a second doctor running would.
  guard::PgConnection other(pg_options());
  ASSERT_TRUE(other.try_advisory_lock("jobguard-doctor-probe"));
  auto rs = check_postgres(pg_options().url);
  EXPECT_EQ(find(rs, "pg_advisory_locks").status, CheckStatus::warn) << dump(rs);
  other.advisory_unlock("jobguard-doctor-probe");
  rs = check_postgres(pg_options().url);
  EXPECT_EQ(find(rs, "pg_advisory_locks").status, CheckStatus::ok) << dump(rs);
}

TEST_F(DoctorPg, AClockOffsetToTheServerWarns) {
  // This host's clock is moved, not the server's: the check compares the
  // server's clock_timestamp() with ours at the round trip's midpoint.
  DoctorOptions o;
  o.now = [] { return std::chrono::system_clock::now() + 2s; };
  const auto rs = check_postgres(pg_options().url, o);
  EXPECT_EQ(find(rs, "pg_clock").status, CheckStatus::warn) << dump(rs);
  EXPECT_NE(find(rs, "pg_clock").detail.find("behind"), std::string::npos) << dump(rs);
}

TEST(DoctorPgStandby, AStandbyFailsTheRoleCheck) {
  test::PostgresServer pg;
  pg.start();
  pg.make_standby();
  pg.start();  // in recovery, with no primary to follow
  const auto rs = check_postgres(pg.url());
  EXPECT_EQ(find(rs, "pg_connection").status, CheckStatus::ok) << dump(rs);
  EXPECT_EQ(find(rs, "pg_role").status, CheckStatus::fail) << dump(rs);
  EXPECT_NE(find(rs, "pg_role").advice.find("primary"), std::string::npos);
}

TEST(DoctorPgDown, AnUnreachablePostgresIsOneFailure) {
  const auto rs = check_postgres("postgresql://postgres@127.0.0.1:" + std::to_string(pick_free_port()) + "/postgres");
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, CheckStatus::fail);
}
#else
TEST(DoctorPgNotBuilt, ARedisOnlyBuildFailsTheConnectionCheckSayingWhy) {
  const auto rs = check_postgres("postgresql://postgres@127.0.0.1:" + std::to_string(pick_free_port()) + "/postgres");
  ASSERT_EQ(rs.size(), 1u) << dump(rs);
  EXPECT_EQ(rs[0].name, "pg_connection");
  EXPECT_EQ(rs[0].status, CheckStatus::fail);
  EXPECT_NE(rs[0].detail.find("built without PostgreSQL"), std::string::npos) << dump(rs);
}
#endif

// What `jobguard serve` watches: the read-only checks and their numbers as
// gauges, a lost lock state seen by its quarantine and counted by the
// watcher, and a well-formed exposition (also while Redis is down).
TEST(RedisWatch, ReportsTheDeploymentAsGaugesWithoutWritingAKey) {
  auto s = start({"--maxmemory-policy", "noeviction"});
  auto o = options_for(*s);
  redis::Client c(o);
  c.wait_connected(2s);
  DoctorOptions d;
  d.pings = 1;
  auto f = watch_redis(c, d);
  EXPECT_TRUE(f.up);
  EXPECT_FALSE(f.evicting);
  EXPECT_FALSE(f.persistent);  // the fixture runs with --save "" --appendonly no
  EXPECT_EQ(f.replicas_connected, 0);
  EXPECT_EQ(f.replicas_required, 0);
  EXPECT_TRUE(f.lock_state_read);
  EXPECT_FALSE(f.lock_state_record);  // a new server, no client yet
  EXPECT_THROW(find(f.checks, "acl"), std::runtime_error) << "the acl probe writes keys";
  EXPECT_EQ(find(f.checks, "eviction").status, CheckStatus::ok);
  EXPECT_EQ(test::redis_command_at(s->host(), s->port(), "DBSIZE"), "0") << "the watch wrote a key";

  test::redis_command_at(s->host(), s->port(), "CONFIG SET maxmemory 100mb");
  test::redis_command_at(s->host(), s->port(), "CONFIG SET maxmemory-policy allkeys-lru");
  test::redis_command_at(s->host(), s->port(), "CONFIG SET appendonly yes");
  f = watch_redis(c, d);
  EXPECT_TRUE(f.evicting);
  EXPECT_TRUE(f.persistent);
  EXPECT_EQ(find(f.checks, "eviction").status, CheckStatus::fail);

  // A first grant on this server finds no lock-state record: quarantine.
  RedisWatcherOptions wo;
  wo.refresh = 50ms;
  wo.doctor = d;
  RedisWatcher watcher(c, wo);
  {
    redis::Client lc(o);
    auto svc = LockService::create(lc);
    LockOptions lo;
    lo.ttl = 1s;
    EXPECT_THROW(svc->acquire("watched", lo), Error);
  }
  f = watch_redis(c, d);
  EXPECT_TRUE(f.lock_state_record);
  EXPECT_GT(f.quarantine_left, 0ms);
  EXPECT_LE(f.quarantine_left, 60s);
  EXPECT_FALSE(f.quarantine_reason.empty());
  test::Exposition e;
  ASSERT_TRUE(test::eventually(
      [&] {
        e = test::parse_exposition(watcher.text());
        return e.samples.count("jobguard_redis_quarantine_seconds") && e.samples["jobguard_redis_quarantine_seconds"] > 0;
      },
      10s))
      << watcher.text();
  EXPECT_TRUE(e.problems.empty()) << ::testing::PrintToString(e.problems);
  EXPECT_EQ(e.samples["jobguard_redis_up"], 1);
  EXPECT_EQ(e.samples["jobguard_redis_evicting"], 1);
  EXPECT_EQ(e.samples["jobguard_redis_persistent"], 1);
  EXPECT_EQ(e.samples["jobguard_redis_lock_state_record"], 1);
  EXPECT_EQ(e.samples["jobguard_redis_check_status{check=\"eviction\"}"], 2);
  EXPECT_EQ(e.type["jobguard_redis_evicted_keys_total"], "counter");
  EXPECT_EQ(e.samples["jobguard_redis_lock_state_losses_total"], 0);

  // The record vanishes (a FLUSHALL): the watcher counts a loss.
  test::redis_command_at(s->host(), s->port(), "FLUSHALL");
  ASSERT_TRUE(test::eventually(
      [&] { return test::parse_exposition(watcher.text()).samples["jobguard_redis_lock_state_losses_total"] == 1; },
      10s))
      << watcher.text();
  e = test::parse_exposition(watcher.text());
  EXPECT_EQ(e.samples["jobguard_redis_lock_state_record"], 0);

  // Redis gone: up 0, the connection check FAILs, no made-up numbers.
  s->stop();
  ASSERT_TRUE(test::eventually(
      [&] { return test::parse_exposition(watcher.text()).samples["jobguard_redis_up"] == 0; }, 20s))
      << watcher.text();
  e = test::parse_exposition(watcher.text());
  EXPECT_TRUE(e.problems.empty()) << ::testing::PrintToString(e.problems);
  EXPECT_EQ(e.samples.count("jobguard_redis_evicting"), 0u) << watcher.text();
  EXPECT_EQ(e.samples["jobguard_redis_check_status{check=\"connection\"}"], 2);
  EXPECT_EQ(e.type["jobguard_redis_evicting"], "gauge");  // the schema stays
}

// The replica numbers behind the replica alerts: connected, healthy (online,
// acknowledging) and required (replicas= of the URL), from a real primary
// whose one replica is stopped (SIGSTOP) and resumed.
TEST(RedisWatch, CountsHealthyReplicasAgainstTheRequiredOnes) {
  auto primary = start({});
  auto replica = start({"--replicaof", primary->host(), std::to_string(primary->port())});
  ASSERT_TRUE(test::eventually(
      [&] {
        return test::redis_command_at(primary->host(), primary->port(), "INFO replication").find("state=online") !=
               std::string::npos;
      },
      10s));
  auto o = options_for(*primary);
  o.lock_replicas = 2;
  redis::Client c(o);
  ASSERT_TRUE(c.wait_connected(2s));
  DoctorOptions d;
  d.pings = 1;
  auto f = watch_redis(c, d);
  EXPECT_EQ(f.replicas_connected, 1);
  EXPECT_EQ(f.replicas_healthy, 1);
  EXPECT_EQ(f.replicas_required, 2);
  EXPECT_EQ(find(f.checks, "replica_confirmation").status, CheckStatus::fail);
  const auto e = test::parse_exposition(redis_facts_to_prometheus(f, 0));
  EXPECT_TRUE(e.problems.empty()) << ::testing::PrintToString(e.problems);
  EXPECT_EQ(e.samples.at("jobguard_redis_replicas_required"), 2);
  EXPECT_EQ(e.samples.at("jobguard_redis_replicas_healthy"), 1);
  // A replica that stops acknowledging is connected but not healthy.
  replica->pause();
  EXPECT_TRUE(test::eventually([&] { return watch_redis(c, d).replicas_healthy == 0; }, 15s));
  EXPECT_EQ(watch_redis(c, d).replicas_connected, 1);
  replica->resume();
  EXPECT_TRUE(test::eventually([&] { return watch_redis(c, d).replicas_healthy == 1; }, 15s));
}

// The live primitives: a semaphore over its lowered count, a stored count
// against the catalog's, a writer waiting behind readers, and holders of
// different kinds of lock on one resource.
TEST(Doctor, SemaphoresOverTheirCountWritersKeptWaitingAndMixedLocksWarn) {
  auto s = start({});
  redis::Client c(options_for(*s));
  ASSERT_TRUE(c.wait_connected(2s));
  trust_new_server(c);
  auto svc = LockService::create(c);
  DoctorOptions d;
  EXPECT_EQ(check_semaphores(c, d).status, CheckStatus::ok);
  EXPECT_EQ(check_rwlocks(c, d).status, CheckStatus::ok);

  LockOptions permit{.ttl = 20s, .permits = 3};
  auto p1 = svc->acquire("psp", permit), p2 = svc->acquire("psp", permit);
  ASSERT_TRUE(p1 && p2);
  auto r = check_semaphores(c, d);
  EXPECT_EQ(r.status, CheckStatus::ok) << r.detail;
  EXPECT_NE(r.detail.find("1 semaphore with live permits, 2 permits held"), std::string::npos) << r.detail;
  set_permits(*svc, "psp", 1);  // lowered under two holders
  r = check_semaphores(c, d);
  EXPECT_EQ(r.status, CheckStatus::warn);
  EXPECT_NE(r.detail.find("psp: 2 holders of 1 permits"), std::string::npos) << r.detail;
  clear_permits(*svc, "psp");

  // The catalog declares 1 permit for the class of "psp".
  d.catalog = std::make_shared<const job::Catalog>(job::Catalog::parse(R"(classes:
  - {name: psp, key: psp, owner: o, protects: p, consequence: low, ttl: 20s, renewal: false, hard_timeout: none,
     fencing: false, on_redis_down: fail-closed, fallback: f, permits: 1}
  - {name: book, key: "book:{id}", owner: o, protects: p, consequence: low, ttl: 20s, renewal: false,
     hard_timeout: none, fencing: false, on_redis_down: fail-closed, fallback: f})", "cat.yaml"));
  r = check_semaphores(c, d);
  EXPECT_EQ(r.status, CheckStatus::warn);
  EXPECT_NE(r.detail.find("2 holders, above the 1 permits class 'psp' declares"), std::string::npos) << r.detail;

  // A reader holds; a writer waits behind it.
  LockOptions reader{.ttl = 20s}, writer{.ttl = 20s, .wait = 20s};
  reader.mode = LockMode::shared;
  writer.mode = LockMode::exclusive;
  auto rd = svc->acquire("book:1", reader);
  ASSERT_TRUE(rd);
  r = check_rwlocks(c, d);
  EXPECT_EQ(r.status, CheckStatus::warn);  // the catalog's class "book" is a lock
  EXPECT_NE(r.detail.find("book:1: held as a read-write lock, but its class 'book' declares a lock"),
            std::string::npos) << r.detail;
  d.catalog.reset();
  EXPECT_EQ(check_rwlocks(c, d).status, CheckStatus::ok) << check_rwlocks(c, d).detail;
  auto waiting = std::async(std::launch::async, [&] { return svc->acquire("book:1", writer); });
  ASSERT_TRUE(test::eventually([&] { return inspect_rwlock(*svc, "book:1").waiting_writers == 1; }, 10s));
  d.writer_wait_warn = 0ms;  // any wait is too long: the check reports every waiting writer
  r = check_rwlocks(c, d);
  EXPECT_EQ(r.status, CheckStatus::warn);
  EXPECT_NE(r.detail.find("book:1: a writer has waited"), std::string::npos) << r.detail;
  EXPECT_NE(r.detail.find("behind 1 reader"), std::string::npos) << r.detail;
  d.writer_wait_warn = 1h;
  EXPECT_EQ(check_rwlocks(c, d).status, CheckStatus::ok);
  ASSERT_TRUE(rd->release());
  ASSERT_TRUE(waiting.get());

  // A plain lock on the semaphore's resource: neither excludes the other.
  auto plain = svc->acquire("psp", {.ttl = 20s});
  ASSERT_TRUE(plain);
  r = check_semaphores(c, d);
  EXPECT_EQ(r.status, CheckStatus::warn);
  EXPECT_NE(r.detail.find("psp: a plain lock is held beside 2 permit holders"), std::string::npos) << r.detail;
  const auto all = check_redis(c, d);
  EXPECT_EQ(find(all, "semaphores").status, CheckStatus::warn) << dump(all);
}

}  // namespace
}  // namespace jobguard::ops
