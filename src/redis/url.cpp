#include <fmt/format.h>

#include <cctype>
#include <charconv>

#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "jobguard/redis/options.hpp"
#include "jobguard/text.hpp"

namespace jobguard::redis {
namespace {

[[noreturn]] void bad(std::string_view url, std::string_view what) {
  // Never echo a password back, and never a control byte.
  throw Error(errc::invalid_url, fmt::format("{} in \"{}\"", what, redact_url(url)));
}

std::string percent_decode(std::string_view s, std::string_view url, std::string_view part) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      unsigned v = 0;
      if (i + 2 >= s.size()) bad(url, fmt::format("truncated %-escape in {}", escape_text(part, 64)));
      auto r = std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16);
      if (r.ec != std::errc{} || r.ptr != s.data() + i + 3) bad(url, fmt::format("bad %-escape in {}", escape_text(part, 64)));
      out.push_back(static_cast<char>(v));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

template <class T>
T parse_int(std::string_view s, std::string_view url, std::string_view part, long long lo, long long hi) {
  long long v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || r.ec == std::errc::invalid_argument || r.ptr != s.data() + s.size())
    bad(url, fmt::format("{} is not a number ({}..{})", part, lo, hi));
  if (r.ec == std::errc::result_out_of_range || v < lo || v > hi)
    bad(url, fmt::format("{} {} out of range ({}..{})", part, s, lo, hi));
  return static_cast<T>(v);
}

bool parse_bool(std::string_view v, std::string_view url, std::string_view key) {
  if (v == "1" || v == "yes" || v == "true" || v == "on") return true;
  if (v == "0" || v == "no" || v == "false" || v == "off") return false;
  bad(url, fmt::format("option {}=\"{}\" is not yes/no", escape_text(key, 64), escape_text(v, 64)));
}

// Splits "scheme://": which of the four schemes, and the TLS it implies.
// Returns true for a Sentinel scheme.
bool parse_scheme(std::string_view& rest, std::string_view url, ConnectionOptions& o) {
  const auto scheme_end = rest.find("://");
  // Not echoed: text with no "://" may be anything, a bare password included.
  if (scheme_end == std::string_view::npos)
    throw Error(errc::invalid_url, "missing scheme in the Redis URL (expected redis:// or rediss://)");
  const std::string_view scheme = rest.substr(0, scheme_end);
  const bool sentinel = scheme == "redis+sentinel" || scheme == "rediss+sentinel";
  if (scheme == "rediss") o.tls.enabled = true;
  else if (scheme == "rediss+sentinel") o.tls.enabled = o.sentinel.tls = true;
  else if (scheme != "redis" && !sentinel)
    bad(url, fmt::format("unsupported scheme \"{}\" (expected redis, rediss, redis+sentinel or rediss+sentinel)",
                         escape_text(scheme, 32)));
  rest.remove_prefix(scheme_end + 3);
  return sentinel;
}

// userinfo first, and up to the last '@': a password may hold a raw '/',
// '?', ':' or '@' (people paste generated ones without percent-encoding),
// which must not be taken for the path, query or port. The cost: an '@' in
// a query value must be written %40.
void parse_userinfo(std::string_view& rest, std::string_view url, ConnectionOptions& o) {
  const auto at = rest.rfind('@');
  if (at == std::string_view::npos) return;
  const std::string_view userinfo = rest.substr(0, at);
  rest = rest.substr(at + 1);
  if (userinfo.empty()) bad(url, "nothing before '@' (expected [user:]password@host)");
  if (auto colon = userinfo.find(':'); colon != std::string_view::npos) {
    o.user = percent_decode(userinfo.substr(0, colon), url, "user");
    o.password = percent_decode(userinfo.substr(colon + 1), url, "password");
    if (o.password.empty()) bad(url, "empty password after ':'");
  } else {
    // redis://secret@host is the classic password-only form.
    o.password = percent_decode(userinfo, url, "password");
  }
}

// Cuts `rest` at the first `sep`: what follows it is returned, `rest` keeps what precedes it.
std::string_view cut_at(std::string_view& rest, char sep) {
  const auto at = rest.find(sep);
  if (at == std::string_view::npos) return {};
  const std::string_view after = rest.substr(at + 1);
  rest = rest.substr(0, at);
  return after;
}

