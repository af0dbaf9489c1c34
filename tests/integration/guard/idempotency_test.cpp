// Idempotency keys: ONE typed suite, run against PostgreSQL and Redis, so the
// two backends cannot drift apart.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <iostream>
#include <thread>

#include "backends.hpp"
#include "jobguard/error.hpp"
#include "support/redis_fixture.hpp"

using namespace jobguard;
using namespace jobguard::guard;
using namespace jobguard::test;
using namespace std::chrono_literals;

template <class B>
class IdempotencyContract : public PostgresTest {};
using Backends = ::testing::Types<PgBackend, RedisBackend>;
TYPED_TEST_SUITE(IdempotencyContract, Backends, BackendNames);

TYPED_TEST(IdempotencyContract, FirstBeginClaimsTheKey) {
  auto s = TypeParam::idempotency();
  const auto b = s->begin(this->name("k"), "fp", 5s);
  EXPECT_EQ(b.status, BeginStatus::claimed);
  EXPECT_FALSE(b.reclaimed);
  EXPECT_FALSE(b.owner.empty());
}

TYPED_TEST(IdempotencyContract, SecondBeginSeesInProgressWithOwnerAndSince) {
  auto s = TypeParam::idempotency();
  const auto k = this->name("k");
  const auto a = s->begin(k, "fp", 5s, "worker-a");
  ASSERT_EQ(a.status, BeginStatus::claimed);
  EXPECT_EQ(a.owner, "worker-a");
  const auto b = s->begin(k, "fp", 5s, "worker-b");
  EXPECT_EQ(b.status, BeginStatus::in_progress);
  EXPECT_EQ(b.owner, "worker-a");
  EXPECT_EQ(b.since, a.since);
  EXPECT_GT(b.lease_left, 0ms);
  EXPECT_LE(b.lease_left, 5s);
}

TYPED_TEST(IdempotencyContract, CompletedKeyReturnsTheStoredResult) {
  auto s = TypeParam::idempotency();
  const auto k = this->name("k");
  const auto a = s->begin(k, "fp", 5s);
  s->complete(k, a.owner, R"({"charge":"ch_1"})");
  s->complete(k, a.owner, R"({"charge":"ch_1"})");  // a retried complete() is harmless
  const auto b = s->begin(k, "fp", 5s);
  EXPECT_EQ(b.status, BeginStatus::completed);
  EXPECT_EQ(b.result, R"({"charge":"ch_1"})");
  EXPECT_EQ(b.owner, a.owner);
}

TYPED_TEST(IdempotencyContract, FingerprintConflictIsReportedAsOne) {
  auto s = TypeParam::idempotency();
  const auto k = this->name("k");
  ASSERT_EQ(s->begin(k, "charge:42:1000", 5s).status, BeginStatus::claimed);
  auto b = s->begin(k, "charge:42:9999", 5s);
  EXPECT_EQ(b.status, BeginStatus::fingerprint_conflict);
  EXPECT_EQ(b.stored_fingerprint, "charge:42:1000");
  // still a conflict once completed: a reused key never returns another request's result
  const auto k2 = this->name("k2");
  const auto a = s->begin(k2, "fp-a", 5s);
  s->complete(k2, a.owner, "r");
  b = s->begin(k2, "fp-b", 5s);
  EXPECT_EQ(b.status, BeginStatus::fingerprint_conflict);
  EXPECT_TRUE(b.result.empty());
}

TYPED_TEST(IdempotencyContract, AbandonLetsTheNextBeginClaimAtOnce) {
  auto s = TypeParam::idempotency();
  const auto k = this->name("k");
  const auto a = s->begin(k, "fp", 60s);
  EXPECT_FALSE(s->abandon(k, "someone-else"));
  EXPECT_EQ(s->begin(k, "fp", 60s).status, BeginStatus::in_progress);
  EXPECT_TRUE(s->abandon(k, a.owner));
  const auto b = s->begin(k, "fp", 60s);
  EXPECT_EQ(b.status, BeginStatus::claimed);
  EXPECT_FALSE(b.reclaimed);
}

