// The guarded runner's decisions (claim -> effect -> finish) over a fake
// claim path: what it runs, reports and writes for every answer the lock and
// the stores can give. No server: the client points at a closed port, the
// fake grants Locks itself and never lets one reach Redis.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <functional>
#include <string>
#include <vector>

#include "job/claim_path.hpp"
#include "jobguard/job/runner.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/observe/event_log.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::job {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

Error redis_gone() { return Error(errc::not_connected, "127.0.0.1:1: connection refused", error_source::redis); }

class FakePath final : public ClaimPath {
 public:
  explicit FakePath(LockService& svc) : svc_(svc) {}

  // What claim() answers (granted: a Lock of its own making), or throws.
  std::function<Claim(const ClaimCall&)> on_claim = [this](const ClaimCall& c) { return grant(c); };
  bool keys = false;
  std::map<std::string, std::string> records;  // run_id -> result, read by find_done
  std::deque<guard::BeginResult> begins;       // begin_key's answers, in turn
  Error finish_error;                          // finish: the record that could not be written

  std::vector<std::string> found, recorded, abandoned, begun;
  std::vector<FinishCall> finished;
  int released = 0;

  Claim grant(const ClaimCall& c, bool checked = false) {
    Claim out;
    out.kind = Claim::Kind::granted;
    out.lock = svc_.make_lock(c.resource, "k:" + c.resource, "token", std::nullopt, c.lock,
                              std::chrono::steady_clock::now());
    out.record_checked = checked;
    return out;
  }

  asio::awaitable<Claim> claim(const ClaimCall& c) override { co_return on_claim(c); }
  asio::awaitable<Error> finish(const ClaimCall& c, FinishCall& f) override {
    finished.push_back(f);
    if (!finish_error) recorded.push_back(f.run_id + "=" + f.result);
    if (f.lock && f.whole_unit) f.lock->detach();  // released with the record, as the one call does
    (void)c;
    co_return finish_error;
  }
  asio::awaitable<std::optional<std::string>> find_done(const ClaimCall&, const std::string& run_id) override {
    found.push_back(run_id);
    auto it = records.find(run_id);
    if (it == records.end()) co_return std::nullopt;
    co_return it->second;
  }
  asio::awaitable<void> record(const ClaimCall&, const std::string& run_id, const std::string& result) override {
    recorded.push_back(run_id + "=" + result);
    co_return;
  }
  bool has_keys() const noexcept override { return keys; }
  asio::awaitable<guard::BeginResult> begin_key(const ClaimCall&, const std::string& key, std::chrono::milliseconds,
                                                const std::string&) override {
    begun.push_back(key);
    auto b = begins.front();
    begins.pop_front();
    co_return b;
  }
  asio::awaitable<void> abandon_key(const ClaimCall&, const std::string& key, const std::string& owner) override {
    abandoned.push_back(key + " by " + owner);
    co_return;
  }
  asio::awaitable<void> release(Lock& lock) override {
    ++released;
    lock.detach();
    co_return;
  }
  DurableSteps* durable() noexcept override { return nullptr; }

 private:
  LockService& svc_;
};

redis::ConnectionOptions nowhere() {
  redis::ConnectionOptions o;
  o.port = 1;  // nothing listens: every call fails, none is made by the runner
  o.connect_timeout = 50ms;
  o.command_timeout = 50ms;
  return o;
}

class RunnerDecide : public ::testing::Test {
 protected:
  RunnerDecide()
      : client_(nowhere()),
        svc_(LockService::create(client_, LockServiceOptions{.metrics = &registry_})),
        leases_(LeaseScheduler::create(svc_)),
        path_(*svc_),
        log_(observe::LogFormat::json, [this](std::string_view line) { lines_.emplace_back(line); }) {}

  static LockClass cls(Consequence c, RedisDownPolicy down = RedisDownPolicy::fail_closed) {
    LockClass k;
    k.name = "billing";
    k.key_pattern = "invoice:{id}";
    k.owner = "billing-team";
    k.protects = "one charge per invoice and month";
    k.consequence = c;
    k.ttl = 30s;
    k.on_redis_down = down;
    return k;
  }

  RunResult run(const LockClass& k, Unit unit, const Effect& effect) {
    GuardedRunner runner(leases_, k, RunnerBackends{.log = &log_, .registry = &registry_}, path_);
    return runner.run(unit, effect);
  }

  bool logged(std::string_view event) const {
    const std::string needle = "\"event\":\"" + std::string(event) + "\"";
    for (const auto& l : lines_)
      if (l.find(needle) != std::string::npos) return true;
    return false;
  }

  observe::Registry registry_;
  redis::Client client_;
  std::shared_ptr<LockService> svc_;
  std::shared_ptr<LeaseScheduler> leases_;
  FakePath path_;
  std::vector<std::string> lines_;
  observe::EventLog log_;
  int ran_ = 0;
  Effect effect_ = [this](JobContext&) {
    ++ran_;
    return std::string("ch_1");
  };
};