// host[:port][,host[:port]...] and the path's master-name[/db]; `path` is
// left holding the db part.
void parse_sentinels(std::string_view list, std::string_view& path, std::string_view url, ConnectionOptions& o) {
  if (list.empty()) bad(url, "missing sentinel host (redis+sentinel://host:26379,host:26380/master-name)");
  for (;;) {
    const auto comma = list.find(',');
    const std::string_view one = list.substr(0, comma);
    if (one.empty()) bad(url, "empty entry in the sentinel list");
    ConnectionOptions single;
    try {
      single = parse_url(fmt::format("redis://{}", one));
    } catch (const Error& e) {
      // Name the entry; the full URL is quoted once, by bad().
      std::string_view why = e.detail();
      if (const auto in = why.rfind(" in \""); in != std::string_view::npos) why = why.substr(0, in);
      bad(url, fmt::format("sentinel \"{}\": {}", escape_text(one, 64), why));
    }
    if (one.find(':') == std::string_view::npos || (one.front() == '[' && one.back() == ']')) single.port = 26379;
    o.sentinel.sentinels.push_back({single.host, single.port});
    if (comma == std::string_view::npos) break;
    list = list.substr(comma + 1);
  }
  const auto slash = path.find('/');
  const std::string_view name = path.substr(0, slash);
  if (name.empty()) bad(url, "missing master name after the sentinel list (redis+sentinel://host:26379/master-name)");
  for (char c : name)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      bad(url, fmt::format("invalid character in master name \"{}\"", escape_text(name, 64)));
  o.sentinel.master_name = percent_decode(name, url, "master name");
  path = slash == std::string_view::npos ? std::string_view{} : path.substr(slash + 1);
  o.host = o.sentinel.sentinels.front().host;
  o.port = o.sentinel.sentinels.front().port;
}

// host[:port] or [v6][:port].
void parse_host_port(std::string_view rest, std::string_view url, ConnectionOptions& o) {
  std::string_view host = rest, port;
  if (!rest.empty() && rest.front() == '[') {
    auto close = rest.find(']');
    if (close == std::string_view::npos) bad(url, "unterminated IPv6 host '['");
    host = rest.substr(1, close - 1);
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') bad(url, fmt::format("unexpected \"{}\" after IPv6 host", escape_text(after, 64)));
      port = after.substr(1);
      if (port.empty()) bad(url, "empty port after ':'");
    }
  } else if (auto colon = rest.rfind(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (port.empty()) bad(url, "empty port after ':'");
  }
  if (host.empty()) bad(url, "missing host");
  if (rest.front() != '[' && host.find(':') != std::string_view::npos)
    bad(url, fmt::format("invalid host \"{}\" (an IPv6 address goes in brackets: [::1]:6379)", escape_text(host, 64)));
  for (char c : host)
    if (c == ' ' || c == '/' || c == '?' || c == '#' || c == '@' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      bad(url, fmt::format("invalid character '{}' in host \"{}\"", escape_text(std::string_view(&c, 1)),
                           escape_text(host, 64)));
  o.host = std::string(host);
  if (!port.empty()) o.port = parse_int<std::uint16_t>(port, url, "port", 1, 65535);
}

// A duration option, its parse error rephrased as the URL's.
template <class Parse>
auto url_duration(const std::string& val, std::string_view url, std::string_view key, Parse parse) {
  try {
    return parse(val, key);
  } catch (const Error& e) {
    // Keep one "invalid URL:" prefix: drop the nested category text.
    std::string_view why = e.what();
    const std::string prefix = e.code().message() + ": ";
    if (why.substr(0, prefix.size()) == prefix) why.remove_prefix(prefix.size());
    bad(url, fmt::format("option {}: {}", escape_text(key, 64), why));
  }
}

std::chrono::milliseconds parse_positive_duration(const std::string& val, std::string_view url, std::string_view key) {
  const auto d = url_duration(val, url, key, parse_duration_ms);
  if (d.count() <= 0) bad(url, fmt::format("option {} must be positive (at least 1ms)", key));
  return d;
}

// 0 is allowed: off, as when the option is absent.
std::chrono::microseconds busy_poll(const std::string& val, std::string_view url) {
  const auto d = url_duration(val, url, "busy_poll", parse_duration);
  if (d > kMaxBusyPoll) bad(url, "option busy_poll must be at most 1s");
  return d;
}

// One "key=value" of the query; `val` is already percent-decoded.
void apply_option(std::string_view key, const std::string& val, bool sentinel, std::string_view url,
                  ConnectionOptions& o) {
  auto dur = [&] { return parse_positive_duration(val, url, key); };
  if (key == "timeout") o.command_timeout = dur();
  else if (key == "connect_timeout") o.connect_timeout = dur();
  else if (key == "connections") o.connections = parse_int<int>(val, url, "connections", 1, 64);
  else if (key == "ca") o.tls.ca_file = val;
  else if (key == "sni") o.tls.server_name = val;
  else if (key == "verify") o.tls.verify_peer = parse_bool(val, url, key);
  else if (key == "cert") o.tls.cert_file = val;
  else if (key == "key") o.tls.key_file = val;
  else if (key == "name") o.client_name = val;
  else if (key == "max_ttl") o.lock_max_ttl = dur();
  else if (key == "replicas") o.lock_replicas = parse_int<int>(val, url, "replicas", 0, 64);
  else if (key == "replicas_timeout") o.lock_replicas_timeout = dur();
  else if (key == "waitaof") o.lock_waitaof = parse_bool(val, url, key);
  else if (key == "sentinel_password" && sentinel) o.sentinel.password = val;
  else if (key == "sentinel_check" && sentinel) o.sentinel.check_interval = dur();
  else if (key == "sentinel_tls" && sentinel) o.sentinel.tls = parse_bool(val, url, key);
  else if (key == "cluster") o.cluster = parse_bool(val, url, key);
  else if (key == "busy_poll") o.busy_poll = busy_poll(val, url);
  else if (key == "db") o.db = parse_int<int>(val, url, "database", 0, 1 << 20);
  else bad(url, fmt::format("unknown option \"{}\"", escape_text(key, 64)));
}

void parse_query(std::string_view query, bool sentinel, std::string_view url, ConnectionOptions& o) {
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view kv = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (kv.empty()) continue;
    auto eq = kv.find('=');
    if (eq == std::string_view::npos) bad(url, fmt::format("option \"{}\" has no value", escape_text(kv, 64)));
    const std::string_view key = kv.substr(0, eq);
    apply_option(key, percent_decode(kv.substr(eq + 1), url, key), sentinel, url, o);
  }
}

}  // namespace