TYPED_TEST(IdempotencyContract, ExpiredLeaseIsClaimableAfterItsLeaseNeverBefore) {
  auto s = TypeParam::idempotency();
  const auto k = this->name("k");
  constexpr auto kLease = 400ms;
  const auto a = s->begin(k, "fp", kLease, "crashed");
  ASSERT_EQ(a.status, BeginStatus::claimed);
  BeginResult b;
  ASSERT_TRUE(eventually(
      [&] {
        b = s->begin(k, "fp", kLease, "retry");
        if (b.status == BeginStatus::in_progress) {
          EXPECT_EQ(b.owner, "crashed");
        }
        return b.status == BeginStatus::claimed;
      },
      5s));
  EXPECT_TRUE(b.reclaimed);
  EXPECT_EQ(b.owner, "retry");
  // judged on the server's clock, where both timestamps come from (PostgreSQL
  // rounds them to whole milliseconds: allow that one)
  EXPECT_GE(b.since - a.since, kLease - 1ms);
  // the first owner lost it: its late complete() must not overwrite the new attempt
  try {
    s->complete(k, "crashed", "late");
    FAIL() << "a superseded owner completed the key";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::lease_lost) << e.what();
  }
  s->complete(k, "retry", "ok");
  EXPECT_EQ(s->begin(k, "fp", kLease).result, "ok");
}

TYPED_TEST(IdempotencyContract, OwnerMayCompleteAfterItsLeaseIfNobodyTookOver) {
  auto s = TypeParam::idempotency();
  const auto k = this->name("k");
  const auto a = s->begin(k, "fp", 50ms);
  std::this_thread::sleep_for(120ms);
  s->complete(k, a.owner, "slow but done");
  EXPECT_EQ(s->begin(k, "fp", 1s).status, BeginStatus::completed);
}

TYPED_TEST(IdempotencyContract, RetentionExpiresCompletedRecords) {
  IdempotencyOptions o;
  o.retention = 2s;  // long enough that a loaded machine still sees the record first
  auto s = TypeParam::idempotency(o);
  const auto k = this->name("k");
  const auto a = s->begin(k, "fp", 100ms);
  s->complete(k, a.owner, "r");
  EXPECT_EQ(s->begin(k, "fp", 100ms).status, BeginStatus::completed);
  BeginResult b;
  ASSERT_TRUE(eventually([&] { return (b = s->begin(k, "fp-new", 100ms)).status == BeginStatus::claimed; }, 10s));
  EXPECT_FALSE(b.reclaimed) << "an expired record is gone, not taken over";
}

TYPED_TEST(IdempotencyContract, BadArgumentsAreRefused) {
  auto s = TypeParam::idempotency();
  EXPECT_THROW(s->begin("", "fp", 1s), Error);
  EXPECT_THROW(s->begin(this->name("k"), "fp", 0ms), Error);
}