TEST_F(RunnerDecide, AGrantRunsTheEffectOnceAndFinishesWithItsResult) {
  auto r = run(cls(Consequence::low), {.id = "7", .run_id = "2026-11"}, effect_);
  EXPECT_EQ(r.outcome, Outcome::completed) << r.detail;
  EXPECT_EQ(r.result, "ch_1");
  EXPECT_EQ(ran_, 1);
  // The record read again under the lock the claim did not read it with.
  EXPECT_EQ(path_.found, std::vector<std::string>{"2026-11"});
  ASSERT_EQ(path_.finished.size(), 1u);
  EXPECT_TRUE(path_.finished[0].whole_unit);
  EXPECT_NE(path_.finished[0].lock, nullptr);  // the finish may release the lock
  EXPECT_EQ(path_.released, 0);                // and did: nothing left to release
  EXPECT_TRUE(logged("acquired"));
}

TEST_F(RunnerDecide, AClaimThatReadTheRecordWithItsGrantIsNotReadAgain) {
  path_.on_claim = [this](const ClaimCall& c) { return path_.grant(c, /*checked=*/true); };
  auto r = run(cls(Consequence::low), {.id = "7", .run_id = "2026-11"}, effect_);
  EXPECT_EQ(r.outcome, Outcome::completed) << r.detail;
  EXPECT_TRUE(path_.found.empty());
}

TEST_F(RunnerDecide, ARecordFoundBeforeOrUnderTheLockRunsNothing) {
  path_.on_claim = [](const ClaimCall&) { return Claim{.kind = Claim::Kind::done, .result = "ch_0"}; };
  auto r = run(cls(Consequence::low), {.id = "7", .run_id = "2026-11"}, effect_);
  EXPECT_EQ(r.outcome, Outcome::already_done);
  EXPECT_EQ(r.result, "ch_0");

  path_.on_claim = [this](const ClaimCall& c) { return path_.grant(c); };
  path_.records["2026-11"] = "ch_9";
  r = run(cls(Consequence::low), {.id = "7", .run_id = "2026-11"}, effect_);
  EXPECT_EQ(r.outcome, Outcome::already_done);
  EXPECT_EQ(r.result, "ch_9");
  EXPECT_EQ(path_.released, 1);  // the lock taken to look is given back
  EXPECT_EQ(ran_, 0);
  EXPECT_TRUE(path_.finished.empty());
}

TEST_F(RunnerDecide, ABusyLockRunsNothing) {
  path_.on_claim = [](const ClaimCall&) { return Claim{.kind = Claim::Kind::busy}; };
  auto r = run(cls(Consequence::low), {.id = "7", .run_id = "2026-11"}, effect_);
  EXPECT_EQ(r.outcome, Outcome::busy);
  EXPECT_NE(r.detail.find("held by another worker"), std::string::npos) << r.detail;
  EXPECT_EQ(ran_, 0);
}

TEST_F(RunnerDecide, RedisDownStopsAFailClosedClassAndRunsAFailOpenOneUnguarded) {
  path_.on_claim = [](const ClaimCall&) -> Claim { throw redis_gone(); };
  auto r = run(cls(Consequence::low), {.id = "7", .run_id = "2026-11"}, effect_);
  EXPECT_EQ(r.outcome, Outcome::redis_unavailable);
  EXPECT_NE(r.detail.find("fail-closed"), std::string::npos) << r.detail;
  EXPECT_EQ(ran_, 0);
  EXPECT_FALSE(r.fail_open);

  r = run(cls(Consequence::low, RedisDownPolicy::fail_open), {.id = "7", .run_id = "2026-11"}, effect_);
  EXPECT_EQ(r.outcome, Outcome::completed) << r.detail;
  EXPECT_TRUE(r.fail_open);
  EXPECT_EQ(ran_, 1);
  ASSERT_EQ(path_.finished.size(), 1u);
  EXPECT_EQ(path_.finished[0].lock, nullptr);  // there is none
  EXPECT_TRUE(path_.found.empty());            // no record to read under a lock never taken
  EXPECT_TRUE(logged("fail_open"));
  EXPECT_EQ(registry_.lock_class("billing").fail_open_total.value(), 1u);
}

TEST_F(RunnerDecide, AClaimRefusedForAnotherReasonIsNotAFailOpen) {
  path_.on_claim = [](const ClaimCall&) -> Claim { throw Error(errc::server_error, "NOPERM", error_source::redis); };
  auto r = run(cls(Consequence::low, RedisDownPolicy::fail_open), {.id = "7", .run_id = "2026-11"}, effect_);
  EXPECT_EQ(r.outcome, Outcome::failed);
  EXPECT_FALSE(r.fail_open);
  EXPECT_EQ(ran_, 0);
}

