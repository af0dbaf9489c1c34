#include "jobguard/ops/doctor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <functional>
#include <future>
#include <memory>
#include <map>
#include <sstream>

#include "jobguard/admin.hpp"
#include "jobguard/error.hpp"
#include "jobguard/redis/script.hpp"
#include "doctor_internal.hpp"

namespace jobguard::ops {

checks::Info checks::parse_info(const std::string& text) {
  Info m;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    m[line.substr(0, colon)] = line.substr(colon + 1);
  }
  return m;
}

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::duration_cast;
using std::chrono::milliseconds;
using checks::fail;
using checks::get;
using checks::ms_text;
using checks::Info;
using checks::ok;
using checks::parse_info;
using checks::replica_lag;
using checks::to_i64;
using checks::warn;

// "ip=127.0.0.1,port=6380,state=online,offset=42,lag=0" -> fields.
std::map<std::string, std::string> parse_fields(const std::string& s) {
  std::map<std::string, std::string> m;
  std::istringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) {
    const auto eq = part.find('=');
    if (eq != std::string::npos) m[part.substr(0, eq)] = part.substr(eq + 1);
  }
  return m;
}


CheckResult check_role(const Info& info) {
  const auto role = get(info, "role");
  if (role == "slave")
    return fail("role", fmt::format("this server is a replica of {}:{}", get(info, "master_host"), get(info, "master_port")),
                "point --redis at the primary: a replica refuses lock writes (READONLY), or with "
                "replica-read-only no accepts locks that its primary never sees");
  return ok("role", role.empty() ? "primary" : role);
}

// Each connected replica as "ip:port state lag Ns", and whether it is
// healthy: online, with its last acknowledgement younger than replica_lag_warn.
std::vector<std::pair<std::string, bool>> replica_states(const Info& info, const DoctorOptions& o) {
  const auto n = to_i64(get(info, "connected_slaves"));
  std::vector<std::pair<std::string, bool>> out;
  for (std::int64_t i = 0; i < n; ++i) {
    auto f = parse_fields(get(info, fmt::format("slave{}", i)));
    const auto lag = replica_lag(f["lag"]);
    out.emplace_back(fmt::format("{}:{} {} lag {}s", f["ip"], f["port"], f["state"], lag),
                     f["state"] == "online" && lag >= 0 && lag < o.replica_lag_warn.count());
  }
  return out;
}

CheckResult check_replicas(const Info& info, const DoctorOptions& o) {
  const auto n = to_i64(get(info, "connected_slaves"));
  if (n == 0)
    return ok("replicas", "none: locks live on this one server (a crash loses them unless it persists them)");
  std::vector<std::string> parts, bad;
  for (const auto& [text, healthy] : replica_states(info, o)) {
    parts.push_back(text);
    if (!healthy) bad.push_back(text);
  }
  const auto all = fmt::format("{} replica(s): {}", n, fmt::join(parts, "; "));
  if (!bad.empty())
    return warn("replicas", all,
                "a failover to a lagging or offline replica loses the locks granted since its last sync "
                "(two holders); fix the replication link before relying on failover");
  return ok("replicas", all + " (replication is asynchronous: a failover can still lose the newest grants)");
}

CheckResult check_eviction(const Info& info) {
  const auto policy = get(info, "maxmemory_policy");
  const auto maxmemory = to_i64(get(info, "maxmemory"));
  const bool evicts = policy.rfind("allkeys-", 0) == 0 || policy.rfind("volatile-", 0) == 0;
  if (!evicts) return ok("eviction", fmt::format("maxmemory-policy {}", policy.empty() ? "unknown" : policy));
  const std::string advice =
      "set maxmemory-policy noeviction: an evicted lock key lets a second holder in while the first still runs "
      "(lock keys carry a TTL, so volatile-* policies pick them too)";
  if (maxmemory == 0)
    return warn("eviction", fmt::format("maxmemory-policy {} with no maxmemory: nothing is evicted yet", policy),
                advice + "; it takes effect as soon as maxmemory is set");
  return fail("eviction", fmt::format("maxmemory-policy {} with maxmemory {} bytes evicts lock keys", policy, maxmemory),
              advice);
}

