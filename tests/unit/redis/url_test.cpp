#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "jobguard/error.hpp"
#include "jobguard/redis/options.hpp"

using namespace jobguard;
using namespace jobguard::redis;
using std::chrono::milliseconds;
using std::chrono::microseconds;

TEST(ParseUrl, DefaultsForAPlainHost) {
  const auto o = parse_url("redis://cache.internal");
  EXPECT_EQ(o.host, "cache.internal");
  EXPECT_EQ(o.port, 6379);
  EXPECT_EQ(o.db, 0);
  EXPECT_TRUE(o.user.empty());
  EXPECT_TRUE(o.password.empty());
  EXPECT_FALSE(o.tls.enabled);
}

TEST(ParseUrl, UserPasswordPortAndDb) {
  const auto o = parse_url("redis://alice:s3cret@cache.internal:6380/2");
  EXPECT_EQ(o.user, "alice");
  EXPECT_EQ(o.password, "s3cret");
  EXPECT_EQ(o.host, "cache.internal");
  EXPECT_EQ(o.port, 6380);
  EXPECT_EQ(o.db, 2);
  EXPECT_EQ(to_display_url(o), "redis://alice:***@cache.internal:6380/2");
}

TEST(ParseUrl, PasswordOnlyForms) {
  const auto a = parse_url("redis://s3cret@h:7000");
  EXPECT_TRUE(a.user.empty());
  EXPECT_EQ(a.password, "s3cret");
  EXPECT_EQ(a.port, 7000);
  const auto b = parse_url("redis://:s3cret@h");
  EXPECT_TRUE(b.user.empty());
  EXPECT_EQ(b.password, "s3cret");
  EXPECT_EQ(to_display_url(b), "redis://***@h:6379/0");
}

TEST(ParseUrl, PercentEncodedPasswordIsDecoded) {
  const auto o = parse_url("redis://bob:p%40ss%3Aw%2Fd@h");
  EXPECT_EQ(o.user, "bob");
  EXPECT_EQ(o.password, "p@ss:w/d");
}

TEST(ParseUrl, BracketedIpv6HostWithPort) {
  const auto o = parse_url("redis://[::1]:6380/1");
  EXPECT_EQ(o.host, "::1");
  EXPECT_EQ(o.port, 6380);
  EXPECT_EQ(o.db, 1);
  EXPECT_EQ(to_display_url(o), "redis://[::1]:6380/1");
  EXPECT_EQ(parse_url("redis://[fe80::1]").port, 6379);
}

TEST(ParseUrl, AClusterSeedIsShownAsOne) {
  EXPECT_EQ(to_display_url(parse_url("redis://u:pw@10.0.0.1:7000/0?cluster=yes&replicas=1")),
            "redis://u:***@10.0.0.1:7000/0?cluster=yes");
}

TEST(ParseUrl, RedissWithTlsOptions) {
  const auto o = parse_url("rediss://h.example:6390/0?ca=/etc/ssl/ca%20bundle.pem&sni=redis.example&verify=no");
  EXPECT_TRUE(o.tls.enabled);
  EXPECT_EQ(o.tls.ca_file, "/etc/ssl/ca bundle.pem");
  EXPECT_EQ(o.tls.server_name, "redis.example");
  EXPECT_FALSE(o.tls.verify_peer);
  EXPECT_EQ(o.port, 6390);
  EXPECT_TRUE(parse_url("rediss://h").tls.verify_peer);
}

TEST(ParseUrl, DurationAndCountOptions) {
  const auto o = parse_url("redis://h?timeout=250ms&connect_timeout=1s&connections=2&name=worker-7&db=4");
  EXPECT_EQ(o.command_timeout, milliseconds(250));
  EXPECT_EQ(o.connect_timeout, milliseconds(1000));
  EXPECT_EQ(o.connections, 2);
  EXPECT_EQ(o.client_name, "worker-7");
  EXPECT_EQ(o.db, 4);
}

