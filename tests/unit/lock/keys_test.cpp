#include <gtest/gtest.h>

#include <set>

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"

using jobguard::KeyBuilder;

TEST(KeyBuilder, ScopesKeysToTheBusinessObjectInOneHashTag) {
  KeyBuilder k;
  EXPECT_EQ(k.lock_key("invoice:48291"), "jobguard:lock:{invoice:48291}");
  EXPECT_EQ(k.fence_key("invoice:48291"), "jobguard:fence:{invoice:48291}");
  EXPECT_EQ(k.channel("tenant:alpha:sync"), "jobguard:released:{tenant:alpha:sync}");
  KeyBuilder custom("billing");
  EXPECT_EQ(custom.lock_key("x"), "billing:lock:{x}");
  EXPECT_EQ(k.resource_of("jobguard:lock:{invoice:48291}"), "invoice:48291");
  EXPECT_EQ(k.resource_of("other:lock:{x}"), std::nullopt);
}

TEST(KeyBuilder, RejectsKeysThatWouldBreakTheHashTagOrLogs) {
  KeyBuilder k;
  for (std::string bad : {std::string(""), std::string("a{b"), std::string("a}b"), std::string("has space"),
                          std::string("tab\there"), std::string(600, 'x')}) {
    try {
      k.lock_key(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const jobguard::Error& e) {
      EXPECT_EQ(e.code(), jobguard::errc::invalid_argument);
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
  EXPECT_THROW(KeyBuilder("a b"), jobguard::Error);
}

TEST(Token, Has128RandomBitsBehindAReadableOwner) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const auto t = jobguard::make_token("invoice-run");
    const auto hash = t.rfind('#');
    ASSERT_NE(hash, std::string::npos);
    EXPECT_EQ(t.size() - hash - 1, 32u) << t;
    EXPECT_NE(t.find("/invoice-run#"), std::string::npos) << t;
    EXPECT_TRUE(seen.insert(t).second) << "duplicate token " << t;
  }
  EXPECT_EQ(jobguard::token_owner("h/1/j#00ff"), "h/1/j");
  EXPECT_EQ(jobguard::token_owner("a-node-redlock-value"), "a-node-redlock-value");
  EXPECT_THROW(jobguard::make_token("bad job"), jobguard::Error);
}

TEST(KeyBuilder, AReadWriteLocksKeysAreDistinctAndShareTheResourcesSlot) {
  KeyBuilder k("billing");
  const std::set<std::string> keys{k.rw_readers_key("ledger"),    k.rw_writer_key("ledger"),
                                   k.rw_line_key("ledger"),       k.rw_line_expiry_key("ledger"),
                                   k.rw_writers_line_key("ledger"), k.rw_channel("ledger"),
                                   k.lock_key("ledger"),          k.permit_holders_key("ledger")};
  EXPECT_EQ(keys.size(), 8u);  // none is the mutex's or the semaphore's
  for (const auto& key : keys) {
    EXPECT_EQ(key.rfind("billing:", 0), 0u) << key;
    EXPECT_NE(key.find(":{ledger}"), std::string::npos) << key;
  }
  EXPECT_EQ(k.rw_readers_key("ledger"), "billing:rwr:{ledger}");
  EXPECT_EQ(k.rw_writer_key("ledger"), "billing:rww:{ledger}");
  EXPECT_THROW(k.rw_readers_key("a b"), jobguard::Error);
  EXPECT_STREQ(jobguard::to_string(jobguard::LockMode::shared), "shared");
  EXPECT_STREQ(jobguard::to_string(jobguard::LockMode::exclusive), "exclusive");
  EXPECT_STREQ(jobguard::to_string(jobguard::LockMode::mutex), "mutex");
}