ConnectionOptions parse_url(std::string_view url) {
  ConnectionOptions o;
  std::string_view rest = url;
  const bool sentinel = parse_scheme(rest, url, o);
  parse_userinfo(rest, url, o);
  const std::string_view query = cut_at(rest, '?');
  std::string_view path = cut_at(rest, '/');
  if (sentinel) parse_sentinels(rest, path, url, o);
  else parse_host_port(rest, url, o);
  if (!path.empty()) o.db = parse_int<int>(path, url, "database", 0, 1 << 20);
  parse_query(query, sentinel, url, o);
  return o;
}

std::string with_password(std::string_view url, std::string_view password) {
  const ConnectionOptions o = parse_url(url);
  if (!o.password.empty())
    throw Error(errc::invalid_url, fmt::format("the Redis URL \"{}\" already has a password; give it in one place only",
                                               redact_url(url)));
  if (password.empty()) throw Error(errc::invalid_url, "the Redis password is empty");
  // No password means no userinfo: parse_url reads "x@host" as a password.
  std::string encoded;
  for (unsigned char c : password) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') encoded.push_back(static_cast<char>(c));
    else encoded += fmt::format("%{:02X}", c);
  }
  const auto start = url.find("://") + 3;
  return fmt::format("{}:{}@{}", url.substr(0, start), encoded, url.substr(start));
}

std::string to_display_url(const ConnectionOptions& o) {
  std::string auth;
  if (!o.user.empty()) auth = escape_text(o.user, 64) + (o.password.empty() ? "" : ":***") + "@";
  else if (!o.password.empty()) auth = "***@";
  if (!o.sentinel.sentinels.empty()) {
    std::string list;
    for (const auto& a : o.sentinel.sentinels) {
      const bool v6 = a.host.find(':') != std::string::npos;
      list += fmt::format("{}{}{}{}:{}", list.empty() ? "" : ",", v6 ? "[" : "", a.host, v6 ? "]" : "", a.port);
    }
    // The scheme says the data nodes' TLS; the sentinels' is said when it differs.
    const char* tls_note = o.sentinel.tls == o.tls.enabled ? "" : o.sentinel.tls ? "?sentinel_tls=yes" : "?sentinel_tls=no";
    return fmt::format("{}://{}{}/{}/{}{}", o.tls.enabled ? "rediss+sentinel" : "redis+sentinel", auth, list,
                       escape_text(o.sentinel.master_name, 64), o.db, tls_note);
  }
  const bool v6 = o.host.find(':') != std::string::npos;
  // A cluster seed says so: the host is one node of several, not the server.
  return fmt::format("{}://{}{}{}{}:{}/{}{}", o.tls.enabled ? "rediss" : "redis", auth, v6 ? "[" : "", o.host,
                     v6 ? "]" : "", o.port, o.db, o.cluster ? "?cluster=yes" : "");
}

}  // namespace jobguard::redis