CheckResult check_evicted(const Info& info) {
  const auto n = to_i64(get(info, "evicted_keys"));
  if (n > 0)
    return fail("evicted_keys", fmt::format("{} keys evicted since the last stats reset", n),
                "memory pressure has evicted keys, possibly held locks (and with them mutual exclusion): set "
                "noeviction, give the server memory, then CONFIG RESETSTAT");
  return ok("evicted_keys", "0");
}

CheckResult check_persistence(redis::Client& c, const Info& info) {
  const bool aof = get(info, "aof_enabled") == "1";
  std::string save = "unknown";
  try {
    auto r = c.exec(redis::Command{"CONFIG", "GET", "save"});
    if (r.is_array() && r.elements.size() == 2) save = r.elements[1].str;
  } catch (const Error&) {
    // CONFIG may be renamed or denied by ACL: judge from AOF alone then.
  }
  if (aof) return ok("persistence", fmt::format("AOF on (appendfsync {}); RDB save \"{}\"", get(info, "aof_fsync"), save));
  if (save == "unknown")
    return warn("persistence", "AOF off; RDB save points unknown (CONFIG GET save refused)",
                "check the server's save setting: without persistence a restart forgets every lock");
  if (!save.empty())
    return ok("persistence", fmt::format("RDB snapshots only (save \"{}\"): a restart loses the locks granted "
                                         "since the last snapshot",
                                         save));
  return warn("persistence", "no RDB snapshots and no AOF: a restart forgets every held lock",
              "after a restart a second holder can take a lock whose first holder still runs; enable appendonly "
              "yes, or make the restart take longer than the longest lock TTL (fences survive: they are never "
              "below the server clock)");
}

CheckResult check_lua(redis::Client& c) {
  try {
    static const redis::Script probe{"return 1"};
    auto r = c.eval(probe, {}, {});
    if (r.is_integer() && r.integer == 1) return ok("lua", "EVAL runs scripts");
    return fail("lua", fmt::format("EVAL returned {}", redis::to_debug_string(r)), "jobguard's locks are Lua scripts");
  } catch (const Error& e) {
    return fail("lua", fmt::format("EVAL refused: {}", e.what()),
                "every jobguard lock operation is a Lua script: allow EVAL/EVALSHA for jobguard's user "
                "(ACL SETUSER ... +@scripting) and do not rename them");
  }
}