TEST(ParseUrl, BusyPollIsOffUnlessAskedForAndTakesMicroseconds) {
  EXPECT_EQ(parse_url("redis://h").busy_poll, microseconds(0));
  EXPECT_EQ(parse_url("redis://h?busy_poll=300us").busy_poll, microseconds(300));
  EXPECT_EQ(parse_url("redis://h?busy_poll=2ms").busy_poll, microseconds(2000));
  EXPECT_EQ(parse_url("redis://h?busy_poll=0us").busy_poll, microseconds(0));
  EXPECT_EQ(parse_url("redis://h?busy_poll=1s").busy_poll, kMaxBusyPoll);
}

TEST(ParseUrl, ReplicaConfirmationOptions) {
  const auto d = parse_url("redis://h");
  EXPECT_EQ(d.lock_replicas, 0);
  EXPECT_EQ(d.lock_replicas_timeout, milliseconds(500));
  EXPECT_TRUE(d.lock_waitaof);
  const auto o = parse_url("redis://h?replicas=2&replicas_timeout=150ms&waitaof=no");
  EXPECT_EQ(o.lock_replicas, 2);
  EXPECT_EQ(o.lock_replicas_timeout, milliseconds(150));
  EXPECT_FALSE(o.lock_waitaof);
}

TEST(ParseUrl, SentinelListMasterNameAndDb) {
  const auto o = parse_url("redis+sentinel://alice:pw@10.0.0.1:26380,10.0.0.2,[::1]:26390/billing/3?sentinel_password=sp&replicas=1");
  ASSERT_EQ(o.sentinel.sentinels.size(), 3u);
  EXPECT_EQ(o.sentinel.sentinels[0], (SentinelOptions::Address{"10.0.0.1", 26380}));
  EXPECT_EQ(o.sentinel.sentinels[1], (SentinelOptions::Address{"10.0.0.2", 26379}));
  EXPECT_EQ(o.sentinel.sentinels[2], (SentinelOptions::Address{"::1", 26390}));
  EXPECT_EQ(o.sentinel.master_name, "billing");
  EXPECT_EQ(o.sentinel.password, "sp");
  EXPECT_EQ(o.user, "alice");
  EXPECT_EQ(o.password, "pw");
  EXPECT_EQ(o.db, 3);
  EXPECT_EQ(o.lock_replicas, 1);
  EXPECT_EQ(to_display_url(o), "redis+sentinel://alice:***@10.0.0.1:26380,10.0.0.2:26379,[::1]:26390/billing/3");
  EXPECT_TRUE(parse_url("redis://h").sentinel.sentinels.empty());
  EXPECT_EQ(parse_url("redis+sentinel://s/m").sentinel.sentinels.front().port, 26379);
  // TLS: rediss+sentinel is TLS to the sentinels and the data nodes;
  // sentinel_tls says the sentinels' apart.
  const auto both = parse_url("rediss+sentinel://s1,s2/m?ca=/etc/ca.crt");
  EXPECT_TRUE(both.tls.enabled);
  EXPECT_TRUE(both.sentinel.tls);
  EXPECT_EQ(both.tls.ca_file, "/etc/ca.crt");
  EXPECT_EQ(to_display_url(both), "rediss+sentinel://s1:26379,s2:26379/m/0");
  const auto only_sentinels = parse_url("redis+sentinel://s1/m?sentinel_tls=yes");
  EXPECT_FALSE(only_sentinels.tls.enabled);
  EXPECT_TRUE(only_sentinels.sentinel.tls);
  EXPECT_EQ(to_display_url(only_sentinels), "redis+sentinel://s1:26379/m/0?sentinel_tls=yes");
  const auto only_data = parse_url("rediss+sentinel://s1/m?sentinel_tls=no");
  EXPECT_TRUE(only_data.tls.enabled);
  EXPECT_FALSE(only_data.sentinel.tls);
  EXPECT_EQ(to_display_url(only_data), "rediss+sentinel://s1:26379/m/0?sentinel_tls=no");
  EXPECT_FALSE(parse_url("redis+sentinel://s1/m").sentinel.tls);
}

