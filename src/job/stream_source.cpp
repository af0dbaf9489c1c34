#include "jobguard/job/stream_source.hpp"

#include <cstddef>
#include <cstdlib>
#include <string>

#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::job {

using redis::CallOptions;
using redis::Command;
using redis::Reply;

std::string StreamJob::field(std::string_view name) const {
  for (const auto& [k, v] : fields)
    if (k == name) return v;
  return {};
}

namespace {

std::optional<StreamJob> parse_entry(const Reply& e) {
  // [id, [f1, v1, ...]]; an entry deleted while pending comes back as nil fields.
  if (!e.is_array() || e.elements.size() < 2 || !e.elements[0].is_string()) return std::nullopt;
  StreamJob job;
  job.id = e.elements[0].str;
  const auto& f = e.elements[1];
  if (!f.is_array()) return std::nullopt;
  for (std::size_t i = 0; i + 1 < f.elements.size(); i += 2) job.fields.emplace_back(f.elements[i].str, f.elements[i + 1].str);
  return job;
}

}  // namespace

StreamSource::StreamSource(redis::Client& client, StreamOptions options) : client_(client), opts_(std::move(options)) {
  if (opts_.stream.empty()) throw Error(errc::invalid_argument, "stream source: empty stream key");
  if (opts_.group.empty()) throw Error(errc::invalid_argument, "stream source: empty consumer group");
  if (opts_.block < std::chrono::milliseconds(1) || opts_.block > std::chrono::milliseconds(1000))
    throw Error(errc::invalid_argument,
                "stream source: block " + std::to_string(opts_.block.count()) + "ms outside [1ms, 1s]");
  if (opts_.claim_idle.count() <= 0) throw Error(errc::invalid_argument, "stream source: claim_idle must be > 0");
  if (opts_.max_attempts < 1) throw Error(errc::invalid_argument, "stream source: max_attempts must be >= 1");
  if (opts_.call_timeout.count() <= 0) throw Error(errc::invalid_argument, "stream source: call_timeout must be > 0");
  if (opts_.dead_letter.empty()) opts_.dead_letter = opts_.stream + ":dead";
}

namespace {
// The group (or the whole stream) is gone: a Redis restart without
// persistence, a failover to a replica that never saw it, a DEL. NOGROUP
// answers a command naming the group; UNBLOCKED ends an XREADGROUP that was
// blocked on the stream when it was deleted.
bool group_vanished(const Error& e) {
  const std::string_view d = e.detail();
  return e.source() == error_source::redis &&
         (d.find("NOGROUP ") != std::string_view::npos || d.find("UNBLOCKED ") != std::string_view::npos);
}
}  // namespace

Reply StreamSource::exec_group(const Command& cmd, std::chrono::milliseconds timeout, bool retry) {
  try {
    return client_.exec(cmd, CallOptions{timeout});
  } catch (const Error& e) {
    if (!group_vanished(e)) throw;
    ensure_group();
    groups_recreated_.fetch_add(1, std::memory_order_relaxed);
    if (!retry) return Reply::nil_reply();
    return client_.exec(cmd, CallOptions{timeout});
  }
}

void StreamSource::ensure_group() {
  try {
    client_.exec(Command{"XGROUP", "CREATE", opts_.stream, opts_.group, "0", "MKSTREAM"}, CallOptions{opts_.call_timeout});
  } catch (const Error& e) {
    if (std::string_view(e.what()).find("BUSYGROUP") == std::string_view::npos) throw;
  }
}

std::string StreamSource::add(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::vector<std::string> args{"XADD", opts_.stream, "*"};
  for (const auto& [k, v] : fields) {
    args.push_back(k);
    args.push_back(v);
  }
  return client_.exec(Command(args), CallOptions{opts_.call_timeout}).str;
}

std::optional<StreamJob> StreamSource::next(std::string_view consumer) {
  bool scan = false;
  {
    std::lock_guard lk(mu_);
    auto now = std::chrono::steady_clock::now();
    if (now - last_scan_ >= opts_.claim_idle / 4) {
      last_scan_ = now;
      scan = true;
    }
  }
  if (scan)
    if (auto j = reclaim(consumer)) return j;

  // The call's deadline must outlast the server-side BLOCK, or every empty
  // read would end as a client timeout.
  // A vanished group is recreated and this read ends empty (no retry: the
  // caller polls again, and a blocked read must not block twice).
  Reply r = exec_group(Command{"XREADGROUP", "GROUP", opts_.group, std::string(consumer), "COUNT", "1", "BLOCK",
                               std::to_string(opts_.block.count()), "STREAMS", opts_.stream, ">"},
                       opts_.block + opts_.call_timeout, false);
  // [[stream, [[id, fields]...]]] or nil when BLOCK ran out.
  if (!r.is_array() || r.elements.empty()) return std::nullopt;
  const auto& s = r.elements[0];
  if (!s.is_array() || s.elements.size() < 2 || !s.elements[1].is_array() || s.elements[1].elements.empty())
    return std::nullopt;
  return parse_entry(s.elements[1].elements[0]);
}

