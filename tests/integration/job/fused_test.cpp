// The batched claim and finish (scripts/claim_many.lua, finish_many.lua) and
// the batcher that sends them (src/job/fused.cpp), against a real server.
//
// The scripts' promise: n calls in one give each call the reply, and leave
// the keys, that the single script would have given and left had the calls
// run one after another. The tests build the same states under two prefixes,
// run the calls one by one under the first and as one batch under the
// second, and compare replies and keys (times and TTLs compared by kind, not
// value).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <boost/asio/post.hpp>
#include <atomic>
#include <future>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "job/fused.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/reply.hpp"
#include "support/redis_fixture.hpp"

using namespace std::chrono_literals;
using namespace jobguard;

namespace {

struct Call {
  std::vector<std::string> keys, args;
};

// A reply as text, the prefix taken out and every number above 1000 (a TTL,
// a fence, a time) shown as "N".
std::string normal(const redis::Reply& r, const std::string& prefix) {
  std::string s = redis::to_debug_string(r);
  for (auto at = s.find(prefix); at != std::string::npos; at = s.find(prefix)) s.replace(at, prefix.size(), "P:");
  return std::regex_replace(s, std::regex("[0-9]{4,}"), "N");
}

class FusedBatch : public test::RedisTest {
 protected:
  void SetUp() override {
    RedisTest::SetUp();
    client_ = make_client();
  }

  redis::Reply run(redis::Command c) { return client_->exec(std::move(c)); }

  // Every key under `prefix`: its type, value (as normal()), and whether it
  // expires.
  std::map<std::string, std::string> dump(const std::string& prefix) {
    std::map<std::string, std::string> out;
    auto keys = run(redis::Command{"KEYS", prefix + "*"});
    for (const auto& k : keys.elements) {
      const std::string name = k.str.substr(prefix.size());
      const std::string type = run(redis::Command{"TYPE", k.str}).str;
      redis::Reply v;
      if (type == "string") v = run(redis::Command{"GET", k.str});
      else if (type == "hash") v = run(redis::Command{"HGETALL", k.str});
      else if (type == "zset") v = run(redis::Command{"ZRANGE", k.str, "0", "-1"});
      const auto pttl = run(redis::Command{"PTTL", k.str}).integer;
      // HGETALL's order is the hash's own: sorted here.
      std::string value = normal(v, prefix);
      if (type == "hash") {
        std::map<std::string, std::string> fields;
        for (std::size_t i = 0; i + 1 < v.elements.size(); i += 2)
          fields[v.elements[i].str] = normal(v.elements[i + 1], prefix);
        value.clear();
        for (const auto& [f, x] : fields) value += f + "=" + x + ";";
      }
      out[name] = fmt::format("{} {} ttl:{}", type, value, pttl > 0 ? "yes" : std::to_string(pttl));
    }
    return out;
  }

  // The calls one by one under prefix `a`, then in one batch under `b`;
  // `build(prefix)` makes a state and returns the calls on it.
  void expect_batch_is_the_singles(const redis::Script& one, const redis::Script& many,
                                   const std::function<std::vector<Call>(const std::string&)>& build) {
    const std::string a = key("a:"), b = key("b:");
    auto singles = build(a);
    auto batched = build(b);
    ASSERT_EQ(singles.size(), batched.size());
    std::vector<std::string> want;
    for (auto& c : singles) want.push_back(normal(client_->eval(one, c.keys, c.args), a));
    // By shape, as the batcher sends them (one shape a batch).
    std::map<std::pair<std::size_t, std::size_t>, std::vector<std::size_t>> shapes;
    for (std::size_t i = 0; i < batched.size(); ++i) shapes[{batched[i].keys.size(), batched[i].args.size()}].push_back(i);
    redis::Reply r;
    r.type = redis::Reply::Type::array;
    r.elements.resize(batched.size());
    for (const auto& [shape, calls] : shapes) {
      std::vector<std::vector<std::string>> keys, args;
      for (auto i : calls) {
        keys.push_back(batched[i].keys);
        args.push_back(batched[i].args);
      }
      auto encoded = job::detail::encode_batch(keys, args);
      auto part = client_->eval(many, encoded.keys, encoded.args);
      ASSERT_TRUE(part.is_array()) << redis::to_debug_string(part);
      ASSERT_EQ(part.elements.size(), calls.size()) << redis::to_debug_string(part);
      for (std::size_t j = 0; j < calls.size(); ++j) r.elements[calls[j]] = std::move(part.elements[j]);
    }
    ASSERT_TRUE(r.is_array()) << redis::to_debug_string(r);
    ASSERT_EQ(r.elements.size(), want.size()) << redis::to_debug_string(r);
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(normal(r.elements[i], b), want[i]) << "call " << i;
    EXPECT_EQ(dump(b), dump(a));
  }