CheckResult check_acl(redis::Client& c, const DoctorOptions& o) {
  const std::string probe = o.key_prefix + ":doctor:{probe}";
  const std::string audit = o.key_prefix + ":doctor:{probe}:audit";
  // The default-mode waiters' line (a sorted set): joined by a waiting
  // acquire, popped by every release.
  const std::string line = o.key_prefix + ":doctor:{probe}:line";
  const std::string chan = o.key_prefix + ":released:{probe}";
  // The fleet numbers (observe::FleetPublisher) live under their own hash tag.
  const std::string fleet = "{" + o.key_prefix + ":fleet}:doctor-probe";
  static const redis::Script get_script{"return redis.call('GET', KEYS[1])"};
  // On a cluster waiters listen with SSUBSCRIBE and releases SPUBLISH
  // (sharded pub/sub): ACLs name those commands apart from PUBLISH/SUBSCRIBE.
  const bool sharded = c.options().cluster;
  const char* publish = sharded ? "SPUBLISH" : "PUBLISH";
  struct Step {
    const char* what;
    std::vector<std::string> cmd;
  };
  const std::vector<Step> steps{
      {"SET", {"SET", probe, "doctor", "NX", "PX", "10000"}},
      {"GET", {"GET", probe}},
      {"PEXPIRE", {"PEXPIRE", probe, "10000"}},
      {"PTTL", {"PTTL", probe}},
      {"EVAL", {"EVAL", get_script.source(), "1", probe}},
      {"EVALSHA", {"EVALSHA", get_script.sha1(), "1", probe}},
      {publish, {publish, chan, "doctor"}},
      {"SCAN", {"SCAN", "0", "MATCH", o.key_prefix + ":lock:{*", "COUNT", "10"}},
      {"XADD", {"XADD", audit, "MAXLEN", "~", "10", "*", "doctor", "1"}},
      {"XREVRANGE", {"XREVRANGE", audit, "+", "-", "COUNT", "1"}},
      {"TIME", {"TIME"}},
      {"ZADD", {"ZADD", line, "NX", "1", "doctor"}},
      {"ZCARD", {"ZCARD", line}},
      {"ZREM", {"ZREM", line, "doctor"}},
      {"ZPOPMIN", {"ZPOPMIN", line}},
      {"HINCRBY (fleet keys)", {"HINCRBY", fleet, "doctor", "1"}},
      {"DEL", {"DEL", probe, audit, line}},
      {"DEL (fleet keys)", {"DEL", fleet}},
  };
  std::vector<std::string> denied;
  std::string first;
  for (const auto& s : steps) {
    try {
      c.exec(redis::Command(s.cmd));
    } catch (const Error& e) {
      denied.push_back(s.what);
      if (first.empty()) first = e.what();
    }
  }
  const std::string user = c.options().user.empty() ? "default" : c.options().user;
  if (denied.empty())
    return ok("acl", fmt::format("user {} may run every command jobguard sends on {}:* keys and channels "
                                 "and the fleet keys {{{}:fleet}}:*",
                                 user, o.key_prefix, o.key_prefix));
  return fail("acl", fmt::format("user {} was refused {} (first: {})", user, fmt::join(denied, ", "), first),
              fmt::format("grant them, e.g. ACL SETUSER {} ~{}:* ~{{{}:fleet}}:* &{}:* +@read +@write +@scripting "
                          "+{} +scan +time +info +ping",
                          user, o.key_prefix, o.key_prefix, o.key_prefix,
                          sharded ? "spublish +ssubscribe" : "publish +subscribe"));
}

CheckResult latency_check(redis::Client& c, const DoctorOptions& o) {
  std::vector<double> ms;
  for (int i = 0; i < o.pings; ++i) {
    const auto t0 = Clock::now();
    c.exec(redis::Command{"PING"});
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2], max = ms.back();
  const auto detail = fmt::format("PING median {}, max {} over {}", ms_text(median), ms_text(max), ms.size());
  const double w = static_cast<double>(o.latency_warn.count()), f = static_cast<double>(o.latency_fail.count());
  if (median >= f || max >= f)
    return fail("latency", detail,
                "every acquire, renewal and release pays this; a lease renews every ttl/3, so with round trips this "
                "slow short TTLs expire under their holders: move the client next to Redis or find what stalls it");
  if (median >= w)
    return warn("latency", detail,
                "slow for locks: keep lock TTLs well above it (and check for slow commands: SLOWLOG GET)");
  return ok("latency", detail);
}

CheckResult check_cluster(redis::Client& c, const Info& info) {
  const bool enabled = get(info, "cluster_enabled") == "1";
  if (enabled && !c.options().cluster)
    return fail("cluster", "cluster mode is enabled, and the URL does not say cluster=yes",
                "without ?cluster=yes the client talks to this one node only: commands for slots served elsewhere "
                "fail with MOVED; add cluster=yes to the URL");
  if (enabled) {
    const auto r = c.exec(redis::Command{"CLUSTER", "INFO"});
    const Info ci = parse_info(r.str);
    const auto detail = fmt::format("cluster mode (cluster=yes): state {}, {} of 16384 slots served, {} primaries",
                                    get(ci, "cluster_state"), get(ci, "cluster_slots_ok"), get(ci, "cluster_size"));
    if (get(ci, "cluster_state") != "ok")
      return fail("cluster", detail, "the cluster cannot serve every slot: commands for some keys fail (CLUSTERDOWN)");
    return ok("cluster", detail + " (each primary keeps its own lock-state record; a loss on one shard pauses grants on all: docs/lock-safety.md)");
  }
  if (c.options().cluster)
    return fail("cluster", "the URL says cluster=yes but the server is not in cluster mode",
                "drop cluster=yes, or point the URL at a cluster node");
  return ok("cluster", "standalone");
}

