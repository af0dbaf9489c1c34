// The metrics server's request path without sockets: bytes in, requests or
// error statuses out, routes, response bytes.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "ops/http_request.hpp"

using namespace jobguard::ops::http;
using State = RequestParser::State;

namespace {

// Parses `bytes` fed one byte at a time (every split point), then whole.
State parse_split(const std::string& bytes, Request* out = nullptr, int* status = nullptr) {
  State whole_state;
  {
    RequestParser whole;
    whole_state = whole.feed(bytes);
    if (out && whole_state == State::done) *out = whole.request();
    if (status && whole_state == State::error) *status = whole.error_status();
  }
  RequestParser p;
  State st = State::need_more;
  for (char c : bytes) {
    st = p.feed(std::string_view(&c, 1));
    if (st != State::need_more) break;
  }
  EXPECT_EQ(st, whole_state) << "byte-at-a-time disagrees with whole for: " << bytes;
  return whole_state;
}

int error_of(const std::string& bytes) {
  int status = 0;
  EXPECT_EQ(parse_split(bytes, nullptr, &status), State::error) << bytes;
  return status;
}

}  // namespace

TEST(HttpRequestParser, ParsesAScrapeRequestAtEverySplit) {
  Request r;
  ASSERT_EQ(parse_split("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n", &r), State::done);
  EXPECT_EQ(r.method, "GET");
  EXPECT_EQ(r.target, "/metrics?x=1");
  EXPECT_EQ(r.path, "/metrics");
  EXPECT_EQ(r.minor_version, 1);
  EXPECT_TRUE(r.keep_alive);
}

TEST(HttpRequestParser, KeepAliveFollowsVersionAndConnectionHeader) {
  Request r;
  parse_split("GET / HTTP/1.0\r\n\r\n", &r);
  EXPECT_FALSE(r.keep_alive);
  parse_split("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", &r);
  EXPECT_TRUE(r.keep_alive);
  parse_split("GET / HTTP/1.1\r\nconnection: foo, close\r\n\r\n", &r);
  EXPECT_FALSE(r.keep_alive);
  parse_split("GET / HTTP/1.1\n\n", &r);  // bare LFs are tolerated
  EXPECT_TRUE(r.keep_alive);
}

TEST(HttpRequestParser, IncompleteIsNeedMore) {
  EXPECT_EQ(RequestParser().feed("GET /metr"), State::need_more);
  EXPECT_EQ(RequestParser().feed("GET / HTTP/1.1\r\nContent-Length: 4\r\n\r\nab"), State::need_more);
  RequestParser p;
  EXPECT_FALSE(p.mid_request());
  p.feed("G");
  EXPECT_TRUE(p.mid_request());
}

TEST(HttpRequestParser, MalformedRequestsAre400) {
  EXPECT_EQ(error_of("GARBAGE\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET  /metrics HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET metrics HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET http://x/metrics HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET /m\x01 HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET / HTTP/1.1 extra\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET / HTTX/1.1\r\n\r\n"), 400);
  EXPECT_EQ(error_of("G(T / HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nNoColon\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nBad Name: x\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nA: b\x1b" "c\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"), 400);
}

TEST(HttpRequestParser, LimitsAnd5xx) {
  EXPECT_EQ(error_of("GET / HTTP/2.0\r\n\r\n"), 505);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"), 501);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nContent-Length: 4097\r\n\r\n"), 413);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nX: " + std::string(9000, 'a') + "\r\n\r\n"), 431);
  // Headers that never end are refused once over the limit, not buffered.
  RequestParser p;
  std::string chunk(1024, 'a');
  State st = p.feed("GET / HTTP/1.1\r\nX: ");
  for (int i = 0; i < 20 && st == State::need_more; ++i) st = p.feed(chunk);
  EXPECT_EQ(st, State::error);
  EXPECT_EQ(p.error_status(), 431);
  EXPECT_EQ(p.feed("more"), State::error) << "an error sticks";
}

TEST(HttpRequestParser, PipelinedRequestsComeOneAtATime) {
  RequestParser p;
  ASSERT_EQ(p.feed("GET /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nxyzGET /b HTTP/1.1\r\n\r\nGET /c"), State::done);
  EXPECT_EQ(p.request().path, "/a");
  ASSERT_EQ(p.next(), State::done);
  EXPECT_EQ(p.request().path, "/b");
  EXPECT_EQ(p.next(), State::need_more);
  EXPECT_TRUE(p.mid_request());
  ASSERT_EQ(p.feed(" HTTP/1.1\r\n\r\n"), State::done);
  EXPECT_EQ(p.request().path, "/c");
}

