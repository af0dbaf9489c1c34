// libFuzzer harness: the metrics server's request path without sockets —
// request bytes (split at fuzzer-chosen boundaries) through the parser, the
// router and the response serializer, pipelined requests included.
// Invariants: no crash, leak or UB; every parsed request and every error
// gets exactly one well-formed response; an error status is 4xx/5xx.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "check.hpp"
#include "ops/http_request.hpp"

using namespace jobguard::ops;

namespace {

void check_response(const std::string& bytes, const http::Response& r, bool head) {
  if (bytes.rfind("HTTP/1.1 ", 0) != 0) jobguard::fuzz::fail("response does not start with a status line");
  const auto end = bytes.find("\r\n\r\n");
  if (end == std::string::npos) jobguard::fuzz::fail("response head not terminated");
  if (bytes.size() - end - 4 != (head ? 0 : r.body.size())) jobguard::fuzz::fail("body length mismatch");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::size_t chunk = 1 + data[0] % 128;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);

  http::Router router;
  router.add("/metrics", [](const http::Request& req, const http::Router::Respond& respond) {
    http::Response r;
    r.body = "jobguard_up 1\n" + req.target;
    respond(std::move(r));
  });
  router.add("/healthz", [](const http::Request&, const http::Router::Respond& respond) {
    respond(http::error_response(503, "redis: down"));
  });
  router.add("/boom", [](const http::Request&, const http::Router::Respond&) { throw std::runtime_error("bad\nthing"); });
  // The dashboard's action shape: a POST whose form body is decoded.
  router.add(http::Route{"/act", {"POST"}, [](const http::Request& req, const http::Router::Respond& respond) {
                           http::Response r;
                           const auto form = http::parse_form(req.body);
                           r.body = form ? "ok " + std::to_string(form->size()) : "malformed";
                           respond(std::move(r));
                         }});

  http::Limits limits;
  limits.max_header_bytes = 512;
  limits.max_body_bytes = 64;
  http::RequestParser parser(limits);
  int answered = 0;
  for (std::size_t off = 0; off < in.size() && parser.state() != http::RequestParser::State::error; off += chunk) {
    auto st = parser.feed(in.substr(off, chunk));
    while (st == http::RequestParser::State::done) {
      const http::Request& req = parser.request();
      if (req.path.empty() || req.path.front() != '/') jobguard::fuzz::fail("path without '/'");
      if (req.body.size() > limits.max_body_bytes) jobguard::fuzz::fail("body over the limit");
      if (const auto q = http::parse_form(req.query))
        for (const auto& [k, v] : *q)
          if (k.size() > req.query.size() || v.size() > req.query.size()) jobguard::fuzz::fail("form decoding grew");
      int calls = 0;
      router.dispatch(req, [&](http::Response r) {
        ++calls;
        const bool head = req.method == "HEAD";
        check_response(http::serialize(r, req.keep_alive, head), r, head);
        jobguard::fuzz::expect_one_printable_line(std::string_view(r.body).substr(0, r.body.find('\n')), "body line");
      });
      if (calls != 1) jobguard::fuzz::fail("dispatch did not answer exactly once");
      ++answered;
      st = parser.next();
    }
  }
  if (parser.state() == http::RequestParser::State::error) {
    const int s = parser.error_status();
    if (s < 400 || s > 599) jobguard::fuzz::fail("error status outside 4xx/5xx");
    const auto r = http::error_response(s, parser.error_reason());
    check_response(http::serialize(r, false, false), r, false);
  }
  return answered & 0;
}