TEST_F(RunnerDecide, TheEffectsExceptionNamesTheOutcomeAndFreesItsKey) {
  const std::pair<Error, Outcome> cases[] = {{Error(errc::stale_fence, "fence 3 < 4"), Outcome::stale},
                                             {Error(errc::lease_lost, "lost"), Outcome::lease_lost},
                                             {Error(errc::invalid_argument, "bad"), Outcome::failed}};
  path_.keys = true;
  for (const auto& [thrown, outcome] : cases) {
    path_.begins.push_back(guard::BeginResult{.status = guard::BeginStatus::claimed, .owner = "me"});
    auto r = run(cls(Consequence::moderate), {.id = "7", .run_id = "2026-11"},
                 [e = thrown](JobContext&) -> std::string { throw e; });
    EXPECT_EQ(r.outcome, outcome) << r.detail;
  }
  EXPECT_EQ(path_.abandoned.size(), 3u);
  EXPECT_EQ(path_.abandoned[0], "billing/invoice:7/2026-11 by me");
  EXPECT_TRUE(path_.finished.empty());  // nothing recorded for a throwing effect
  EXPECT_EQ(path_.released, 3);
}

TEST_F(RunnerDecide, AKeyClaimedWithTheLockIsNotClaimedAgainNorWrittenOnFailure) {
  path_.keys = true;
  path_.on_claim = [this](const ClaimCall& c) {
    auto g = path_.grant(c, true);
    g.key = KeyClaim{.owner = "one-call", .deferred = true};
    return g;
  };
  auto r = run(cls(Consequence::moderate), {.id = "7", .run_id = "2026-11"}, effect_);
  EXPECT_EQ(r.outcome, Outcome::completed) << r.detail;
  EXPECT_TRUE(path_.begun.empty());
  ASSERT_EQ(path_.finished.size(), 1u);
  EXPECT_TRUE(path_.finished[0].key_ours && path_.finished[0].key_deferred);
  EXPECT_EQ(path_.finished[0].owner, "one-call");

  r = run(cls(Consequence::moderate), {.id = "8", .run_id = "2026-11"},
          [](JobContext&) -> std::string { throw Error(errc::invalid_argument, "bad"); });
  EXPECT_EQ(r.outcome, Outcome::failed);
  EXPECT_TRUE(path_.abandoned.empty());  // a deferred key was never written
}

TEST_F(RunnerDecide, AKeyCompletedEarlierIsRecordedAndRunsNothing) {
  path_.keys = true;
  path_.begins.push_back(guard::BeginResult{.status = guard::BeginStatus::completed, .result = "ch_5"});
  auto r = run(cls(Consequence::moderate), {.id = "7", .run_id = "2026-11"}, effect_);
  EXPECT_EQ(r.outcome, Outcome::already_done);
  EXPECT_EQ(r.result, "ch_5");
  EXPECT_EQ(path_.recorded, std::vector<std::string>{"2026-11=ch_5"});
  EXPECT_EQ(ran_, 0);

  path_.begins.push_back(guard::BeginResult{.status = guard::BeginStatus::fingerprint_conflict});
  r = run(cls(Consequence::moderate), {.id = "7", .run_id = "2026-12"}, effect_);
  EXPECT_EQ(r.outcome, Outcome::failed);
  EXPECT_NE(r.detail.find("different request"), std::string::npos) << r.detail;
  EXPECT_EQ(ran_, 0);
}

TEST_F(RunnerDecide, ARecordNotWrittenFailsAGuardedRunButNotAFailOpenOne) {
  path_.finish_error = Error(errc::timeout, "record: timed out", error_source::redis);
  auto r = run(cls(Consequence::low), {.id = "7", .run_id = "2026-11"}, effect_);
  EXPECT_EQ(r.outcome, Outcome::redis_unavailable);
  EXPECT_NE(r.detail.find("ran but its completion was not recorded"), std::string::npos) << r.detail;

  path_.on_claim = [](const ClaimCall&) -> Claim { throw redis_gone(); };
  r = run(cls(Consequence::low, RedisDownPolicy::fail_open), {.id = "7", .run_id = "2026-11"}, effect_);
  EXPECT_EQ(r.outcome, Outcome::completed) << r.detail;
  EXPECT_TRUE(logged("record_failed"));
}

TEST_F(RunnerDecide, ChunksResumeAfterTheirCheckpointAndRecordTheUnit) {
  path_.records["2026-11#chunk-0"] = "done";
  std::vector<int> chunks;
  auto r = run(cls(Consequence::low), {.id = "7", .run_id = "2026-11", .chunks = 3}, [&](JobContext& ctx) {
    chunks.push_back(ctx.chunk());
    return std::string("c") + std::to_string(ctx.chunk());
  });
  EXPECT_EQ(r.outcome, Outcome::completed) << r.detail;
  EXPECT_EQ(chunks, (std::vector<int>{1, 2}));
  EXPECT_EQ(r.chunks_skipped, 1);
  EXPECT_EQ(r.chunks_run, 2);
  for (const auto& f : path_.finished) EXPECT_FALSE(f.whole_unit);
  EXPECT_EQ(path_.recorded,
            (std::vector<std::string>{"2026-11#chunk-1=c1", "2026-11#chunk-2=c2", "2026-11=c2"}));
  EXPECT_EQ(path_.released, 1);  // a chunk's finish leaves the lock to the unit
}

}  // namespace
}  // namespace jobguard::job