// Behind Sentinel: every sentinel of the URL (and those they know of) asked
// directly, short deadlines, for the primary, its quorum and its replicas.
CheckResult check_sentinel(redis::Client& c) {
  const auto& so = c.options().sentinel;
  std::vector<redis::SentinelOptions::Address> list = so.sentinels;
  std::vector<std::string> seen, unreachable, disagree;
  std::string quorum, replicas;
  const std::string ours = c.address();
  for (std::size_t i = 0; i < list.size() && i < 16; ++i) {
    const auto a = list[i];
    const std::string where = fmt::format("{}:{}", a.host, a.port);
    redis::ConnectionOptions o;
    o.host = a.host;
    o.port = a.port;
    o.password = so.password;
    if (so.tls) {
      o.tls = c.options().tls;
      o.tls.enabled = true;
    }
    o.connect_timeout = std::chrono::milliseconds(500);
    o.command_timeout = std::chrono::milliseconds(1000);
    o.on_warning = [](const std::string&) {};
    try {
      redis::Client s(o);
      auto m = s.exec(redis::Command{"SENTINEL", "get-master-addr-by-name", so.master_name});
      if (!m.is_array() || m.elements.size() != 2) {
        disagree.push_back(fmt::format("{} does not monitor '{}'", where, so.master_name));
        continue;
      }
      const std::string primary = fmt::format("{}:{}", m.elements[0].str, m.elements[1].str);
      seen.push_back(where);
      if (primary != ours) disagree.push_back(fmt::format("{} names {}", where, primary));
      if (quorum.empty()) {
        try {
          quorum = s.exec(redis::Command{"SENTINEL", "ckquorum", so.master_name}).str;
        } catch (const Error& e) {
          quorum = std::string("NO: ") + std::string(e.detail());
        }
        auto r = s.exec(redis::Command{"SENTINEL", "replicas", so.master_name});
        replicas = fmt::format("{}", r.is_array() ? r.elements.size() : 0);
      }
      auto others = s.exec(redis::Command{"SENTINEL", "sentinels", so.master_name});
      for (const auto& e : others.elements) {
        redis::SentinelOptions::Address x;
        for (std::size_t k = 0; k + 1 < e.elements.size(); k += 2) {
          if (e.elements[k].str == "ip") x.host = e.elements[k + 1].str;
          if (e.elements[k].str == "port") x.port = static_cast<std::uint16_t>(to_i64(e.elements[k + 1].str));
        }
        if (!x.host.empty() && std::find(list.begin(), list.end(), x) == list.end()) list.push_back(x);
      }
    } catch (const Error& e) {
      unreachable.push_back(fmt::format("{} ({})", where, e.detail()));
    }
  }
  const std::string detail = fmt::format(
      "master '{}': {} of {} sentinels answer{}; the client uses {}; {} replica(s) known; quorum: {}", so.master_name,
      seen.size(), list.size(), disagree.empty() ? ", all name it" : "", ours, replicas.empty() ? "?" : replicas,
      quorum.empty() ? "?" : quorum);
  if (seen.empty())
    return fail("sentinel", detail + (unreachable.empty() ? "" : "; unreachable: " + fmt::format("{}", fmt::join(unreachable, "; "))),
                "no sentinel answers for this master: after an error the client cannot find the primary");
  if (!disagree.empty())
    return fail("sentinel", detail + "; " + fmt::format("{}", fmt::join(disagree, "; ")),
                "the sentinels disagree about the primary (a failover in progress, or a split): run again; if it "
                "persists, fix the sentinels before relying on failover");
  if (quorum.rfind("OK", 0) != 0)
    return fail("sentinel", detail, "the sentinels cannot reach a quorum: a failed primary would not be replaced");
  if (!unreachable.empty())
    return warn("sentinel", detail + "; unreachable: " + fmt::format("{}", fmt::join(unreachable, "; ")),
                "some sentinels do not answer: fewer votes are left for a failover");
  return ok("sentinel", detail);
}

