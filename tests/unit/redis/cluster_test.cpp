// The pure parts of the Cluster client (src/redis/cluster.hpp): slots,
// routing keys, redirects, the slot map.
#include <gtest/gtest.h>

#include <chrono>

#include "jobguard/error.hpp"
#include "jobguard/redis/command.hpp"
#include "redis/cluster.hpp"
#include "redis/multiplexer.hpp"

using namespace jobguard::redis;
using namespace jobguard::redis::detail;

TEST(ClusterSlots, Crc16AndKeySlotsMatchRedis) {
  EXPECT_EQ(crc16("123456789"), 0x31C3);  // the XMODEM check value
  // Values from CLUSTER KEYSLOT on redis-server 7.0.
  EXPECT_EQ(key_slot("foo"), 12182);
  EXPECT_EQ(key_slot("bar"), 5061);
  EXPECT_EQ(key_slot("{user1000}.following"), key_slot("user1000"));
  EXPECT_EQ(key_slot("jobguard:lock:{invoice:1}"), key_slot("jobguard:fence:{invoice:1}"));
  EXPECT_EQ(key_slot("jobguard:lock:{invoice:1}"), key_slot("invoice:1"));
  EXPECT_EQ(key_slot("foo{}{bar}"), crc16("foo{}{bar}") & 16383);  // empty tag: the whole key
  EXPECT_EQ(key_slot("foo{{bar}}zap"), key_slot("{bar"));
  EXPECT_EQ(key_slot("foo{bar}{zap}"), key_slot("bar"));
}

TEST(ClusterSlots, RoutingKeyOfEncodedCommands) {
  auto key = [](std::initializer_list<std::string_view> args) {
    Command c(args);
    auto k = routing_key(c.payload());
    return k ? std::string(*k) : std::string("(any)");
  };
  EXPECT_EQ(key({"SET", "k1", "v", "NX"}), "k1");
  EXPECT_EQ(key({"get", "k2"}), "k2");
  EXPECT_EQ(key({"EVALSHA", "abc", "2", "jobguard:lock:{x}", "jobguard:fence:{x}", "tok"}), "jobguard:lock:{x}");
  EXPECT_EQ(key({"EVAL", "return 1", "0"}), "(any)");
  EXPECT_EQ(key({"PING"}), "(any)");
  EXPECT_EQ(key({"WAIT", "1", "100"}), "(any)");
  EXPECT_EQ(key({"CLUSTER", "SLOTS"}), "(any)");
  EXPECT_EQ(key({"INFO", "server"}), "(any)");
  EXPECT_FALSE(routing_key("garbage"));
  EXPECT_FALSE(routing_key("*2\r\n$3\r\nGET\r\n$10\r\nshort\r\n"));
}

TEST(ClusterRedirects, MovedAndAskAreParsedAndAnythingElseIsNot) {
  auto m = parse_redirect("MOVED 3999 127.0.0.1:6381");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->kind, Redirect::Kind::moved);
  EXPECT_EQ(m->slot, 3999);
  EXPECT_EQ(m->host, "127.0.0.1");
  EXPECT_EQ(m->port, 6381);
  auto a = parse_redirect("ASK 12 [::1]:7000");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, Redirect::Kind::ask);
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 7000);
  auto v6 = parse_redirect("MOVED 1 fe80::1:7001");
  ASSERT_TRUE(v6);
  EXPECT_EQ(v6->host, "fe80::1");
  EXPECT_EQ(v6->port, 7001);
  for (const char* bad : {"MOVED", "MOVED 3999", "MOVED x 1.2.3.4:5", "MOVED 16384 h:1", "MOVED 1 h:0", "MOVED 1 h:70000",
                          "MOVED 1 :5", "TRYAGAIN Multiple keys", "ERR MOVED 1 h:1", "ASK 1 h"})
    EXPECT_FALSE(parse_redirect(bad)) << bad;
}

