// Sans-IO HTTP/1.x for the metrics server and the dashboard: request bytes in, requests or an
// error status out; a route table that turns a request into a response; the
// response's bytes. No sockets, so the whole request path is tested and
// fuzzed by feeding it bytes (tests/unit/ops/http_request_test.cpp,
// fuzz/http_fuzzer.cpp); metrics_server.cpp is the thin I/O shell around it.
//
// Only what a scrape endpoint and the dashboard need: small headers and a
// small Content-Length body (the dashboard's action forms). Anything else
// gets a precise 4xx/5xx and the connection is closed: 400 malformed, 413
// body too large, 431 headers too large, 501 chunked bodies, 505 HTTP
// versions other than 1.0/1.1.
//
// Threads: a parser or router belongs to one connection / server; not
// thread-safe.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jobguard/ops/http.hpp"

namespace jobguard::ops::http {

struct Limits {
  std::size_t max_header_bytes = 8 * 1024;  // request line + headers; over it: 431
  std::size_t max_body_bytes = 4 * 1024;    // Content-Length over it: 413
};

class RequestParser {
 public:
  enum class State { need_more, done, error };

  explicit RequestParser(Limits limits = {}) : limits_(limits) {}

  // Appends bytes and parses as far as they go. After `done`, request() is
  // valid until next(); after `error`, error_status()/error_reason() say why
  // and the connection should be answered and closed (the state sticks).
  State feed(std::string_view bytes);
  // Forgets the request just returned and parses what is already buffered
  // (a pipelined request).
  State next();

  State state() const noexcept { return state_; }
  const Request& request() const noexcept { return req_; }
  int error_status() const noexcept { return error_status_; }
  const std::string& error_reason() const noexcept { return error_reason_; }
  // True when some bytes of a not-yet-complete request are buffered: the
  // connection is mid-request, not idle.
  bool mid_request() const noexcept { return state_ == State::need_more && !buf_.empty(); }

 private:
  State parse();
  State fail(int status, std::string why);
  bool parse_head(std::string_view head);

  Limits limits_;
  std::string buf_;
  State state_ = State::need_more;
  Request req_;
  std::size_t scan_from_ = 0;     // where the search for the end of the head resumes
  std::size_t head_len_ = 0;      // bytes of request line + headers + blank line, once found
  std::size_t body_len_ = 0;      // Content-Length of the request being read
  std::size_t consumed_ = 0;      // bytes of buf_ the done request occupies
  int error_status_ = 0;
  std::string error_reason_;
};

// The standard reason phrase ("Not Found"); "Unknown" for others.
std::string_view reason_phrase(int status);

// Status line, headers (Server, Cache-Control: no-store, Content-Type,
// Content-Length, Connection) and body; no body for HEAD.
std::string serialize(const Response& res, bool keep_alive, bool head_request);

// A plain-text error response: "<reason>: <why>\n".
Response error_response(int status, std::string_view why);

// Path -> handler. The route's methods (and HEAD where GET is) reach the
// handler; another method on a known path is 405 (with Allow), an unknown
// path 404 (listing the known ones).
// Handlers answer through `respond`, now or later (exactly once); one that
// throws answers 500 with the exception's text (escaped).
class Router {
 public:
  using Respond = http::Respond;
  using Handler = http::Handler;

  // GET (and HEAD) only.
  void add(std::string path, Handler handler);
  void add(Route route);
  void dispatch(const Request& req, Respond respond) const;

 private:
  std::map<std::string, Route, std::less<>> routes_;
};

}  // namespace jobguard::ops::http
