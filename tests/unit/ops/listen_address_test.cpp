#include <gtest/gtest.h>

#include "jobguard/error.hpp"
#include "jobguard/ops/metrics_server.hpp"

using jobguard::ops::parse_listen_address;

namespace {
std::string error_of(const std::string& text) {
  try {
    parse_listen_address(text);
  } catch (const jobguard::Error& e) {
    EXPECT_EQ(e.code(), jobguard::errc::invalid_argument);
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST(ListenAddress, HostAndPort) {
  auto a = parse_listen_address("127.0.0.1:9464");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 9464);
  a = parse_listen_address("localhost:0");
  EXPECT_EQ(a.host, "localhost");
  EXPECT_EQ(a.port, 0);
  EXPECT_EQ(parse_listen_address("0.0.0.0:65535").port, 65535);
}

TEST(ListenAddress, Ipv6InBrackets) {
  auto a = parse_listen_address("[::1]:9464");
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 9464);
  EXPECT_EQ(parse_listen_address("[fe80::1%eth0]:80").host, "fe80::1%eth0");
}

TEST(ListenAddress, MalformedNamesWhatIsWrong) {
  EXPECT_NE(error_of("").find("is empty"), std::string::npos);
  EXPECT_NE(error_of("127.0.0.1").find("missing :PORT"), std::string::npos);
  EXPECT_NE(error_of("127.0.0.1:").find("port is empty"), std::string::npos);
  EXPECT_NE(error_of("127.0.0.1:65536").find("0..65535"), std::string::npos);
  EXPECT_NE(error_of("127.0.0.1:999999").find("0..65535"), std::string::npos);
  EXPECT_NE(error_of("127.0.0.1:-1").find("not a number"), std::string::npos);
  EXPECT_NE(error_of("127.0.0.1:94x").find("\"94x\" is not a number"), std::string::npos);
  EXPECT_NE(error_of(":9464").find("host is empty"), std::string::npos);
  EXPECT_NE(error_of("::1:9464").find("needs brackets"), std::string::npos);
  EXPECT_NE(error_of("[::1:9464").find("missing ']'"), std::string::npos);
  EXPECT_NE(error_of("[::1]9464").find("expected :PORT"), std::string::npos);
  EXPECT_NE(error_of("[]:9464").find("empty"), std::string::npos);
  EXPECT_NE(error_of("exa mple:1").find("not a host name"), std::string::npos);
  const std::string e = error_of("http://x:1");
  EXPECT_NE(e.find("\"http://x:1\""), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
}