TEST(ClusterSlotMap, ParsesClusterSlotsAndRefusesOtherShapes) {
  Reply r;
  r.type = Reply::Type::array;
  auto range = [](long long first, long long last, std::string host, long long port) {
    Reply e;
    e.type = Reply::Type::array;
    Reply f, l, node, h, p;
    f.type = l.type = p.type = Reply::Type::integer;
    f.integer = first;
    l.integer = last;
    p.integer = port;
    h.type = Reply::Type::string;
    h.str = std::move(host);
    node.type = Reply::Type::array;
    node.elements = {h, p};
    e.elements = {f, l, node};
    return e;
  };
  r.elements = {range(0, 5460, "127.0.0.1", 7000), range(5461, 16383, "", 7001)};
  const auto m = parse_cluster_slots(r, "10.0.0.9");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].first, 0);
  EXPECT_EQ(m[0].last, 5460);
  EXPECT_EQ(m[0].port, 7000);
  EXPECT_EQ(m[1].host, "10.0.0.9") << "an empty host is the node that answered";
  Reply bad = r;
  bad.elements.push_back(range(10, 5, "h", 1));
  EXPECT_TRUE(parse_cluster_slots(bad, "h").empty());
  Reply big = r;
  big.elements.push_back(range(0, 16384, "h", 1));
  EXPECT_TRUE(parse_cluster_slots(big, "h").empty());
  EXPECT_TRUE(parse_cluster_slots(Reply::error_reply("ERR"), "h").empty());
}

namespace {
// A reply decoded from RESP2 bytes, as the connection's reader decodes it.
Reply decode(const std::string& wire) {
  jobguard::redis::detail::Multiplexer m;
  Reply out;
  jobguard::redis::detail::Multiplexer::Request q;
  q.payload = "*1\r\n$4\r\nPING\r\n";
  q.deadline = jobguard::redis::detail::Clock::now() + std::chrono::hours(1);
  q.done = [&out](std::error_code, Reply r) { out = std::move(r); };
  m.enqueue(std::move(q));
  m.prepare_write();
  m.write_done();
  EXPECT_FALSE(m.feed(wire.data(), wire.size()));
  return out;
}

std::string bulk(const std::string& s) { return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n"; }

// One node of a CLUSTER SHARDS reply, with the fields Redis 7.0.15 sends
// (plus tls-port when the node listens for TLS).
std::string shard_node(const std::string& id, int port, const std::string& ip, const std::string& endpoint,
                       const std::string& role, int tls_port = 0) {
  std::string f = bulk("id") + bulk(id) + bulk("port") + ":" + std::to_string(port) + "\r\n";
  int n = 16;
  if (tls_port) {
    f += bulk("tls-port") + ":" + std::to_string(tls_port) + "\r\n";
    n += 2;
  }
  f += bulk("ip") + bulk(ip) + bulk("endpoint") + bulk(endpoint) + bulk("hostname") + bulk("") + bulk("role") +
       bulk(role) + bulk("replication-offset") + ":72156\r\n" + bulk("health") + bulk("online");
  return "*" + std::to_string(n) + "\r\n" + f;
}
}  // namespace

TEST(ClusterSlotMap, ParsesClusterShardsFromTheWire) {
  // Two shards: the first with two slot ranges and its primary listed second,
  // the second with an unknown endpoint ("?": the node that answered).
  const std::string wire =
      "*2\r\n"
      "*4\r\n" + bulk("slots") + "*4\r\n:0\r\n:5460\r\n:10923\r\n:10923\r\n" + bulk("nodes") + "*2\r\n" +
      shard_node("b1", 30004, "127.0.0.1", "127.0.0.1", "replica") +
      shard_node("a1", 30001, "127.0.0.1", "127.0.0.1", "master") +
      "*4\r\n" + bulk("slots") + "*2\r\n:5461\r\n:10922\r\n" + bulk("nodes") + "*1\r\n" +
      shard_node("a2", 30002, "10.1.1.2", "?", "master");
  const Reply r = decode(wire);
  const auto m = parse_cluster_shards(r, "10.0.0.9", false);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].first, 0);
  EXPECT_EQ(m[0].last, 5460);
  EXPECT_EQ(m[0].host, "127.0.0.1");
  EXPECT_EQ(m[0].port, 30001) << "the range goes to the shard's master, not its replica";
  EXPECT_EQ(m[1].first, 10923);
  EXPECT_EQ(m[1].last, 10923);
  EXPECT_EQ(m[1].port, 30001);
  EXPECT_EQ(m[2].first, 5461);
  EXPECT_EQ(m[2].last, 10922);
  EXPECT_EQ(m[2].host, "10.1.1.2") << "endpoint '?' falls back to ip";
  EXPECT_EQ(m[2].port, 30002);
}

