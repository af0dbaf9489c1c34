// `jobguard server trust`: record a Redis just provisioned as having kept its
// lock state, so its first minute is not a quarantine. A thin layer over
// jobguard::trust_new_server(client, TrustOptions); docs/lock-safety.md,
// "Trusting a new server", says what it protects against and what not.
#include <fmt/format.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/observe/event_log.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/options.hpp"
#include "jobguard/text.hpp"

namespace jobguard::cli {
namespace {

constexpr const char* kTrustHelp = R"(Record the server (every primary of a cluster, the primary a Sentinel URL
names) as having kept its lock state, so grants start at once instead of after
a quarantine of max_ttl. Only for a server just provisioned: a server that
restarted empty looks the same, and trusting it lets a second holder in while
the first still works.

Refused when the server shows signs of having served locks: a key under
"<key-prefix>:", a lock-state record written by another server process or a
quarantine for anything but a missing record, evicted keys, FLUSHALL/FLUSHDB/
SWAPDB in its command stats, a promotion from replica. --force trusts it anyway
and stores what it overrode. Already trusted (the record names this server
process, nothing evicted since): nothing is written, exit 0.

The record keeps who (user@host pid), when (the server's clock) and why
(--reason); one log line on stderr says the same.

Exit status: 0 trusted or already trusted; 1 refused (signs of having served
locks; nothing written); 64 usage, or the URL names a replica; 69 Redis
unreachable.)";

namespace server_exit {
inline constexpr int refused = 1;
}

struct TrustArgs {
  std::string reason;
  bool force = false;
  std::string key_prefix = "jobguard";
};

std::string iso_time(std::int64_t ms) {
  if (ms <= 0) return "-";
  return observe::format_timestamp(std::chrono::system_clock::time_point(std::chrono::milliseconds(ms)));
}

const char* outcome_name(TrustedServer::Outcome o) {
  switch (o) {
    case TrustedServer::Outcome::trusted: return "trusted";
    case TrustedServer::Outcome::already: return "already";
    case TrustedServer::Outcome::refused: return "refused";
  }
  return "refused";
}

std::string joined(const std::vector<std::string>& signs) {
  std::string out;
  for (const auto& s : signs) out += (out.empty() ? "" : "; ") + escape_text(s, 400);
  return out;
}

int run_trust(const Globals& g, const TrustArgs& a) {
  auto client = connect_redis(g, "jobguard-server-trust");
  TrustOptions o;
  o.reason = a.reason.empty() ? "no reason given" : a.reason;
  o.force = a.force;
  o.key_prefix = a.key_prefix;
  const auto res = trust_new_server(*client, o);
  const auto url = redis::to_display_url(client->options());

  if (g.json) {
    auto arr = nlohmann::ordered_json::array();
    for (const auto& s : res.servers)
      arr.push_back({{"address", s.address},
                     {"outcome", outcome_name(s.outcome)},
                     {"epoch", s.epoch},
                     {"server_time", iso_time(s.server_time_ms)},
                     {"trusted_by", s.trusted_by},
                     {"trusted_at", iso_time(s.trusted_at_ms)},
                     {"reason", s.trusted_why},
                     {"signs", s.signs}});
    std::cout << nlohmann::ordered_json{{"redis", url}, {"refused", res.refused()}, {"servers", arr}}.dump() << "\n";
  }
  if (res.refused()) {
    std::string why;
    for (const auto& s : res.servers)
      if (!s.signs.empty()) why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", s.address, joined(s.signs));
    std::cerr << escape_controls(fmt::format(
                     "jobguard server trust: refused, nothing written: the server shows signs of having served "
                     "locks: {}; pass --force if you know no holder is alive",
                     why))
              << "\n";
    return server_exit::refused;
  }
  observe::EventLog log(observe::parse_log_format(g.log_format));
  for (const auto& s : res.servers) {
    const bool wrote = s.outcome == TrustedServer::Outcome::trusted;
    if (!g.json) {
      if (wrote)
        std::cout << fmt::format("trusted {} as new: epoch {}\n", s.address, s.epoch);
      else
        std::cout << fmt::format("{} already trusted: epoch {} (by {} at {}: {})\n", s.address, s.epoch,
                                 s.trusted_by.empty() ? "-" : escape_text(s.trusted_by, 128),
                                 iso_time(s.trusted_at_ms),
                                 s.trusted_why.empty() ? "-" : escape_text(s.trusted_why, 256));
    }
    // The audit line: the same who/when/why the record keeps.
    std::vector<std::pair<std::string, observe::FieldValue>> extra{
        {"server", s.address},           {"epoch", s.epoch},
        {"who", s.trusted_by},           {"server_time", iso_time(s.trusted_at_ms)},
        {"reason", s.trusted_why}};
    if (wrote && !s.signs.empty()) extra.emplace_back("forced_over", joined(s.signs));
    log.emit(observe::Event{.event = wrote ? "server_trusted" : "server_already_trusted",
                            .outcome = wrote ? (s.signs.empty() ? "ok" : "forced") : "ok",
                            .extra = std::move(extra)});
  }
  return exit_code::ok;
}

}  // namespace

void add_server(CLI::App& root, Globals& g, Commands& out) {
  auto* server = root.add_subcommand("server", "Operations on the lock Redis itself (server trust)");
  server->require_subcommand(1);
  server->fallthrough();
  server->footer(exit_status_help(
      "  jobguard server trust [--reason TEXT] [--force] [--key-prefix jobguard]\n\n"
      "Exit status: 0 trusted or already trusted; 1 refused (signs of having served locks)."));
  auto a = std::make_shared<TrustArgs>();
  auto* trust = server->add_subcommand("trust", "Record a Redis just provisioned as intact: no first-minute quarantine");
  trust->footer(exit_status_help(kTrustHelp));
  trust->fallthrough();
  trust->add_option("--reason", a->reason, "Why: kept in the lock-state record and the log line");
  trust->add_flag("--force", a->force, "Trust it in spite of signs of having served locks (they are recorded)");
  add_key_prefix(*trust, a->key_prefix, "Key prefix of the locks: a key under it is a sign");
  out.emplace_back(trust, reported("server trust", [&g, a] { return run_trust(g, *a); }));
}

}  // namespace jobguard::cli
