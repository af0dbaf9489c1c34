#include "ops/http_request.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <exception>
#include <memory>

#include "jobguard/text.hpp"

namespace jobguard::ops::http {
namespace {

bool is_tchar(unsigned char c) {
  return std::isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

bool ieq(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Calls `fn` for each comma-separated token of a header value.
template <class Fn>
void for_each_token(std::string_view v, Fn fn) {
  while (!v.empty()) {
    const auto comma = v.find(',');
    fn(trim(v.substr(0, comma)));
    if (comma == std::string_view::npos) break;
    v.remove_prefix(comma + 1);
  }
}

}  // namespace

RequestParser::State RequestParser::fail(int status, std::string why) {
  error_status_ = status;
  error_reason_ = std::move(why);
  state_ = State::error;
  return state_;
}

RequestParser::State RequestParser::feed(std::string_view bytes) {
  if (state_ == State::error) return state_;
  buf_.append(bytes);
  if (state_ == State::done) return state_;  // next() parses the rest
  return parse();
}

RequestParser::State RequestParser::next() {
  if (state_ != State::done) return state_;
  buf_.erase(0, consumed_);
  consumed_ = 0;
  scan_from_ = 0;
  head_len_ = 0;
  body_len_ = 0;
  req_ = {};
  state_ = State::need_more;
  return parse();
}

RequestParser::State RequestParser::parse() {
  if (head_len_ == 0) {
    // RFC 9112 2.2: ignore empty lines before a request line (bounded by the
    // header limit like everything else).
    if (scan_from_ == 0) {
      std::size_t start = 0;
      while (start < buf_.size() && (buf_[start] == '\r' || buf_[start] == '\n')) ++start;
      if (start > 0) buf_.erase(0, start);
    }
    // The head ends at the first empty line (CRLF CRLF, or bare LFs). The
    // scan resumes where the last one stopped: a client trickling a byte at
    // a time must not cost a rescan of the whole head per byte.
    std::size_t end = std::string::npos;
    for (std::size_t i = buf_.find('\n', scan_from_); i != std::string::npos; i = buf_.find('\n', i + 1)) {
      if (i + 1 < buf_.size() && buf_[i + 1] == '\n') {
        end = i + 2;
        break;
      }
      if (i + 2 < buf_.size() && buf_[i + 1] == '\r' && buf_[i + 2] == '\n') {
        end = i + 3;
        break;
      }
      if (i + 1 > limits_.max_header_bytes) break;
    }
    if (end == std::string::npos || end > limits_.max_header_bytes) {
      if (buf_.size() > limits_.max_header_bytes || (end != std::string::npos))
        return fail(431, fmt::format("request headers over {} bytes", limits_.max_header_bytes));
      scan_from_ = buf_.size() > 3 ? buf_.size() - 3 : 0;
      return state_ = State::need_more;
    }
    if (!parse_head(std::string_view(buf_).substr(0, end))) return state_;
    head_len_ = end;
  }
  if (buf_.size() - head_len_ < body_len_) return state_ = State::need_more;
  req_.body = buf_.substr(head_len_, body_len_);
  consumed_ = head_len_ + body_len_;
  return state_ = State::done;
}

bool RequestParser::parse_head(std::string_view head) {
  // Split into lines; a line ends at LF, with an optional CR before it.
  std::vector<std::string_view> lines;
  while (!head.empty()) {
    const auto lf = head.find('\n');
    std::string_view line = head.substr(0, lf);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    head.remove_prefix(lf == std::string_view::npos ? head.size() : lf + 1);
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) return fail(400, "empty request"), false;

  // Request line: METHOD SP request-target SP HTTP/1.x
  const std::string_view rl = lines.front();
  const auto sp1 = rl.find(' ');
  const auto sp2 = sp1 == std::string_view::npos ? sp1 : rl.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || rl.find(' ', sp2 + 1) != std::string_view::npos)
    return fail(400, "malformed request line (expected METHOD TARGET HTTP/1.1)"), false;
  const std::string_view method = rl.substr(0, sp1);
  const std::string_view target = rl.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = rl.substr(sp2 + 1);
  if (method.empty() || !std::all_of(method.begin(), method.end(), [](char c) { return is_tchar(static_cast<unsigned char>(c)); }))
    return fail(400, "malformed method"), false;
  if (target.empty() || target.front() != '/')
    return fail(400, "request target must be a path starting with '/'"), false;
  for (unsigned char c : target)
    if (c <= 0x20 || c >= 0x7f) return fail(400, "control or non-ASCII byte in the request target"), false;
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || !std::isdigit(static_cast<unsigned char>(version[5])) ||
      version[6] != '.' || !std::isdigit(static_cast<unsigned char>(version[7])))
    return fail(400, "malformed HTTP version"), false;
  if (version[5] != '1' || (version[7] != '0' && version[7] != '1'))
    return fail(505, "only HTTP/1.0 and HTTP/1.1 are served"), false;
  req_.method = std::string(method);
  req_.target = std::string(target);
  const auto q = target.find('?');
  req_.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) req_.query = std::string(target.substr(q + 1));
  req_.minor_version = version[7] - '0';
  req_.keep_alive = req_.minor_version == 1;