TEST(ClusterSlotMap, ClusterShardsTlsPortAndShardsWithoutSlotsOrPrimary) {
  const std::string wire =
      "*3\r\n"
      "*4\r\n" + bulk("slots") + "*2\r\n:0\r\n:16383\r\n" + bulk("nodes") + "*1\r\n" +
      shard_node("a1", 30001, "127.0.0.1", "", "master", 31001) +
      // A primary just added, no slots yet.
      "*4\r\n" + bulk("slots") + "*0\r\n" + bulk("nodes") + "*1\r\n" + shard_node("a9", 30009, "h", "h", "master") +
      // Slots whose primary is gone and no replica promoted yet.
      "*4\r\n" + bulk("slots") + "*2\r\n:7\r\n:7\r\n" + bulk("nodes") + "*1\r\n" +
      shard_node("b2", 30005, "h", "h", "replica");
  const Reply r = decode(wire);
  const auto plain = parse_cluster_shards(r, "seed", false);
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].port, 30001);
  EXPECT_EQ(plain[0].host, "127.0.0.1") << "an empty endpoint falls back to ip";
  const auto tls = parse_cluster_shards(r, "seed", true);
  ASSERT_EQ(tls.size(), 1u);
  EXPECT_EQ(tls[0].port, 31001);
}

TEST(ClusterSlotMap, ClusterShardsRefusesOtherShapes) {
  EXPECT_TRUE(parse_cluster_shards(Reply::error_reply("ERR"), "h", false).empty());
  // A CLUSTER SLOTS reply is not a CLUSTER SHARDS one.
  const Reply slots = decode("*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n" + bulk("127.0.0.1") + ":7000\r\n" + bulk("id"));
  EXPECT_TRUE(parse_cluster_shards(slots, "h", false).empty());
  // Out-of-range slots.
  const Reply big = decode("*1\r\n*4\r\n" + bulk("slots") + "*2\r\n:0\r\n:16384\r\n" + bulk("nodes") + "*1\r\n" +
                           shard_node("a", 1, "h", "h", "master"));
  EXPECT_TRUE(parse_cluster_shards(big, "h", false).empty());
}

TEST(ClusterSlotMap, ShardsFirstThenSlotsWhenTheServerRefusesIt) {
  SlotMapSource src;
  EXPECT_EQ(src.command(), (std::vector<std::string>{"CLUSTER", "SHARDS"}));
  // A timeout is not an answer: SHARDS stays.
  EXPECT_TRUE(src.parse(make_error_code(jobguard::errc::timeout), Reply::error_reply("timed out"), "h", false).empty());
  EXPECT_FALSE(src.retry_with_slots());
  EXPECT_TRUE(src.shards);
  // Redis 6: "unknown subcommand".
  EXPECT_TRUE(src.parse(make_error_code(jobguard::errc::server_error),
                        Reply::error_reply("ERR unknown subcommand 'SHARDS'. Try CLUSTER HELP."), "h", false)
                  .empty());
  EXPECT_TRUE(src.retry_with_slots());
  EXPECT_EQ(src.command(), (std::vector<std::string>{"CLUSTER", "SLOTS"}));
  const Reply slots = decode("*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n" + bulk("127.0.0.1") + ":7000\r\n" + bulk("id"));
  const auto m = src.parse({}, slots, "h", false);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].port, 7000);
  EXPECT_FALSE(src.retry_with_slots());
}
