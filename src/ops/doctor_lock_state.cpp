// The doctor's look at whether the server keeps the lock state
// (ops/doctor.hpp): its clock against this host's, and the lock-state record
// its lock clients keep (docs/lock-safety.md) — a quarantine, the clock
// steps they found — beside what it may evict.
#include <fmt/format.h>

#include <chrono>
#include <ctime>
#include <functional>

#include "jobguard/admin.hpp"
#include "jobguard/ops/doctor.hpp"
#include "jobguard/redis/client.hpp"
#include "doctor_internal.hpp"

namespace jobguard::ops {
namespace {

using std::chrono::milliseconds;
using checks::fail;
using checks::get;
using checks::ok;
using checks::to_i64;
using checks::warn;

std::string format_server_ms(std::int64_t ms) {
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  if (!gmtime_r(&secs, &tm)) return std::to_string(ms);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec);
}

std::string field(const redis::Reply& r) { return r.is_string() ? r.str : std::string(); }

// One server's record, clock and eviction settings, each read on that server.
LockStateServer read_one(redis::Client& c, const admin::LockStateRecord& rec) {
  redis::CallOptions on;
  on.node = rec.node;
  LockStateServer s;
  s.address = rec.address;
  const auto r = c.exec(
      redis::Command{"HMGET", rec.key, "id", "until", "reason", "clock_steps", "clock_step_last"}, on);
  const auto t = c.exec(redis::Command{"TIME"}, on);
  if (!r.is_array() || r.elements.size() != 5 || !t.is_array() || t.elements.size() != 2)
    throw Error(errc::protocol_error, fmt::format("{}: unexpected reply to the lock-state record's HMGET or TIME", rec.address));
  s.record = r.elements[0].is_string();
  s.epoch = field(r.elements[0]);
  s.server_time_ms = to_i64(t.elements[0].str) * 1000 + to_i64(t.elements[1].str) / 1000;
  s.quarantine_until_ms = to_i64(field(r.elements[1]));
  s.reason = field(r.elements[2]);
  s.clock_steps = to_i64(field(r.elements[3]));
  // "<ms> <server time ms>"
  const std::string last = field(r.elements[4]);
  if (const auto sp = last.find(' '); sp != std::string::npos) {
    s.last_step_ms = to_i64(last.substr(0, sp));
    s.last_step_at_ms = to_i64(last.substr(sp + 1));
  }
  const auto info = checks::parse_info(c.exec(redis::Command{"INFO"}, on).str);
  s.maxmemory_policy = get(info, "maxmemory_policy");
  s.maxmemory = to_i64(get(info, "maxmemory"));
  s.evicted_keys = to_i64(get(info, "evicted_keys"));
  return s;
}

}  // namespace

CheckResult check_clock(redis::Client& c, const DoctorOptions& o) {
  std::function<std::chrono::system_clock::time_point()> now = o.now;
  if (!now) now = [] { return std::chrono::system_clock::now(); };
  const auto t0 = now();
  auto r = c.exec(redis::Command{"TIME"});
  const auto t1 = now();
  if (!r.is_array() || r.elements.size() != 2)
    return fail("clock", fmt::format("TIME returned {}", redis::to_debug_string(r)), "");
  const std::int64_t server_us = to_i64(r.elements[0].str) * 1000000 + to_i64(r.elements[1].str);
  const auto mid = t0 + (t1 - t0) / 2;
  const std::int64_t local_us =
      std::chrono::duration_cast<std::chrono::microseconds>(mid.time_since_epoch()).count();
  const auto offset = milliseconds((server_us - local_us) / 1000);
  const auto abs = offset < milliseconds(0) ? -offset : offset;
  const auto rtt = std::chrono::duration_cast<milliseconds>(t1 - t0);
  const auto detail = fmt::format("server clock {} {} ms {} this host's (round trip {} ms)", "is", abs.count(),
                                  offset.count() >= 0 ? "ahead of" : "behind", rtt.count());
  const std::string advice =
      "run NTP on both hosts: Redis expires keys by its wall clock, so a server clock that is stepped forward "
      "expires held locks early; audit times and lock ages are server times";
  if (abs >= o.clock_fail) return fail("clock", detail, advice);
  if (abs >= o.clock_warn) return warn("clock", detail, advice);
  return ok("clock", detail);
}

std::vector<LockStateServer> read_lock_state(redis::Client& c) {
  std::vector<LockStateServer> out;
  for (const auto& rec : admin::lock_state_records(c)) out.push_back(read_one(c, rec));
  return out;
}

// The server clock steps lock clients found and wrote to the lock-state
// record (docs/lock-safety.md, "Server clock steps"): each expired held
// locks early and cost a quarantine. On a cluster every primary's record
// counts the steps of its own clock; the last one named is the latest by
// its own server time.
CheckResult check_clock_steps(const std::vector<LockStateServer>& servers, bool cluster) {
  std::int64_t steps = 0;
  const LockStateServer* last = nullptr;
  for (const auto& s : servers) {
    steps += s.clock_steps;
    if (s.last_step_at_ms > 0 && (!last || s.last_step_at_ms > last->last_step_at_ms)) last = &s;
  }
  if (steps == 0) return ok("clock_steps", "no step of the server's clock found by lock clients");
  const std::string size = last ? std::to_string(last->last_step_ms) : "?";
  const std::string when = last ? format_server_ms(last->last_step_at_ms) : "?";
  const std::string where = last && cluster ? " on " + last->address : "";
  return warn("clock_steps",
              fmt::format("lock clients found the server's clock stepped forward {} time(s), the last by {} ms at {} "
                          "(server time){}",
                          steps, size, when, where),
              "a forward step expires held locks early; each one quarantined the server for max_ttl. Keep the "
              "server's clock slewed, not stepped (chrony makestep off after boot, ntpd -x)");
}

}  // namespace jobguard::ops