std::optional<StreamJob> StreamSource::reclaim(std::string_view consumer) {
  std::string start;
  {
    std::lock_guard lk(mu_);
    start = cursor_;
  }
  for (;;) {
    Reply r = exec_group(Command{"XAUTOCLAIM", opts_.stream, opts_.group, std::string(consumer),
                                 std::to_string(opts_.claim_idle.count()), start, "COUNT", "1"},
                         opts_.call_timeout, false);
    // [next-cursor, [[id, fields]...], [deleted ids]] (Redis 7).
    if (!r.is_array() || r.elements.size() < 2) return std::nullopt;
    std::string next_cursor = r.elements[0].str;
    {
      std::lock_guard lk(mu_);
      cursor_ = next_cursor;
    }
    std::optional<StreamJob> job;
    if (r.elements[1].is_array() && !r.elements[1].elements.empty()) job = parse_entry(r.elements[1].elements[0]);
    if (job) {
      job->reclaimed = true;
      job->deliveries = deliveries(job->id);
      // The claim above counted as a delivery: a job that stalled its
      // consumer max_attempts times is poison, not bad luck.
      if (job->deliveries > opts_.max_attempts) {
        dead_letter(*job, "stalled: not acknowledged after " + std::to_string(job->deliveries - 1) + " deliveries",
                    job->deliveries - 1);
        start = next_cursor;
        if (start == "0-0") return std::nullopt;
        continue;
      }
      return job;
    }
    return std::nullopt;
  }
}

bool StreamSource::ack(std::string_view id) {
  Reply r = exec_group(Command{"XACK", opts_.stream, opts_.group, std::string(id)}, opts_.call_timeout, false);
  return r.is_integer() && r.integer > 0;
}

std::int64_t StreamSource::deliveries(std::string_view id) {
  Reply r = exec_group(Command{"XPENDING", opts_.stream, opts_.group, std::string(id), std::string(id), "1"},
                       opts_.call_timeout, false);
  // [[id, consumer, idle ms, deliveries]]
  if (!r.is_array() || r.elements.empty() || !r.elements[0].is_array() || r.elements[0].elements.size() < 4) return 0;
  return r.elements[0].elements[3].integer;
}

std::int64_t StreamSource::pending_count() {
  // Inspection: a missing group is reported (NOGROUP), never created here.
  Reply r = client_.exec(Command{"XPENDING", opts_.stream, opts_.group}, CallOptions{opts_.call_timeout});
  if (!r.is_array() || r.elements.empty()) return 0;
  return r.elements[0].integer;
}

std::int64_t StreamSource::length(const std::string& stream) {
  return client_.exec(Command{"XLEN", stream}, CallOptions{opts_.call_timeout}).integer;
}

std::vector<PendingEntry> StreamSource::pending(std::size_t max) {
  std::vector<PendingEntry> out;
  if (max == 0) return out;
  Reply r = client_.exec(Command{"XPENDING", opts_.stream, opts_.group, "-", "+", std::to_string(max)},
                         CallOptions{opts_.call_timeout});
  if (!r.is_array()) return out;
  // [[id, consumer, idle ms, deliveries] ...]
  for (const auto& e : r.elements) {
    if (!e.is_array() || e.elements.size() < 4) continue;
    out.push_back(PendingEntry{e.elements[0].str, e.elements[1].str, std::chrono::milliseconds(e.elements[2].integer),
                               e.elements[3].integer});
  }
  return out;
}

std::vector<DeadLetter> StreamSource::dead_letters(std::size_t max) {
  std::vector<DeadLetter> out;
  if (max == 0) return out;
  Reply r = client_.exec(Command{"XREVRANGE", opts_.dead_letter, "+", "-", "COUNT", std::to_string(max)},
                         CallOptions{opts_.call_timeout});
  if (!r.is_array()) return out;
  for (const auto& e : r.elements) {
    auto entry = parse_entry(e);
    if (!entry) continue;
    DeadLetter d;
    d.id = entry->id;
    // The bookkeeping fields come first (dead_letter below); a job field with
    // the same name after them stays a job field.
    std::size_t i = 0;
    for (; i < entry->fields.size() && i < 3; ++i) {
      const auto& [k, v] = entry->fields[i];
      if (k == "source_id") d.source_id = v;
      else if (k == "attempts") d.attempts = std::strtoll(v.c_str(), nullptr, 10);
      else if (k == "last_error") d.last_error = v;
      else break;
    }
    d.fields.assign(entry->fields.begin() + static_cast<std::ptrdiff_t>(i), entry->fields.end());
    out.push_back(std::move(d));
  }
  return out;
}

bool StreamSource::fail(const StreamJob& job, std::string_view error) {
  std::int64_t n = deliveries(job.id);
  if (n < opts_.max_attempts) return false;
  dead_letter(job, error, n);
  return true;
}

void StreamSource::dead_letter(const StreamJob& job, std::string_view error, std::int64_t n) {
  std::vector<std::string> args{"XADD", opts_.dead_letter, "*", "source_id", job.id, "attempts", std::to_string(n),
                                "last_error", std::string(error)};
  for (const auto& [k, v] : job.fields) {
    args.push_back(k);
    args.push_back(v);
  }
  // Dead-letter first, then ack: a crash in between leaves a duplicate in the
  // dead-letter stream, never a job lost from both.
  client_.exec(Command(args), CallOptions{opts_.call_timeout});
  ack(job.id);
}

}  // namespace jobguard::job