TEST(HttpRouter, KnownPathUnknownPathWrongMethodAndThrowingHandler) {
  Router router;
  router.add("/metrics", [](const Request&, const Router::Respond& respond) {
    Response r;
    r.body = "m\n";
    respond(r);
  });
  router.add("/boom", [](const Request&, const Router::Respond&) { throw std::runtime_error("bad\nthing"); });
  router.add("/twice", [](const Request&, const Router::Respond& respond) {
    respond(Response{});
    throw std::runtime_error("after answering");
  });
  auto call = [&](const std::string& method, const std::string& path) {
    Request req;
    req.method = method;
    req.path = path;
    int calls = 0;
    Response out;
    router.dispatch(req, [&](Response r) {
      ++calls;
      out = std::move(r);
    });
    EXPECT_EQ(calls, 1) << method << " " << path;
    return out;
  };
  EXPECT_EQ(call("GET", "/metrics").body, "m\n");
  EXPECT_EQ(call("HEAD", "/metrics").status, 200);
  const auto nf = call("GET", "/nope");
  EXPECT_EQ(nf.status, 404);
  EXPECT_NE(nf.body.find("/metrics"), std::string::npos) << nf.body;
  const auto na = call("POST", "/metrics");
  EXPECT_EQ(na.status, 405);
  ASSERT_EQ(na.headers.size(), 1u);
  EXPECT_EQ(na.headers[0].first, "Allow");
  const auto boom = call("GET", "/boom");
  EXPECT_EQ(boom.status, 500);
  EXPECT_EQ(boom.body, "Internal Server Error: bad\\nthing\n");
  EXPECT_EQ(call("GET", "/twice").status, 200);
}

TEST(HttpSerialize, StatusLineHeadersAndHeadWithoutBody) {
  Response r;
  r.status = 503;
  r.body = "unavailable\n";
  r.headers.emplace_back("Allow", "GET");
  const std::string full = serialize(r, false, false);
  EXPECT_EQ(full.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u) << full;
  EXPECT_NE(full.find("Content-Length: 12\r\n"), std::string::npos);
  EXPECT_NE(full.find("Allow: GET\r\n"), std::string::npos);
  EXPECT_NE(full.find("Connection: close\r\n\r\nunavailable\n"), std::string::npos);
  const std::string head = serialize(r, true, true);
  EXPECT_NE(head.find("Content-Length: 12\r\n"), std::string::npos);
  EXPECT_EQ(head.substr(head.size() - 26), "Connection: keep-alive\r\n\r\n") << head;
}

TEST(HttpRequestParser, KeepsHeadersQueryAndBodyForTheDashboardsActions) {
  Request req;
  ASSERT_EQ(parse_split("POST /api/locks/release?x=1 HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer  s3cret \r\n"
                        "Content-Length: 11\r\n\r\nresource=ab",
                        &req),
            State::done);
  EXPECT_EQ(req.method, "POST");
  EXPECT_EQ(req.path, "/api/locks/release");
  EXPECT_EQ(req.query, "x=1");
  EXPECT_EQ(req.body, "resource=ab");
  ASSERT_TRUE(req.header("AUTHORIZATION"));
  EXPECT_EQ(*req.header("authorization"), "Bearer  s3cret");
  EXPECT_FALSE(req.header("cookie"));
}

TEST(HttpRequestParser, PipelinedRequestsEachKeepTheirOwnBody) {
  RequestParser p;
  ASSERT_EQ(p.feed("POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nonePOST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\ntwo"),
            State::done);
  EXPECT_EQ(p.request().body, "one");
  ASSERT_EQ(p.next(), State::done);
  EXPECT_EQ(p.request().path, "/b");
  EXPECT_EQ(p.request().body, "two");
  EXPECT_TRUE(p.request().headers.size() == 1);
}

TEST(HttpForm, DecodesEscapesAndPlusAndRefusesMalformedOnes) {
  const auto f = parse_form("a=1&b=x%20y+z&&c&d=%7B%7d");
  ASSERT_TRUE(f);
  ASSERT_EQ(f->size(), 4u);
  EXPECT_EQ((*f)[1], (std::pair<std::string, std::string>{"b", "x y z"}));
  EXPECT_EQ((*f)[2], (std::pair<std::string, std::string>{"c", ""}));
  EXPECT_EQ((*f)[3].second, "{}");
  for (const char* bad : {"a=%", "a=%4", "a=%zz", "%g1=1"}) EXPECT_FALSE(parse_form(bad)) << bad;
  EXPECT_TRUE(parse_form("")->empty());
}

TEST(HttpRouter, RoutesServeTheirOwnMethodsAndNameThemIn405) {
  Router router;
  router.add(Route{"/act", {"POST"}, [](const Request&, const Respond& respond) { respond(Response{}); }});
  Request req;
  req.path = "/act";
  req.method = "POST";
  int status = 0;
  std::string allow;
  router.dispatch(req, [&](Response r) { status = r.status; });
  EXPECT_EQ(status, 200);
  req.method = "GET";
  router.dispatch(req, [&](Response r) {
    status = r.status;
    for (auto& [k, v] : r.headers)
      if (k == "Allow") allow = v;
  });
  EXPECT_EQ(status, 405);
  EXPECT_EQ(allow, "POST");
}
