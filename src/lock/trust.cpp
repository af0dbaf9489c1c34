// trust_new_server(client, TrustOptions): the checked opt-out of the
// quarantine for a server just provisioned. docs/lock-safety.md, "Trusting a
// new server". The signs the server itself shows (its record, INFO) are judged
// by scripts/trust.lua; the keys under the prefix are found here by SCAN, which
// must not run inside a script (it would block the server for a whole walk of
// a large keyspace).
#include <fmt/format.h>
#include <unistd.h>

#include <charconv>

#include "jobguard/admin.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/text.hpp"
#include "lock/inspect_internal.hpp"
#include "lock/quarantine.hpp"

namespace jobguard {
namespace lock_scripts {
extern const std::string_view trust;
}

namespace {

const redis::Script& script_trust() {
  static const redis::Script s{std::string(lock_scripts::trust)};
  return s;
}


// Enough to say "served locks"; walking on would only make a refusal slower.
constexpr std::size_t kMaxKeysCounted = 1000;
constexpr std::size_t kSampleKeys = 3;

using Target = admin::LockStateRecord;

bool is_lock_state_record(std::string_view key) {
  const std::string_view base = detail::kLockStateKey;
  return key == base || (key.size() > base.size() + 2 && key.substr(0, base.size()) == base &&
                         key.substr(base.size(), 2) == ":{");
}

// "" when no key but the lock-state record lives under "<prefix>:" on this node.
std::string keys_sign(redis::Client& client, const Target& t, const TrustOptions& o) {
  const std::string match = ::jobguard::detail::glob_escape(o.key_prefix) + ":*";
  const std::string count = std::to_string(o.scan_count);
  std::size_t found = 0;
  std::vector<std::string> samples;
  std::string cursor = "0";
  do {
    auto r = client.exec(redis::Command{"SCAN", cursor, "MATCH", match, "COUNT", count}, {.node = t.node});
    if (!r.is_array() || r.elements.size() != 2 || !r.elements[1].is_array())
      throw Error(errc::protocol_error,
                  fmt::format("SCAN on {}: unexpected reply {}", t.address, redis::to_debug_string(r)));
    cursor = r.elements[0].str;
    for (const auto& k : r.elements[1].elements) {
      if (is_lock_state_record(k.str)) continue;
      ++found;
      if (samples.size() < kSampleKeys) samples.push_back(escape_text(k.str, 80));
    }
  } while (cursor != "0" && found < kMaxKeysCounted);
  if (found == 0) return {};
  std::string list;
  for (const auto& s : samples) list += (list.empty() ? "" : ", ") + s;
  return fmt::format("{}{} keys under prefix '{}:' ({}{})", found >= kMaxKeysCounted ? "at least " : "", found,
                     escape_text(o.key_prefix, 64), list, found > samples.size() ? ", ..." : "");
}

std::int64_t to_i64(const redis::Reply& r) {
  if (r.is_integer()) return r.integer;
  std::int64_t v = 0;
  std::from_chars(r.str.data(), r.str.data() + r.str.size(), v);
  return v;
}

struct Judged {
  std::string outcome;  // trust.lua's
  TrustedServer server;
};

Judged run_script(redis::Client& client, const Target& t, const TrustOptions& o, const std::string& who,
                  const std::string& own_signs, const char* mode) {
  std::vector<std::string> args{o.force ? "1" : "0", who, o.reason, own_signs, mode};
  const auto r = client.eval(script_trust(), {t.key}, std::move(args), {.node = t.node});
  if (!r.is_array() || r.elements.size() != 9 || !r.elements[4].is_array())
    throw Error(errc::protocol_error, fmt::format("{}: unexpected reply to the lock-state trust script: {}", t.address,
                                                  redis::to_debug_string(r)));
  Judged j;
  j.outcome = r.elements[0].str;
  if (j.outcome == "replica")
    throw Error(errc::invalid_argument, fmt::format("{} is a {}: only a primary can be trusted as new", t.address,
                                                    escape_text(r.elements[5].str, 32)));
  auto& s = j.server;
  s.address = t.address;
  s.epoch = r.elements[1].str;
  s.server_time_ms = to_i64(r.elements[2]);
  for (const auto& e : r.elements[4].elements) s.signs.push_back(e.str);
  s.trusted_by = r.elements[6].str;
  s.trusted_at_ms = to_i64(r.elements[7]);
  s.trusted_why = r.elements[8].str;
  if (j.outcome == "trusted") s.outcome = TrustedServer::Outcome::trusted;
  else if (j.outcome == "already") s.outcome = TrustedServer::Outcome::already;
  else s.outcome = TrustedServer::Outcome::refused;
  return j;
}

}  // namespace

bool TrustResult::refused() const noexcept {
  for (const auto& s : servers)
    if (s.outcome == TrustedServer::Outcome::refused) return true;
  return false;
}

TrustResult trust_new_server(redis::Client& client, const TrustOptions& opts) {
  if (client.running_in_loop_thread())
    throw Error(errc::invalid_argument, "trust_new_server on the event-loop thread would deadlock");
  if (opts.scan_count == 0) throw Error(errc::invalid_argument, "scan_count must be >= 1");
  (void)KeyBuilder{opts.key_prefix};  // throws, naming what is wrong with the prefix
  const std::string who =
      opts.who.empty() ? fmt::format("{} pid {}", admin::default_who(), ::getpid()) : opts.who;
  const auto ts = admin::lock_state_records(client);

  // Every primary judged before any is written: a cluster is trusted whole
  // or not at all (its quarantine is the longest any shard asks for).
  std::vector<Judged> judged;
  std::vector<std::string> own(ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i) {
    own[i] = keys_sign(client, ts[i], opts);
    judged.push_back(run_script(client, ts[i], opts, who, own[i], "judge"));
  }
  bool refused = false;
  for (const auto& j : judged) refused = refused || j.outcome == "refused";
  TrustResult res;
  if (refused) {
    for (auto& j : judged) {
      // Not written either: another primary's signs refused the whole cluster.
      if (j.outcome == "clean") j.server.outcome = TrustedServer::Outcome::refused;
      res.servers.push_back(std::move(j.server));
    }
    return res;
  }
  for (std::size_t i = 0; i < ts.size(); ++i) {
    if (judged[i].outcome == "already") {
      res.servers.push_back(std::move(judged[i].server));
      continue;
    }
    // Judged again as it is written, in one script: a check by another client
    // in between is seen, not overwritten blindly.
    res.servers.push_back(run_script(client, ts[i], opts, who, own[i], "write").server);
  }
  return res;
}

}  // namespace jobguard