TYPED_TEST(IdempotencyContract, ConcurrentBeginYieldsExactlyOneClaim) {
  const auto k = this->name("k");
  constexpr int kThreads = 12;
  std::vector<Handle<IdempotencyStore>> stores;
  for (int i = 0; i < kThreads; ++i) stores.push_back(TypeParam::idempotency());
  std::barrier start(kThreads);
  std::atomic<int> claimed{0}, in_progress{0}, other{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      start.arrive_and_wait();
      const auto b = stores[t]->begin(k, "fp", 30s);
      if (b.status == BeginStatus::claimed) claimed++;
      else if (b.status == BeginStatus::in_progress) in_progress++;
      else other++;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(claimed.load(), 1);
  EXPECT_EQ(in_progress.load(), kThreads - 1);
  EXPECT_EQ(other.load(), 0);
}

namespace {

// The stand-in payment provider: honours idempotency keys as a payment API
// does (the charge is keyed by it), so a repeated call is not a second charge.
bool charge(PgConnection& pg, const std::string& table, const std::string& key, int amount, const std::string& by) {
  return pg.exec("INSERT INTO " + table + " (idem_key, amount, charged_by, claimed_ms) VALUES ($1, $2::int, $3, 0) "
                 "ON CONFLICT (idem_key) DO NOTHING",
                 {key, std::to_string(amount), by})
             .affected_rows == 1;
}

}  // namespace

// A worker is killed (SIGKILL) after the side effect and before complete():
// the retry sees in_progress until the crashed worker's lease passes, then
// reclaims the key, and its effect call does not charge a second time.
TYPED_TEST(IdempotencyContract, WorkerKilledAfterEffectBeforeCompleteDoesNotRepeatIt) {
  PgConnection pg(this->pg_options());
  const auto charges = this->name("charges");
  pg.exec("CREATE TABLE " + charges +
          " (idem_key text PRIMARY KEY, amount int NOT NULL, charged_by text NOT NULL, claimed_ms bigint NOT NULL)");
  const auto key = this->name("k");
  const std::string fp = "charge:sub-42:1000";
  constexpr auto kLease = 2000ms;

  // Start the backend's server here, in the parent: started lazily in the
  // child, it would die with the child (the regression this test once had
  // under ctest, where each test runs in a fresh process). The store and its
  // client thread are gone again before the fork.
  { auto warm = TypeParam::idempotency(); }
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(ready[0]);
    char code = 0;
    try {
      auto s = TypeParam::idempotency();
      const auto b = s->begin(key, fp, kLease);
      if (b.status != BeginStatus::claimed) {
        code = 3;
      } else {
        PgConnection c(this->pg_options());
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(b.since.time_since_epoch()).count();
        c.exec("INSERT INTO " + charges + " VALUES ($1, 1000, $2, $3::bigint)", {key, b.owner, std::to_string(ms)});
      }
    } catch (...) {
      code = 5;
    }
    (void)!::write(ready[1], &code, 1);
    ::pause();  // the effect is done, complete() never runs: wait for SIGKILL
    ::_exit(6);
  }
  ::close(ready[1]);
  char code = 9;
  ASSERT_EQ(::read(ready[0], &code, 1), 1);
  ::close(ready[0]);
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_EQ(code, 0) << "the child could not claim the key and charge";

  const auto row = pg.exec("SELECT charged_by, claimed_ms FROM " + charges).rows.at(0);
  const std::string crashed_owner = row.at(0).value();
  const auto crashed_since = std::chrono::system_clock::time_point(std::chrono::milliseconds(std::stoll(row.at(1).value())));

  auto s = TypeParam::idempotency();
  BeginResult b;
  int seen_in_progress = 0;
  ASSERT_TRUE(eventually(
      [&] {
        b = s->begin(key, fp, kLease);
        if (b.status == BeginStatus::in_progress) {
          ++seen_in_progress;
          EXPECT_EQ(b.owner, crashed_owner);
          EXPECT_LE(b.lease_left, kLease);
        }
        return b.status != BeginStatus::in_progress;
      },
      15s));
  ASSERT_EQ(b.status, BeginStatus::claimed);
  EXPECT_TRUE(b.reclaimed);
  // Never before the lease passed, on the server's clock (ms-rounded).
  EXPECT_GE(b.since - crashed_since, kLease - 1ms);
  // Only a machine stalled for the whole lease misses the in-progress phase.
  if (seen_in_progress == 0) std::cerr << "note: the lease passed before the first retry\n";

  // The retry calls the provider with the same key: no second charge.
  EXPECT_FALSE(charge(pg, charges, key, 1000, b.owner));
  s->complete(key, b.owner, "charged");
  EXPECT_EQ(pg.exec("SELECT count(*) FROM " + charges).rows[0][0], PgValue("1"));

  const auto later = s->begin(key, fp, kLease);
  EXPECT_EQ(later.status, BeginStatus::completed);
  EXPECT_EQ(later.result, "charged");
}
