#include "redis/cluster.hpp"

#include "jobguard/error.hpp"

#include <charconv>

namespace jobguard::redis::detail {

std::uint16_t crc16(std::string_view data) noexcept {
  std::uint16_t crc = 0;
  for (unsigned char c : data) {
    crc = static_cast<std::uint16_t>(crc ^ (static_cast<std::uint16_t>(c) << 8));
    for (int i = 0; i < 8; ++i)
      crc = (crc & 0x8000) ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021) : static_cast<std::uint16_t>(crc << 1);
  }
  return crc;
}

}  // namespace jobguard::redis::detail

std::uint16_t jobguard::redis::key_slot(std::string_view key) noexcept {
  using detail::crc16;
  using detail::kClusterSlots;
  const auto open = key.find('{');
  if (open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return static_cast<std::uint16_t>(crc16(key) & (kClusterSlots - 1));
}

namespace jobguard::redis::detail {

namespace {
// Reads "<c><number>\r\n" at `at`; false when it is not there.
bool read_header(std::string_view p, std::size_t& at, char c, long long& n) {
  if (at >= p.size() || p[at] != c) return false;
  const auto end = p.find("\r\n", at);
  if (end == std::string_view::npos) return false;
  const auto [ptr, ec] = std::from_chars(p.data() + at + 1, p.data() + end, n);
  if (ec != std::errc() || ptr != p.data() + end) return false;
  at = end + 2;
  return true;
}

bool read_bulk(std::string_view p, std::size_t& at, std::string_view& out) {
  long long len = 0;
  if (!read_header(p, at, '$', len) || len < 0 || at + static_cast<std::size_t>(len) + 2 > p.size()) return false;
  out = p.substr(at, static_cast<std::size_t>(len));
  at += static_cast<std::size_t>(len) + 2;
  return true;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'a' && x <= 'z') x = static_cast<char>(x - 32);
    if (y >= 'a' && y <= 'z') y = static_cast<char>(y - 32);
    if (x != y) return false;
  }
  return true;
}
}  // namespace

std::optional<std::string_view> routing_key(std::string_view p) {
  std::size_t at = 0;
  long long argc = 0;
  if (!read_header(p, at, '*', argc) || argc < 1) return std::nullopt;
  std::string_view name, a1, a2, a3;
  if (!read_bulk(p, at, name)) return std::nullopt;
  for (const char* keyless : {"PING", "INFO", "WAIT", "WAITAOF", "CLUSTER", "SCRIPT", "ASKING", "ROLE", "TIME", "DBSIZE",
                              "SCAN", "RANDOMKEY", "PUBLISH", "SUBSCRIBE", "CLIENT", "CONFIG", "AUTH", "SELECT",
                              "FLUSHALL", "FLUSHDB", "ACL", "LATENCY", "COMMAND", "HELLO", "READONLY", "READWRITE"})
    if (iequals(name, keyless)) return std::nullopt;
  if (argc < 2 || !read_bulk(p, at, a1)) return std::nullopt;
  if (iequals(name, "EVAL") || iequals(name, "EVALSHA") || iequals(name, "EVAL_RO") || iequals(name, "EVALSHA_RO") ||
      iequals(name, "FCALL")) {
    if (argc < 4 || !read_bulk(p, at, a2) || a2 == "0" || !read_bulk(p, at, a3)) return std::nullopt;
    return a3;
  }
  return a1;
}