namespace {

struct Bad {
  const char* url;
  const char* names;  // the message must contain this: the bad part, named
};

void PrintTo(const Bad& b, std::ostream* os) { *os << '"' << b.url << '"'; }

}  // namespace

class ParseUrlRejects : public ::testing::TestWithParam<Bad> {};

TEST_P(ParseUrlRejects, WithAOneLineErrorNamingTheBadPartAndNeverThePassword) {
  const Bad& b = GetParam();
  try {
    (void)parse_url(b.url);
    FAIL() << "accepted " << b.url;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), errc::invalid_url) << msg;
    EXPECT_EQ(e.next(), next_step::stop);
    EXPECT_NE(msg.find(b.names), std::string::npos) << "message \"" << msg << "\" does not name " << b.names;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.find("hunter2"), std::string::npos) << "password leaked: " << msg;
    EXPECT_EQ(msg.rfind("invalid URL", 0), 0u) << msg;
    EXPECT_EQ(msg.find("invalid URL", 1), std::string::npos) << "nested error text: " << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, ParseUrlRejects,
    ::testing::Values(Bad{"localhost:6379", "missing scheme"},
                      Bad{"", "missing scheme"},
                      Bad{"http://h:6379", "\"http\""},
                      Bad{"redis://", "missing host"},
                      Bad{"redis://:6379/0", "missing host"},
                      Bad{"redis://alice:hunter2@:6379/0", "missing host"},
                      Bad{"redis://h:0", "port 0 out of range"},
                      Bad{"redis://h:99999", "port 99999 out of range (1..65535)"},
                      Bad{"redis://h:abc", "port is not a number"},
                      Bad{"redis://h:", "empty port"},
                      Bad{"redis://alice:hunter2@h:99999", "port 99999"},
                      Bad{"redis://hunter2@h:abc", "port is not a number"},
                      Bad{"redis://hunter2@h/x", "database is not a number"},
                      Bad{"redis://h/-1", "database -1 out of range"},
                      Bad{"redis://h/x", "database is not a number"},
                      Bad{"redis://h/1/2", "database is not a number"},
                      Bad{"redis://alice:hunter2%zz@h", "%-escape in password"},
                      Bad{"redis://alice:hunter2%4@h", "%-escape in password"},
                      Bad{"redis://h?foo=1", "unknown option \"foo\""},
                      Bad{"redis://alice:hunter2@h?bogus=1", "unknown option \"bogus\""},
                      Bad{"redis://h?timeout", "option \"timeout\" has no value"},
                      Bad{"redis://h?timeout=5x", "timeout"},
                      Bad{"redis://h?timeout=0ms", "timeout must be positive"},
                      Bad{"redis://h?connections=0", "connections 0 out of range"},
                      Bad{"rediss://h?verify=maybe", "verify=\"maybe\""},
                      Bad{"redis+sentinel://h1,h2", "missing master name"},
                      Bad{"redis+sentinel://h1:26379,,h2/m", "empty entry in the sentinel list"},
                      Bad{"redis+sentinel://h1,/m", "empty entry in the sentinel list"},
                      Bad{"redis+sentinel://h1:99999/m", "sentinel \"h1:99999\": port 99999 out of range"},
                      Bad{"redis+sentinel:///m", "missing sentinel host"},
                      Bad{"redis+sentinel://h/m/x", "database is not a number"},
                      Bad{"redis://h?sentinel_password=x", "unknown option \"sentinel_password\""},
                      Bad{"redis://h?sentinel_tls=yes", "unknown option \"sentinel_tls\""},
                      Bad{"redis+sentinel://h/m?sentinel_tls=maybe", "sentinel_tls"},
                      Bad{"redis://h?replicas=65", "replicas 65 out of range (0..64)"},
                      Bad{"redis://h?replicas=one", "replicas is not a number"},
                      Bad{"redis://h?replicas_timeout=0ms", "replicas_timeout must be positive"},
                      Bad{"redis://h?waitaof=sometimes", "waitaof=\"sometimes\""},
                      Bad{"redis://h?busy_poll=2s", "busy_poll must be at most 1s"},
                      Bad{"redis://h?busy_poll=300", "option busy_poll: "},
                      Bad{"redis://h?busy_poll=-5us", "option busy_poll: "},
                      Bad{"redis://alice:@h", "empty password"},
                      // Found by fuzz/url_fuzzer: with_password() then built "redis://:pw@@h".
                      Bad{"redis://@h", "nothing before '@'"},
                      Bad{"redis://[::1", "IPv6"},
                      Bad{"redis://[::1]x", "after IPv6 host"},
                      Bad{"redis://h:6379:1", "host"},
                      Bad{"redis://h st", "host"},
                      Bad{"redis://h?timeout=500us", "round to nothing"},
                      Bad{"redis://h?timeout=3000000h", "maximum"},
                      // The part after the '@' the user forgot
                      // is a password, not a port to quote.
                      Bad{"redis://alice:hunter2/0", "port is not a number"},
                      Bad{"redis://:hunter2@h?na\x1bme=1", "unknown option \"na\\x1bme\""},
                      Bad{"redis://h?b\nad=1", "unknown option \"b\\nad\""}));