  std::unique_ptr<redis::Client> client_;
};

// claim.lua's arguments for a moderate class: the lock, its fence counter,
// the lock-state record, the completion record, the key; token, ttl, fence,
// evicted_keys, the checked epoch, fingerprint, owner, lease, retention,
// 'defer' or ''.
Call claim(const std::string& p, const std::string& unit, const std::string& token, const std::string& fence = "0",
           const std::string& evicted = "", const std::string& defer = "defer", const std::string& epoch = "") {
  return Call{{p + "lock:{" + unit + "}", p + "fence:{" + unit + "}", p + "epoch", p + "done:" + unit, p + "idem:" + unit},
              {token, "30000", fence, evicted, epoch, "fp-" + unit, "owner-" + token, "30000", "600000", defer}};
}

// finish.lua's deferred form: the record, the lock, its waiters, the key;
// token, channel, completed_by, result, record retention, owner, key
// retention, cluster flag, 'deferred', fingerprint, ms since the claim, lease.
Call finish(const std::string& p, const std::string& unit, const std::string& token) {
  return Call{{p + "done:" + unit, p + "lock:{" + unit + "}", p + "waiters:{" + unit + "}", p + "idem:" + unit},
              {token, p + "released:{" + unit + "}", "worker-1", "result-" + unit, "600000", "owner-" + token,
               "600000", "", "deferred", "fp-" + unit, "3", "30000"}};
}

TEST_F(FusedBatch, ClaimsOfFirstRunsGoTogetherAndAnswerAsOneByOne) {
  expect_batch_is_the_singles(job::detail::claim_script(), job::detail::claim_many_script(),
                              [&](const std::string& p) {
                                run(redis::Command{"HSET", p + "epoch", "id", "e1"});
                                return std::vector<Call>{
                                    claim(p, "u1", "t1"),
                                    claim(p, "u1", "t2"),  // the same lock: busy
                                    claim(p, "u2", "t3", "0", "0"),       // eviction count as checked
                                    claim(p, "u3", "t4", "0", "999999"),  // keys evicted since: -1
                                    claim(p, "u4", "t5", "1"),            // fenced: the one-by-one path
                                    claim(p, "u5", "t6", "0", "", ""),    // key written at the claim
                                    claim(p, "u6", "t7"),
                                    claim(p, "u7", "t8", "0", "", "defer", "e1"),  // the record as checked
                                    claim(p, "u8", "t9", "0", "", "defer", "e0"),  // a record written since: -1
                                    claim(p, "u9", "t10", "1", "", "defer", "e0"),  // the same, fenced
                                };
                              });
}

// A claim admitted under a lock-state record another client has replaced
// since (its quarantine) is refused as acquire.lua refuses it, fenced or not,
// and takes nothing; the same claim under the record as checked is granted.
TEST_F(FusedBatch, AClaimUnderARecordWrittenSinceItsCheckIsRefusedAndTakesNothing) {
  const std::string p = key("e:");
  run(redis::Command{"HSET", p + "epoch", "id", "e1"});
  for (const std::string fence : {"0", "1"}) {
    const auto stale = claim(p, "u" + fence, "t" + fence, fence, "", "defer", "e0");
    const auto r = client_->eval(job::detail::claim_script(), stale.keys, stale.args);
    ASSERT_TRUE(r.is_array() && !r.elements.empty()) << redis::to_debug_string(r);
    EXPECT_EQ(r.elements[0].integer, -1) << "fence " << fence << ": " << redis::to_debug_string(r);
    EXPECT_EQ(run(redis::Command{"EXISTS", stale.keys[0]}).integer, 0) << "fence " << fence;
  }
  const auto current = claim(p, "u2", "t2", "1", "", "defer", "e1");
  const auto r = client_->eval(job::detail::claim_script(), current.keys, current.args);
  ASSERT_TRUE(r.is_array() && !r.elements.empty()) << redis::to_debug_string(r);
  EXPECT_EQ(r.elements[0].integer, 1) << redis::to_debug_string(r);
}

TEST_F(FusedBatch, ClaimsWhereARecordOrKeyExistsAnswerAsOneByOne) {
  expect_batch_is_the_singles(job::detail::claim_script(), job::detail::claim_many_script(),
                              [&](const std::string& p) {
                                // u1 done before (a hash, as an older jobguard wrote it;
                                // u7 as a string, stored.lua's format); u2's key claimed by
                                // another run whose lock expired.
                                run(redis::Command{"HSET", p + "done:u1", "at", "1", "by", "w0", "result", "r-old"});
                                run(redis::Command{"SET", p + "done:u7", "r1 1 2\nw0r-new"});
                                auto other = claim(p, "u2", "t-old", "0", "", "");
                                client_->eval(job::detail::claim_script(), other.keys, other.args);
                                run(redis::Command{"DEL", p + "lock:{u2}"});
                                return std::vector<Call>{claim(p, "u1", "t1"), claim(p, "u2", "t2"),
                                                         claim(p, "u3", "t3"), claim(p, "u3", "t4"),
                                                         claim(p, "u7", "t5")};
                              });
}

TEST_F(FusedBatch, FinishesAnswerAsOneByOneWhateverEachFinds) {
  expect_batch_is_the_singles(
      job::detail::finish_script(), job::detail::finish_many_script(), [&](const std::string& p) {
        auto held = [&](const std::string& unit, const std::string& token) {
          run(redis::Command{"SET", p + "lock:{" + unit + "}", token, "PX", "30000"});
        };
        held("u1", "t1");  // the common case
        held("u2", "t2");  // with a waiter in line: woken
        run(redis::Command{"ZADD", p + "waiters:{u2}", "5", "waiter-a"});
        run(redis::Command{"ZADD", p + "waiters:{u2}", "7", "waiter-b"});
        // u3: our lock expired, nobody holds it. u4: expired and taken by another.
        held("u4", "t-other");
        held("u5", "t5");
        held("u6", "t6");
        return std::vector<Call>{finish(p, "u1", "t1"), finish(p, "u2", "t2"), finish(p, "u3", "t3"),
                                 finish(p, "u4", "t4"), finish(p, "u5", "t5"), finish(p, "u6", "t6")};
      });
}

TEST_F(FusedBatch, FinishesWhereAKeyExistsAnswerAsOneByOne) {
  expect_batch_is_the_singles(
      job::detail::finish_script(), job::detail::finish_many_script(), [&](const std::string& p) {
        run(redis::Command{"SET", p + "lock:{u1}", "t1", "PX", "30000"});
        run(redis::Command{"SET", p + "lock:{u2}", "t2", "PX", "30000"});
        run(redis::Command{"SET", p + "lock:{u3}", "t3", "PX", "30000"});
        // u2's and u3's keys completed by another run (a step-by-step one): not
        // ours to write. u2's is a hash as an older jobguard wrote it, u3's a
        // string (stored.lua's format).
        run(redis::Command{"HSET", p + "idem:u2", "state", "completed", "owner", "owner-x", "fp", "fp-u2"});
        run(redis::Command{"SET", p + "idem:u3", "i1 completed 1 2 3 5 7\nfp-u3owner-x"});
        return std::vector<Call>{finish(p, "u1", "t1"), finish(p, "u2", "t2"), finish(p, "u3", "t3")};
      });
}

// What expect_batch_is_the_singles cannot see (it shows times and TTLs by
// kind): in a batch of common finishes whose times, retentions and values
// all differ, each key and record holds its own call's, read at its own
// argument positions (finish_many.lua reads them inline, not by arg(i, j)).
TEST_F(FusedBatch, EachCommonFinishInABatchWritesItsOwnTimesRetentionsAndValues) {
  const std::string p = key("own:");
  struct Want {
    std::int64_t ms_since_claim, lease, record_keep, key_keep;
  };
  const std::vector<Want> want{{10, 30000, 600000, 500000}, {100000, 60000, 300000, 400000}, {250000, 90000, 0, 200000}};
  std::vector<std::vector<std::string>> keys, args;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const std::string unit = fmt::format("u{}", i), token = fmt::format("t{}", i);
    run(redis::Command{"SET", p + "lock:{" + unit + "}", token, "PX", "30000"});
    Call c = finish(p, unit, token);
    c.args[2] = fmt::format("worker-{}", i);
    c.args[4] = std::to_string(want[i].record_keep);
    c.args[6] = std::to_string(want[i].key_keep);
    c.args[10] = std::to_string(want[i].ms_since_claim);
    c.args[11] = std::to_string(want[i].lease);
    keys.push_back(c.keys);
    args.push_back(c.args);
  }
  auto encoded = job::detail::encode_batch(keys, args);
  const auto r = client_->eval(job::detail::finish_many_script(), encoded.keys, encoded.args);
  ASSERT_TRUE(r.is_array()) << redis::to_debug_string(r);
  ASSERT_EQ(r.elements.size(), want.size());
  const auto t = run(redis::Command{"TIME"});
  const std::int64_t now = std::stoll(t.elements[0].str) * 1000 + std::stoll(t.elements[1].str) / 1000;
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(fmt::format("call {}", i));
    EXPECT_EQ(redis::to_debug_string(r.elements[i]), "[(integer) 1, (integer) 1, (integer) 1]");
    const std::string unit = fmt::format("u{}", i);
    const auto k = run(redis::Command{"GET", p + "idem:" + unit}).str;
    std::smatch m;
    ASSERT_TRUE(std::regex_match(k, m, std::regex("i1 completed ([0-9]+) ([0-9]+) ([0-9]+)\n(.*)", std::regex::extended)))
        << k;
    const std::int64_t since = std::stoll(m[1]), lease_until = std::stoll(m[2]), done = std::stoll(m[3]);
    // The claim was this call's ms before the finish, which was just now.
    EXPECT_NEAR(static_cast<double>(now - since), static_cast<double>(want[i].ms_since_claim), 5000.0);
    EXPECT_EQ(lease_until - since, want[i].lease);
    EXPECT_EQ(m[4].str(), fmt::format("fp-{}\nowner-t{}\nresult-{}", unit, i, unit));
    EXPECT_EQ(run(redis::Command{"GET", p + "done:" + unit}).str,
              fmt::format("r1 {}\nworker-{}\nresult-{}", done, i, unit));
    const auto key_ttl = run(redis::Command{"PTTL", p + "idem:" + unit}).integer;
    EXPECT_GT(key_ttl, want[i].key_keep - 5000);
    EXPECT_LE(key_ttl, want[i].key_keep);
    const auto record_ttl = run(redis::Command{"PTTL", p + "done:" + unit}).integer;
    if (want[i].record_keep == 0) {
      EXPECT_EQ(record_ttl, -1);  // kept for ever
    } else {
      EXPECT_GT(record_ttl, want[i].record_keep - 5000);
      EXPECT_LE(record_ttl, want[i].record_keep);
    }
    EXPECT_EQ(run(redis::Command{"EXISTS", p + "lock:{" + unit + "}"}).integer, 0);
  }
}

