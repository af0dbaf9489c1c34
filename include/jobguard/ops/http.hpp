// The request and response values of the metrics server's routes, public so
// a program (or jobguard's dashboard) can add routes of its own through
// MetricsServerOptions::routes. Plain values: any thread.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace jobguard::ops::http {

struct Request {
  std::string method;  // "GET", "HEAD", "POST", ... as sent (tokens are case-sensitive)
  std::string target;  // "/metrics?x=1" as sent
  std::string path;    // target without its query
  std::string query;   // what follows '?', undecoded; empty without one
  int minor_version = 1;  // HTTP/1.<minor>
  bool keep_alive = true;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, values trimmed, in order
  std::string body;  // at most Limits::max_body_bytes

  // The first header of that name (case-insensitive), or nullopt.
  std::optional<std::string_view> header(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

// The decoded values of an application/x-www-form-urlencoded string
// ("a=1&b=x%20y", also a URL's query), in order; '+' is a space. Returns
// nullopt for a malformed escape ("%zz", "%4"), so a caller can answer 400
// instead of acting on a half-decoded name.
std::optional<std::vector<std::pair<std::string, std::string>>> parse_form(std::string_view text);

// Answers through `respond`, now or later (exactly once), on any thread.
using Respond = std::function<void(Response)>;
using Handler = std::function<void(const Request&, Respond)>;

struct Route {
  std::string path;  // exact match, e.g. "/api/locks"
  // Methods served; HEAD is served wherever GET is. Another method gets 405
  // with Allow. Default GET.
  std::vector<std::string> methods{"GET"};
  Handler handler;
};

}  // namespace jobguard::ops::http