// replicas=N: WAIT needs N connected replicas, or every grant is refused.
CheckResult check_confirmation(redis::Client& c, const Info& info) {
  const int want = c.options().lock_replicas;
  const auto have = to_i64(get(info, "connected_slaves"));
  const bool aof = get(info, "aof_enabled") == "1";
  const std::string version = get(info, "redis_version");
  const bool waitaof = c.options().lock_waitaof && aof && (version.rfind("7.", 0) == 0 ? to_i64(version.substr(2)) >= 2
                                                                                       : to_i64(version) >= 8);
  if (want <= 0)
    return ok("replica_confirmation", "off (replicas=0): grants are acknowledged by the primary alone");
  const auto detail = fmt::format("replicas={} with {} connected replica(s); confirmed with {} (redis {}{})", want,
                                  have, waitaof ? "WAITAOF" : "WAIT", version,
                                  waitaof ? ", appendonly yes" : (aof ? ", WAITAOF needs 7.2+" : ""));
  if (have < want)
    return fail("replica_confirmation", detail,
                "fewer replicas are connected than replicas= asks for: every grant is refused (fail-closed) or "
                "kept unconfirmed (warn); lower replicas= or fix replication");
  return ok("replica_confirmation", detail + " (not consensus: docs/lock-safety.md)");
}

CheckResult check_shared(redis::Client& c, const Info& info, const DoctorOptions& o) {
  (void)info;
  const auto total = c.exec(redis::Command{"DBSIZE"}).integer;
  if (total < o.shared_min_keys || o.shared_samples <= 0)
    return ok("shared_workload", fmt::format("{} keys in this database", total));
  std::vector<std::future<redis::Reply>> futs;
  for (int i = 0; i < o.shared_samples; ++i) futs.push_back(c.exec_future(redis::Command{"RANDOMKEY"}));
  int sampled = 0, foreign = 0;
  const std::string ours = o.key_prefix + ":";
  for (auto& f : futs) {
    auto r = f.get();
    if (!r.is_string()) continue;
    ++sampled;
    if (r.str.rfind(ours, 0) != 0) ++foreign;
  }
  const double share = sampled ? static_cast<double>(foreign) / sampled : 0;
  const auto detail = fmt::format("{} keys; {} of {} sampled keys are outside {}:* (~{:.0f}%)", total, foreign, sampled,
                                  ours, share * 100);
  if (share >= o.shared_foreign_share)
    return warn("shared_workload", detail,
                "another workload (a cache?) shares this server: its memory pressure evicts or refuses lock "
                "writes and its slow commands delay renewals; give locks their own Redis, or at least noeviction");
  return ok("shared_workload", detail);
}

}  // namespace

CheckResult check_latency(redis::Client& c, const DoctorOptions& o) {
  if (o.pings < 1) throw Error(errc::invalid_argument, "doctor: pings must be >= 1");
  return latency_check(c, o);
}

const char* to_string(CheckStatus s) noexcept {
  switch (s) {
    case CheckStatus::ok: return "OK";
    case CheckStatus::warn: return "WARN";
    case CheckStatus::fail: return "FAIL";
  }
  return "?";
}

CheckStatus worst(const std::vector<CheckResult>& results) noexcept {
  CheckStatus w = CheckStatus::ok;
  for (const auto& r : results)
    if (static_cast<int>(r.status) > static_cast<int>(w)) w = r.status;
  return w;
}

namespace {
// PING and INFO: the "connection" finding first in `out`; false (and only
// that FAIL, with the call's code) when the server did not answer.
bool connect(redis::Client& c, const DoctorOptions& o, Info& info, std::vector<CheckResult>& out) {
  if (o.pings < 1) throw Error(errc::invalid_argument, "doctor: pings must be >= 1");
  try {
    c.exec(redis::Command{"PING"});
    info = parse_info(c.exec(redis::Command{"INFO"}).str);
  } catch (const Error& e) {
    out.push_back(fail("connection", fmt::format("{}: {}", c.address(), e.what()),
                       "check the URL, the network and the server; jobs of fail-closed classes do not run meanwhile"));
    out.back().code = e.code();
    return false;
  }
  out.push_back(ok("connection", fmt::format("{}: redis {}", c.address(), get(info, "redis_version"))));
  return true;
}

// Runs one check into `out`: one that errors is reported, the others still run.
template <class Fn>
const CheckResult& guarded(std::vector<CheckResult>& out, const char* name, Fn fn) {
  try {
    out.push_back(fn());
  } catch (const Error& e) {
    out.push_back(fail(name, fmt::format("the check failed: {}", e.what()), "see the error"));
  }
  return out.back();
}
}  // namespace