// The batcher: calls made in one turn of the loop go as one script call;
// one call alone goes as the single script; an error reaches every caller.
class Batcher : public test::RedisTest {
 protected:
  void SetUp() override {
    RedisTest::SetUp();
    client_ = make_client();
  }

  // `n` calls made in one handler on the loop; their replies.
  std::vector<std::pair<std::error_code, redis::Reply>> call(job::detail::ScriptBatcher& b, int n,
                                                             std::vector<redis::CallOptions> opts = {}) {
    std::vector<std::promise<std::pair<std::error_code, redis::Reply>>> ps(n);
    boost::asio::post(client_->get_executor(), [&] {
      for (int i = 0; i < n; ++i)
        b.async_eval({key(fmt::format("k{}", i))}, {fmt::format("v{}", i)},
                     [&ps, i](std::error_code ec, redis::Reply r) { ps[i].set_value({ec, std::move(r)}); },
                     opts.empty() ? redis::CallOptions{} : opts[i % opts.size()]);
    });
    std::vector<std::pair<std::error_code, redis::Reply>> out;
    for (auto& p : ps) {
      auto f = p.get_future();
      if (f.wait_for(10s) != std::future_status::ready) {
        ADD_FAILURE() << "a call never completed";
        return out;
      }
      out.push_back(f.get());
    }
    return out;
  }

