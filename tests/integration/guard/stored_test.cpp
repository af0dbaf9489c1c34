// How the Redis idempotency key and completion record are stored
// (src/guard/scripts/stored.lua): one string each, written with its expiry by
// one SET; the caller's bytes kept exactly; and a hash an older jobguard wrote
// still read, and replaced by the string at its next write.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <optional>
#include <string>

#include "jobguard/error.hpp"
#include "jobguard/guard/completion.hpp"
#include "jobguard/guard/idempotency.hpp"
#include "support/redis_fixture.hpp"

using namespace jobguard;
using namespace std::chrono_literals;
using namespace std::string_literals;

namespace {

class Stored : public test::RedisTest {
 protected:
  void SetUp() override {
    RedisTest::SetUp();
    client = make_client();
    idem.emplace(*client);
    done.emplace(*client);
  }

  redis::Reply run(redis::Command c) { return client->exec(std::move(c)); }
  std::string idem_key(const std::string& k) const { return "jobguard:idem:" + k; }

  std::optional<guard::CompletionRecord> find_async(const std::string& entity) {
    std::promise<std::optional<guard::CompletionRecord>> p;
    done->async_find("charge", entity, "r", [&](std::exception_ptr e, std::optional<guard::CompletionRecord> r) {
      if (e) p.set_exception(e);
      else p.set_value(std::move(r));
    });
    return p.get_future().get();
  }