std::vector<CheckResult> check_redis(redis::Client& c, const DoctorOptions& o) {
  std::vector<CheckResult> out;
  Info info;
  if (!connect(c, o, info, out)) return out;
  auto check = [&](const char* name, auto fn) { guarded(out, name, fn); };
  check("role", [&] { return check_role(info); });
  if (!c.options().sentinel.sentinels.empty()) check("sentinel", [&] { return check_sentinel(c); });
  check("replicas", [&] { return check_replicas(info, o); });
  check("replica_confirmation", [&] { return check_confirmation(c, info); });
  check("eviction", [&] { return check_eviction(info); });
  check("evicted_keys", [&] { return check_evicted(info); });
  check("persistence", [&] { return check_persistence(c, info); });
  check("lua", [&] { return check_lua(c); });
  check("acl", [&] { return check_acl(c, o); });
  check("latency", [&] { return check_latency(c, o); });
  check("clock", [&] { return check_clock(c, o); });
  check("clock_steps", [&] { return check_clock_steps(read_lock_state(c), c.options().cluster); });
  check("cluster", [&] { return check_cluster(c, info); });
  check("shared_workload", [&] { return check_shared(c, info, o); });
  check("semaphores", [&] { return check_semaphores(c, o); });
  check("rwlocks", [&] { return check_rwlocks(c, o); });
  return out;
}

RedisFacts watch_redis(redis::Client& c, const DoctorOptions& o) {
  RedisFacts f;
  Info info;
  if (!connect(c, o, info, f.checks)) return f;
  f.up = true;
  auto check = [&](const char* name, auto fn) -> const CheckResult& { return guarded(f.checks, name, fn); };
  check("role", [&] { return check_role(info); });
  if (!c.options().sentinel.sentinels.empty()) check("sentinel", [&] { return check_sentinel(c); });
  check("replicas", [&] { return check_replicas(info, o); });
  check("replica_confirmation", [&] { return check_confirmation(c, info); });
  f.evicting = check("eviction", [&] { return check_eviction(info); }).status == CheckStatus::fail;
  check("evicted_keys", [&] { return check_evicted(info); });
  f.persistent = check("persistence", [&] { return check_persistence(c, info); }).status == CheckStatus::ok;
  check("latency", [&] { return check_latency(c, o); });
  check("clock", [&] { return check_clock(c, o); });
  // Read only: epoch.lua (which the lock clients run) is what starts a
  // quarantine; the watcher must not start one by looking. An ACL that
  // refuses the record leaves the lock-state gauges out rather than
  // reporting "no record".
  std::vector<LockStateServer> state;
  check("clock_steps", [&] {
    state = read_lock_state(c);
    return check_clock_steps(state, c.options().cluster);
  });
  for (const auto& s : state) f.clock_steps += s.clock_steps;
  if (!c.options().cluster && state.size() == 1) {
    const auto& s = state.front();
    f.lock_state_read = true;
    f.lock_state_record = s.record;
    f.lock_state_epoch = s.epoch;
    if (s.quarantined()) {
      f.quarantine_left = milliseconds(s.quarantine_until_ms - s.server_time_ms);
      f.quarantine_reason = s.reason;
    }
  }
  check("cluster", [&] { return check_cluster(c, info); });
  f.evicted_keys = to_i64(get(info, "evicted_keys"));
  f.replicas_connected = to_i64(get(info, "connected_slaves"));
  for (const auto& r : replica_states(info, o)) f.replicas_healthy += r.second ? 1 : 0;
  f.replicas_required = std::max(0, c.options().lock_replicas);
  return f;
}

}  // namespace jobguard::ops
