// The pure parts of the Cluster client (src/redis/cluster.hpp): slots,
// routing keys, redirects, the slot map.
#include <gtest/gtest.h>

#include "jobguard/redis/command.hpp"
#include "redis/cluster.hpp"

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