  bool have_length = false;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::string_view line = lines[i];
    if (line.front() == ' ' || line.front() == '\t')
      return fail(400, "obsolete header line folding"), false;
    const auto colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return fail(400, "malformed header line"), false;
    const std::string_view name = line.substr(0, colon);
    if (!std::all_of(name.begin(), name.end(), [](char c) { return is_tchar(static_cast<unsigned char>(c)); }))
      return fail(400, "malformed header name"), false;
    const std::string_view value = trim(line.substr(colon + 1));
    for (unsigned char c : value)
      if ((c < 0x20 && c != '\t') || c == 0x7f) return fail(400, "control byte in a header value"), false;
    std::string lower(name);
    for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    req_.headers.emplace_back(std::move(lower), std::string(value));
    if (ieq(name, "Content-Length")) {
      if (value.empty() || value.size() > 18 ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return fail(400, "malformed Content-Length"), false;
      const std::size_t n = std::stoull(std::string(value));
      // Two different lengths is how request smuggling starts.
      if (have_length && n != body_len_) return fail(400, "conflicting Content-Length headers"), false;
      if (n > limits_.max_body_bytes)
        return fail(413, fmt::format("request body over {} bytes", limits_.max_body_bytes)), false;
      body_len_ = n;
      have_length = true;
    } else if (ieq(name, "Transfer-Encoding")) {
      return fail(501, "Transfer-Encoding is not supported (a scrape request has no body)"), false;
    } else if (ieq(name, "Connection")) {
      for_each_token(value, [&](std::string_view t) {
        if (ieq(t, "close")) req_.keep_alive = false;
        else if (ieq(t, "keep-alive")) req_.keep_alive = true;
      });
    }
  }
  return true;
}

std::string_view reason_phrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

std::string serialize(const Response& res, bool keep_alive, bool head_request) {
  std::string out = fmt::format(
      "HTTP/1.1 {} {}\r\nServer: jobguard\r\nCache-Control: no-store\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
      res.status, reason_phrase(res.status), res.content_type, res.body.size());
  for (const auto& [k, v] : res.headers) out += fmt::format("{}: {}\r\n", k, v);
  out += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  if (!head_request) out += res.body;
  return out;
}

Response error_response(int status, std::string_view why) {
  Response r;
  r.status = status;
  r.body = fmt::format("{}: {}\n", reason_phrase(status), why);
  return r;
}

void Router::add(std::string path, Handler handler) {
  Route r;
  r.path = std::move(path);
  r.handler = std::move(handler);
  add(std::move(r));
}

void Router::add(Route route) {
  auto path = route.path;
  routes_[std::move(path)] = std::move(route);
}

void Router::dispatch(const Request& req, Respond respond) const {
  const auto it = routes_.find(req.path);
  if (it == routes_.end()) {
    std::string known;
    for (const auto& [path, h] : routes_) known += (known.empty() ? "" : ", ") + path;
    return respond(error_response(404, fmt::format("no such path; try {}", known)));
  }
  const auto& methods = it->second.methods;
  const bool has_get = std::find(methods.begin(), methods.end(), "GET") != methods.end();
  const bool allowed = std::find(methods.begin(), methods.end(), req.method) != methods.end() ||
                       (req.method == "HEAD" && has_get);
  if (!allowed) {
    std::string allow;
    for (const auto& m : methods) allow += (allow.empty() ? "" : ", ") + m;
    if (has_get) allow += ", HEAD";
    auto r = error_response(405, fmt::format("use {}", allow));
    r.headers.emplace_back("Allow", allow);
    return respond(std::move(r));
  }
  // A handler that throws before answering gets a 500; one that answered
  // and then threw must not answer twice.
  // (Atomic: an asynchronous handler answers from another thread.)
  auto answered = std::make_shared<std::atomic<bool>>(false);
  try {
    it->second.handler(req, [respond, answered](Response r) {
      if (!answered->exchange(true)) respond(std::move(r));
    });
  } catch (const std::exception& e) {
    if (!answered->exchange(true)) respond(error_response(500, escape_text(e.what())));
  }
}

std::optional<std::string_view> Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (ieq(k, name)) return std::string_view(v);
  return std::nullopt;
}

namespace {
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<std::string> form_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] == '%') {
      if (i + 2 >= s.size()) return std::nullopt;
      const int hi = hex_value(s[i + 1]), lo = hex_value(s[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}
}  // namespace

std::optional<std::vector<std::pair<std::string, std::string>>> parse_form(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> out;
  while (!text.empty()) {
    const auto amp = text.find('&');
    const std::string_view part = text.substr(0, amp);
    text.remove_prefix(amp == std::string_view::npos ? text.size() : amp + 1);
    if (part.empty()) continue;
    const auto eq = part.find('=');
    auto k = form_decode(part.substr(0, eq));
    auto v = form_decode(eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1));
    if (!k || !v) return std::nullopt;
    out.emplace_back(std::move(*k), std::move(*v));
  }
  return out;
}

}  // namespace jobguard::ops::http