std::optional<Redirect> parse_redirect(std::string_view e) {
  Redirect r;
  if (e.rfind("MOVED ", 0) == 0) {
    r.kind = Redirect::Kind::moved;
    e.remove_prefix(6);
  } else if (e.rfind("ASK ", 0) == 0) {
    r.kind = Redirect::Kind::ask;
    e.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const auto sp = e.find(' ');
  if (sp == std::string_view::npos) return std::nullopt;
  unsigned slot = 0;
  auto [p1, ec1] = std::from_chars(e.data(), e.data() + sp, slot);
  if (ec1 != std::errc() || p1 != e.data() + sp || slot >= kClusterSlots) return std::nullopt;
  std::string_view addr = e.substr(sp + 1);
  const auto colon = addr.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  unsigned port = 0;
  auto [p2, ec2] = std::from_chars(addr.data() + colon + 1, addr.data() + addr.size(), port);
  if (ec2 != std::errc() || p2 != addr.data() + addr.size() || port == 0 || port > 65535) return std::nullopt;
  std::string_view host = addr.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  r.slot = static_cast<std::uint16_t>(slot);
  r.host = std::string(host);
  r.port = static_cast<std::uint16_t>(port);
  return r;
}

std::vector<SlotRange> parse_cluster_slots(const Reply& r, const std::string& seed_host) {
  std::vector<SlotRange> out;
  if (!r.is_array()) return out;
  for (const auto& e : r.elements) {
    if (!e.is_array() || e.elements.size() < 3 || !e.elements[0].is_integer() || !e.elements[1].is_integer() ||
        !e.elements[2].is_array() || e.elements[2].elements.size() < 2 || !e.elements[2].elements[1].is_integer())
      return {};
    const auto first = e.elements[0].integer, last = e.elements[1].integer, port = e.elements[2].elements[1].integer;
    if (first < 0 || last < first || last >= kClusterSlots || port <= 0 || port > 65535) return {};
    SlotRange s;
    s.first = static_cast<std::uint16_t>(first);
    s.last = static_cast<std::uint16_t>(last);
    s.host = e.elements[2].elements[0].str.empty() ? seed_host : e.elements[2].elements[0].str;
    s.port = static_cast<std::uint16_t>(port);
    out.push_back(std::move(s));
  }
  return out;
}

namespace {
const Reply* field(const Reply& flat, std::string_view name) {
  for (std::size_t i = 0; i + 1 < flat.elements.size(); i += 2)
    if (flat.elements[i].is_string() && flat.elements[i].str == name) return &flat.elements[i + 1];
  return nullptr;
}
}  // namespace

namespace {
// nullopt: not the shape of a CLUSTER SHARDS reply.
std::optional<std::vector<SlotRange>> shards_of(const Reply& r, const std::string& seed_host, bool tls) {
  std::vector<SlotRange> out;
  if (!r.is_array()) return std::nullopt;
  for (const auto& shard : r.elements) {
    if (!shard.is_array()) return std::nullopt;
    const Reply* slots = field(shard, "slots");
    const Reply* nodes = field(shard, "nodes");
    if (!slots || !nodes || !slots->is_array() || !nodes->is_array() || slots->elements.size() % 2 != 0) return std::nullopt;
    if (slots->elements.empty()) continue;
    const Reply* primary = nullptr;
    for (const auto& n : nodes->elements) {
      if (!n.is_array()) return std::nullopt;
      const Reply* role = field(n, "role");
      if (role && role->is_string() && role->str == "master") primary = &n;
    }
    // A shard whose primary is gone and not replaced yet: its slots have no
    // owner to go to for now (the seed answers MOVED or CLUSTERDOWN).
    if (!primary) continue;
    const Reply* port = tls ? field(*primary, "tls-port") : nullptr;
    if (!port) port = field(*primary, "port");
    if (!port || !port->is_integer() || port->integer <= 0 || port->integer > 65535) return std::nullopt;
    std::string host;
    for (const char* f : {"endpoint", "ip"}) {
      const Reply* h = field(*primary, f);
      if (h && h->is_string() && !h->str.empty() && h->str != "?") {
        host = h->str;
        break;
      }
    }
    if (host.empty()) host = seed_host;
    for (std::size_t i = 0; i < slots->elements.size(); i += 2) {
      const auto& a = slots->elements[i];
      const auto& b = slots->elements[i + 1];
      if (!a.is_integer() || !b.is_integer() || a.integer < 0 || b.integer < a.integer || b.integer >= kClusterSlots)
        return std::nullopt;
      out.push_back(SlotRange{static_cast<std::uint16_t>(a.integer), static_cast<std::uint16_t>(b.integer), host,
                              static_cast<std::uint16_t>(port->integer)});
    }
  }
  return out;
}
}  // namespace

std::vector<SlotRange> parse_cluster_shards(const Reply& r, const std::string& seed_host, bool tls) {
  return shards_of(r, seed_host, tls).value_or(std::vector<SlotRange>{});
}

std::vector<std::string> SlotMapSource::command() const {
  if (shards) return {"CLUSTER", "SHARDS"};
  return {"CLUSTER", "SLOTS"};
}

std::vector<SlotRange> SlotMapSource::parse(std::error_code ec, const Reply& r, const std::string& seed_host,
                                            bool tls) {
  fell_back_ = false;
  if (ec && ec != errc::server_error) return {};
  if (!shards) return ec ? std::vector<SlotRange>{} : parse_cluster_slots(r, seed_host);
  // An error reply (a server before 7.0: "unknown subcommand 'SHARDS'") or a
  // shape we do not know: CLUSTER SLOTS from now on. A timeout or a broken
  // connection is not an answer: the caller's retry asks SHARDS again.
  if (!ec)
    if (auto m = shards_of(r, seed_host, tls)) return std::move(*m);
  shards = false;
  fell_back_ = true;
  return {};
}

}  // namespace jobguard::redis::detail