  std::unique_ptr<redis::Client> client_;
};

// `one` answers "one:<arg>", `many` "many:<arg>:<key>" per call, for calls
// of one key and one argument (batch_layout.lua's layout).
const redis::Script kOne{"return 'one:' .. ARGV[1] .. (KEYS[2] and ':2' or '')"};
const redis::Script kMany{R"(local n, nk, mask = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[4]
local out = {}
for i = 1, n do out[i] = 'many:' .. (mask == 's' and ARGV[5] or ARGV[4 + i]) .. ':' .. KEYS[(i - 1) * nk + 1] .. ':' .. nk end
return out)"};

TEST_F(Batcher, CallsOfOneTurnGoAsOneScriptCallEachWithItsOwnReply) {
  auto b = std::make_shared<job::detail::ScriptBatcher>(*client_, kOne, kMany, 64);
  auto got = call(*b, 10);
  ASSERT_EQ(got.size(), 10u);
  for (int i = 0; i < 10; ++i) {
    EXPECT_FALSE(got[i].first) << got[i].first.message();
    EXPECT_EQ(got[i].second.str, fmt::format("many:v{}:{}:1", i, key(fmt::format("k{}", i))));
  }
  EXPECT_EQ(b->sent(), 1u);
  EXPECT_EQ(b->carried(), 10u);
}