  std::unique_ptr<redis::Client> client;
  std::optional<guard::RedisIdempotencyStore> idem;
  std::optional<guard::RedisCompletionStore> done;
};

// Bytes that would break a format delimited by separators.
const std::string kFp = "fp 1\n\0x"s;
const std::string kOwner = "own\0er \n"s;
const std::string kResult = "ch_1\n\0i1 completed 1 2 3 4 5\n"s;

TEST_F(Stored, AKeyIsOneStringWithItsExpiryInTheLayoutStoredLuaDocuments) {
  const auto b = idem->begin("k1", "fp", 30s, "owner-1");
  ASSERT_EQ(b.status, guard::BeginStatus::claimed);
  EXPECT_EQ(run({"TYPE", idem_key("k1")}).str, "string");
  const auto since = std::chrono::duration_cast<std::chrono::milliseconds>(b.since.time_since_epoch()).count();
  EXPECT_EQ(run({"GET", idem_key("k1")}).str,
            "i1 in_progress " + std::to_string(since) + " " + std::to_string(since + 30000) + " -\nfp\nowner-1\n");
  const auto ttl = run({"PTTL", idem_key("k1")}).integer;
  EXPECT_GT(ttl, 23 * 3600 * 1000LL) << "the store's retention (24 h), longer than the lease";

  idem->complete("k1", "owner-1", "ch_9");
  const std::string v = run({"GET", idem_key("k1")}).str;
  EXPECT_EQ(v.rfind("i1 completed " + std::to_string(since) + " " + std::to_string(since + 30000) + " ", 0), 0u) << v;
  EXPECT_EQ(v.substr(v.size() - 16), "\nfp\nowner-1\nch_9") << v;
  EXPECT_GT(run({"PTTL", idem_key("k1")}).integer, 23 * 3600 * 1000LL);
}

TEST_F(Stored, AKeyKeepsTheCallersBytesExactly) {
  const auto b = idem->begin("k2", kFp, 30s, kOwner);
  ASSERT_EQ(b.status, guard::BeginStatus::claimed);
  const std::string v = run({"GET", idem_key("k2")}).str;
  EXPECT_EQ(v.substr(v.find(" - ")), " - 7 8\n" + kFp + kOwner) << "a newline in them: lengths delimit them";
  const auto again = idem->begin("k2", kFp, 30s);
  EXPECT_EQ(again.status, guard::BeginStatus::in_progress);
  EXPECT_EQ(again.owner, kOwner);
  const auto other = idem->begin("k2", "fp 1", 30s);
  EXPECT_EQ(other.status, guard::BeginStatus::fingerprint_conflict);
  EXPECT_EQ(other.stored_fingerprint, kFp);

  idem->complete("k2", kOwner, kResult);
  const auto after = idem->begin("k2", kFp, 30s);
  EXPECT_EQ(after.status, guard::BeginStatus::completed);
  EXPECT_EQ(after.owner, kOwner);
  EXPECT_EQ(after.result, kResult);
}

TEST_F(Stored, ARecordIsOneStringAndKeepsTheCallersBytesExactly) {
  const auto r = done->record("charge", "e1", "r", kOwner, kResult);
  ASSERT_TRUE(r.recorded);
  const std::string key = done->key_for("charge", "e1", "r");
  EXPECT_EQ(run({"TYPE", key}).str, "string");
  const auto at = std::chrono::duration_cast<std::chrono::milliseconds>(r.record.completed_at.time_since_epoch());
  ASSERT_EQ(kOwner.size(), 8u);
  EXPECT_EQ(run({"GET", key}).str, "r1 " + std::to_string(at.count()) + " 8\n" + kOwner + kResult)
      << "a newline in completed_by: its length delimits it";
  EXPECT_EQ(run({"PTTL", key}).integer, -1) << "retention 0 keeps it";

  for (const auto& found : {done->find("charge", "e1", "r"), find_async("e1")}) {
    ASSERT_TRUE(found);
    EXPECT_EQ(found->completed_by, kOwner);
    EXPECT_EQ(found->result, kResult);
    EXPECT_EQ(found->completed_at, r.record.completed_at);
  }
  const auto second = done->record("charge", "e1", "r", "someone-else", "x");
  EXPECT_FALSE(second.recorded);
  EXPECT_EQ(second.record.completed_by, kOwner);
  EXPECT_EQ(second.record.result, kResult);

  guard::RedisCompletionStore kept(*client, {.retention = 60s});
  const auto plain = kept.record("charge", "e2", "r", "w 1", kResult);
  ASSERT_TRUE(plain.recorded);
  const auto at2 = std::chrono::duration_cast<std::chrono::milliseconds>(plain.record.completed_at.time_since_epoch());
  EXPECT_EQ(run({"GET", kept.key_for("charge", "e2", "r")}).str, "r1 " + std::to_string(at2.count()) + "\nw 1\n" + kResult);
  for (const auto& found : {kept.find("charge", "e2", "r"), find_async("e2")}) {
    ASSERT_TRUE(found);
    EXPECT_EQ(found->completed_by, "w 1");
    EXPECT_EQ(found->result, kResult);
  }
  EXPECT_EQ(kept.record("charge", "e2", "r", "w2", "x").record.result, kResult);
  const auto ttl = run({"PTTL", kept.key_for("charge", "e2", "r")}).integer;
  EXPECT_GT(ttl, 50000);
  EXPECT_LE(ttl, 60000);
  EXPECT_FALSE(find_async("e-none"));
}

// Keys and records an older jobguard wrote as hashes: read as before while
// their retention keeps them; the next write turns them into strings.
TEST_F(Stored, AKeyWrittenAsAHashByAnOlderJobguardIsStillRead) {
  run({"HSET", idem_key("old-done"), "state", "completed", "fp", "fp-a", "owner", "w-old", "since", "1700000000000",
       "lease_until", "1700000030000", "result", "ch_old", "done", "1700000000500"});
  const auto c = idem->begin("old-done", "fp-a", 30s);
  EXPECT_EQ(c.status, guard::BeginStatus::completed);
  EXPECT_EQ(c.result, "ch_old");
  EXPECT_EQ(c.owner, "w-old");
  EXPECT_EQ(idem->begin("old-done", "fp-b", 30s).status, guard::BeginStatus::fingerprint_conflict);

  // In progress under a live lease: its owner completes it, into a string.
  run({"HSET", idem_key("old-live"), "state", "in_progress", "fp", "fp-a", "owner", "w-old", "since", "1",
       "lease_until", "99999999999999"});
  EXPECT_EQ(idem->begin("old-live", "fp-a", 30s).status, guard::BeginStatus::in_progress);
  EXPECT_THROW(idem->complete("old-live", "w-other", "x"), Error);
  idem->complete("old-live", "w-old", "ch_live");
  EXPECT_EQ(run({"TYPE", idem_key("old-live")}).str, "string");
  EXPECT_EQ(idem->begin("old-live", "fp-a", 30s).result, "ch_live");

  // In progress with its lease passed: reclaimed, as a string.
  run({"HSET", idem_key("old-stale"), "state", "in_progress", "fp", "fp-a", "owner", "w-old", "since", "1",
       "lease_until", "2"});
  const auto re = idem->begin("old-stale", "fp-a", 30s);
  EXPECT_EQ(re.status, guard::BeginStatus::claimed);
  EXPECT_TRUE(re.reclaimed);
  EXPECT_EQ(run({"TYPE", idem_key("old-stale")}).str, "string");

  run({"HSET", idem_key("old-drop"), "state", "in_progress", "fp", "f", "owner", "w-old", "since", "1", "lease_until",
       "99999999999999"});
  EXPECT_FALSE(idem->abandon("old-drop", "w-other"));
  EXPECT_TRUE(idem->abandon("old-drop", "w-old"));
  EXPECT_EQ(run({"EXISTS", idem_key("old-drop")}).integer, 0);
}

TEST_F(Stored, ARecordWrittenAsAHashByAnOlderJobguardIsStillRead) {
  const std::string key = done->key_for("charge", "old", "r");
  run({"HSET", key, "at", "1700000000500", "by", "w-old", "result", "ch_old"});
  for (const auto& found : {done->find("charge", "old", "r"), find_async("old")}) {
    ASSERT_TRUE(found);
    EXPECT_EQ(found->completed_by, "w-old");
    EXPECT_EQ(found->result, "ch_old");
    EXPECT_EQ(found->completed_at, std::chrono::system_clock::time_point(1700000000500ms));
  }
  const auto again = done->record("charge", "old", "r", "w-new", "x");
  EXPECT_FALSE(again.recorded);
  EXPECT_EQ(again.record.completed_by, "w-old");
}

// Something else under jobguard's names (a plain value): an error that names
// the key, never a silent "absent" that would let the effect run again.
TEST_F(Stored, AValueInNoFormatJobguardWritesIsAnErrorNamingTheKey) {
  for (const char* v : {"hello", "i1 completed 1 2 3\nfp\nowner-but-no-newline", "i1 completed 1 2 3 9 9\nshort"}) {
    run({"SET", idem_key("alien"), v});
    try {
      idem->begin("alien", "fp", 30s);
      FAIL() << "read '" << v << "' as a key";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(idem_key("alien")), std::string::npos) << e.what();
    }
  }
  const std::string key = done->key_for("charge", "alien", "r");
  for (const char* v : {"hello", "r1 12 99\nshort", "r1 x 1\nw", "r1 12\nno-second-newline"}) {
    run({"SET", key, v});
    try {
      done->find("charge", "alien", "r");
      FAIL() << "read '" << v << "' as a record";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::protocol_error));
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
    EXPECT_THROW(find_async("alien"), Error);
    EXPECT_THROW(done->record("charge", "alien", "r", "w", "x"), Error);
  }
}

}  // namespace