// A password holding '/' or '?' must not be cut at them, nor the explanation
// quote a piece of it ("port \"hun\" is not a number").
TEST(ParseUrl, PasswordWithSlashQuestionMarkAtAndColonParses) {
  auto o = parse_url("redis://:se/cr?et@127.0.0.1:1/0");
  EXPECT_EQ(o.password, "se/cr?et");
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_EQ(o.port, 1);
  EXPECT_EQ(o.db, 0);
  o = parse_url("redis://bob:hun/ter:2@cache:6380/3?timeout=2s");
  EXPECT_EQ(o.user, "bob");
  EXPECT_EQ(o.password, "hun/ter:2");
  EXPECT_EQ(o.host, "cache");
  EXPECT_EQ(o.port, 6380);
  EXPECT_EQ(o.db, 3);
  EXPECT_EQ(o.command_timeout, milliseconds(2000));
  o = parse_url("redis://p@ss@h");
  EXPECT_EQ(o.password, "p@ss");
  EXPECT_EQ(o.host, "h");
  EXPECT_EQ(to_display_url(parse_url("redis://:se/cr?et@127.0.0.1:1/0")), "redis://***@127.0.0.1:1/0");
}

TEST(ParseUrl, ErrorsAfterASlashyPasswordDoNotQuoteIt) {
  for (const char* url : {"redis://:hun/ter2@h:abc", "redis://:hun?ter2@h/x", "redis://u:hun/ter2@h?bad=1",
                          "redis://:hun/ter2@", "redis://u:hun/ter2@[::1"}) {
    try {
      (void)parse_url(url);
      ADD_FAILURE() << "accepted " << url;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find("hun"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("ter2"), std::string::npos) << msg;
    }
  }
}

TEST(WithPassword, PutsAPasswordFromElsewhereIntoTheUrl) {
  const std::string url = with_password("redis://cache:6380/2?timeout=1s", "p/w?@:% x");
  const auto o = parse_url(url);
  EXPECT_EQ(o.password, "p/w?@:% x");
  EXPECT_EQ(o.host, "cache");
  EXPECT_EQ(o.port, 6380);
  EXPECT_EQ(o.db, 2);
  EXPECT_EQ(o.command_timeout, milliseconds(1000));
  EXPECT_EQ(parse_url(with_password("rediss://[::1]", "x")).password, "x");
}

TEST(WithPassword, RefusesASecondPasswordAndABadUrlWithoutShowingEither) {
  try {
    (void)with_password("redis://:hunter2@h", "other-secret");
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("already has a password"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("hunter2"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("other-secret"), std::string::npos) << msg;
  }
  EXPECT_THROW((void)with_password("h:6379", "x"), Error);
  EXPECT_THROW((void)with_password("redis://h", ""), Error);
}