TEST_F(Batcher, ALoneCallGoesAsTheSingleScript) {
  auto b = std::make_shared<job::detail::ScriptBatcher>(*client_, kOne, kMany, 64);
  auto got = call(*b, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].second.str, "one:v0");
  // And the next turn's lone call too: nothing is held back.
  got = call(*b, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].second.str, "one:v0");
  EXPECT_EQ(b->sent(), 2u);
}

TEST_F(Batcher, ABatchIsAtMostMaxAndCallsWithOtherOptionsGoApart) {
  auto b = std::make_shared<job::detail::ScriptBatcher>(*client_, kOne, kMany, 4);
  auto got = call(*b, 10);
  ASSERT_EQ(got.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(got[i].second.str.substr(0, 5), "many:") << i;
  EXPECT_EQ(b->sent(), 3u);  // 4 + 4 + 2
  redis::CallOptions quick;
  quick.fail_if_down = true;
  got = call(*b, 4, {redis::CallOptions{}, quick});  // alternating: a batch of two each
  ASSERT_EQ(got.size(), 4u);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(got[i].second.str, fmt::format("many:v{}:{}:1", i, key(fmt::format("k{}", i)))) << i;
  EXPECT_EQ(b->sent(), 5u);
}

// batch_layout.lua has one shape a batch: calls with more keys or arguments
// go in their own.
TEST_F(Batcher, CallsOfAnotherShapeGoApart) {
  auto b = std::make_shared<job::detail::ScriptBatcher>(*client_, kOne, kMany, 16);
  std::vector<std::promise<redis::Reply>> ps(5);
  boost::asio::post(client_->get_executor(), [&] {
    for (int i = 0; i < 5; ++i) {
      std::vector<std::string> keys{key(fmt::format("k{}", i))};
      if (i % 2 == 1) keys.push_back(key("second"));
      b->async_eval(std::move(keys), {fmt::format("v{}", i)},
                    [&ps, i](std::error_code, redis::Reply r) { ps[i].set_value(std::move(r)); });
    }
  });
  for (int i = 0; i < 5; ++i) {
    auto r = ps[i].get_future().get();
    EXPECT_EQ(r.str, fmt::format("many:v{}:{}:{}", i, key(fmt::format("k{}", i)), i % 2 == 1 ? 2 : 1)) << i;
  }
  EXPECT_EQ(b->sent(), 2u);
  EXPECT_EQ(b->carried(), 5u);
}

TEST(EncodeBatch, AnArgumentEveryCallHasTheSameGoesOnceTheRestCallByCall) {
  auto e = job::detail::encode_batch({{"a1", "a2"}, {"b1", "b2"}, {"c1", "c2"}},
                                     {{"t1", "30000", "x"}, {"t2", "30000", "y"}, {"t3", "30000", "x"}});
  EXPECT_EQ(e.keys, (std::vector<std::string>{"a1", "a2", "b1", "b2", "c1", "c2"}));
  EXPECT_EQ(e.args, (std::vector<std::string>{"3", "2", "3", "psp", "30000", "t1", "x", "t2", "y", "t3", "x"}));
  auto all = job::detail::encode_batch({{"a"}, {"b"}}, {{"v", "w"}, {"v", "w"}});
  EXPECT_EQ(all.args, (std::vector<std::string>{"2", "1", "2", "ss", "v", "w"}));
  EXPECT_THROW(job::detail::encode_batch({{"a"}, {"b", "c"}}, {{"v"}, {"v"}}), Error);
  EXPECT_THROW(job::detail::encode_batch({}, {}), Error);
}

TEST_F(Batcher, AFullBatchGoesAtOnceTheRestAtTheEndOfTheTurn) {
  auto b = std::make_shared<job::detail::ScriptBatcher>(*client_, kOne, kMany, 4);
  std::promise<std::vector<std::size_t>> seen;
  std::atomic<int> left{5};
  std::promise<void> all;
  boost::asio::post(client_->get_executor(), [&] {
    std::vector<std::size_t> sent_after;
    for (int i = 0; i < 5; ++i) {
      b->async_eval({key("k")}, {"v"}, [&](std::error_code, redis::Reply) {
        if (--left == 0) all.set_value();
      });
      sent_after.push_back(b->sent());
    }
    seen.set_value(sent_after);
  });
  // The fourth call filled the batch: sent inside the turn, before the fifth.
  EXPECT_EQ(seen.get_future().get(), (std::vector<std::size_t>{0, 0, 0, 1, 1}));
  ASSERT_EQ(all.get_future().wait_for(10s), std::future_status::ready);
  EXPECT_EQ(b->sent(), 2u);
  EXPECT_EQ(b->carried(), 5u);
}

TEST_F(Batcher, AnErrorOfTheBatchReachesEveryCall) {
  const redis::Script failing{"return redis.error_reply('ERR boom')"};
  auto b = std::make_shared<job::detail::ScriptBatcher>(*client_, kOne, failing, 64);
  auto got = call(*b, 3);
  ASSERT_EQ(got.size(), 3u);
  for (const auto& g : got) {
    EXPECT_TRUE(g.first);
    EXPECT_NE(g.second.str.find("boom"), std::string::npos) << g.second.str;
  }
  // A reply of the wrong shape is a protocol error for each, not a crash.
  const redis::Script short_reply{"return {1}"};
  auto s = std::make_shared<job::detail::ScriptBatcher>(*client_, kOne, short_reply, 64);
  got = call(*s, 3);
  ASSERT_EQ(got.size(), 3u);
  for (const auto& g : got) EXPECT_EQ(g.first, make_error_code(errc::protocol_error)) << g.second.str;
}

}  // namespace
