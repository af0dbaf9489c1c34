#include "jobguard/guard/completion.hpp"

#include <charconv>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "guard/async_internal.hpp"
#include "jobguard/detail/completion_parts.hpp"
#include "jobguard/detail/guard_scripts.hpp"
#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::guard {

void detail::check_parts(std::string_view kind, std::string_view entity, std::string_view run_id) {
  if (kind.empty() || entity.empty() || run_id.empty())
    throw Error(errc::invalid_argument,
                fmt::format("completion record needs a job kind, an entity and a run id (got \"{}\", \"{}\", \"{}\")",
                            kind, entity, run_id));
}

namespace {

using detail::check_parts;
using detail::checked;
using detail::reporting;
using detail::from_ms;

// ':' separates the parts and '%' escapes: distinct triples, distinct keys.
// Appended in place, not formatted: a guarded job builds this key once or
// twice, and fmt's parsing and the parts' temporaries cost the client
// thousands of instructions a job (see docs/bench.md).
void append_part(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '%') out.append("%25", 3);
    else if (c == ':') out.append("%3A", 3);
    else out.push_back(c);
  }
}

}  // namespace

// --- Redis ----------------------------------------------------------------------

RedisCompletionStore::RedisCompletionStore(redis::Client& client, RedisCompletionOptions options)
    : client_(client), opts_(std::move(options)) {
  if (opts_.retention.count() < 0) throw Error(errc::invalid_argument, "completion retention must be >= 0");
  piece_ = std::make_shared<const scripts::RecordPiece>(
      scripts::RecordPiece{&client_, this, std::to_string(opts_.retention.count())});
}

std::string RedisCompletionStore::key_for(std::string_view job_kind, std::string_view entity,
                                          std::string_view run_id) const {
  check_parts(job_kind, entity, run_id);
  std::string k;
  k.reserve(opts_.prefix.size() + job_kind.size() + entity.size() + run_id.size() + 8);
  k.append(opts_.prefix);
  append_part(k, job_kind);
  k.push_back(':');
  append_part(k, entity);
  k.push_back(':');
  append_part(k, run_id);
  return k;
}

namespace {

const redis::Script& record_script() {
  static const redis::Script script{scripts::with_stored_format(scripts::completion_record)};
  return script;
}

RecordOutcome parse_record(const redis::Reply& r, std::string_view job_kind, std::string_view entity,
                           std::string_view run_id) {
  if (!r.is_array() || r.elements.size() != 4)
    throw Error(errc::protocol_error, "completion_record script: unexpected reply " + redis::to_debug_string(r));
  RecordOutcome out;
  out.recorded = r.elements[0].integer == 1;
  out.record = {std::string(job_kind), std::string(entity), std::string(run_id),
                from_ms(std::stoll(r.elements[1].str)), r.elements[2].str, r.elements[3].str};
  return out;
}

// A find is a GET, not a script: it runs for every delivery that finds the
// lock busy, and a GET costs the server a fraction of a script call. The
// value is stored.lua's record format: 'r1 <at>\n' by '\n' result, or, when
// completed_by holds a newline, 'r1 <at> <#by>\n' by result.
std::optional<CompletionRecord> parse_find(const redis::Reply& r, std::string_view key, std::string_view job_kind,
                                           std::string_view entity, std::string_view run_id) {
  if (r.is_nil()) return std::nullopt;
  auto bad = [&] {
    return Error(errc::protocol_error,
                 fmt::format("completion record {}: not in a format this jobguard reads: {}", key,
                             redis::to_debug_string(r)));
  };
  if (!r.is_string()) throw bad();
  const std::string_view v = r.str;
  const auto nl = v.find('\n');
  if (nl == std::string_view::npos || v.substr(0, 3) != "r1 ") throw bad();
  const std::string_view head = v.substr(3, nl - 3);
  auto number = [&](std::string_view s, auto& out) {
    if (s.empty() || std::from_chars(s.data(), s.data() + s.size(), out).ptr != s.data() + s.size()) throw bad();
  };
  long long at = 0;
  std::size_t by_len = 0, rest = 0;
  if (const auto sp = head.find(' '); sp == std::string_view::npos) {
    number(head, at);
    const auto end = v.find('\n', nl + 1);
    if (end == std::string_view::npos) throw bad();
    by_len = end - nl - 1;
    rest = end + 1;
  } else {
    number(head.substr(0, sp), at);
    number(head.substr(sp + 1), by_len);
    if (by_len > v.size() - nl - 1) throw bad();
    rest = nl + 1 + by_len;
  }
  return CompletionRecord{std::string(job_kind), std::string(entity), std::string(run_id), from_ms(at),
                          std::string(v.substr(nl + 1, by_len)), std::string(v.substr(rest))};
}

// The hash an older jobguard wrote (fields at, by, result): still read while
// its retention keeps it; its GET fails with WRONGTYPE.
redis::Command legacy_find_command(const std::string& key) {
  return redis::Command{"HMGET", key, "at", "by", "result"};
}
bool is_legacy(const redis::Reply& r) { return r.is_error() && r.error_prefix() == "WRONGTYPE"; }

std::optional<CompletionRecord> parse_legacy_find(const redis::Reply& r, std::string_view job_kind,
                                                  std::string_view entity, std::string_view run_id) {
  if (!r.is_array() || r.elements.size() != 3)
    throw Error(errc::protocol_error, "HMGET completion record: unexpected reply " + redis::to_debug_string(r));
  if (r.elements[0].is_nil()) return std::nullopt;
  return CompletionRecord{std::string(job_kind), std::string(entity), std::string(run_id),
                          from_ms(std::stoll(r.elements[0].str)), r.elements[1].str, r.elements[2].str};
}

}  // namespace

void CompletionStore::async_record(std::string_view, std::string_view, std::string_view, std::string_view,
                                   std::string_view, Done<RecordOutcome> done) {
  detail::no_async_form(done, "this completion store");
}

void CompletionStore::async_find(std::string_view, std::string_view, std::string_view,
                                 Done<std::optional<CompletionRecord>> done) {
  detail::no_async_form(done, "this completion store");
}

RecordOutcome RedisCompletionStore::record(std::string_view job_kind, std::string_view entity, std::string_view run_id,
                                           std::string_view completed_by, std::string_view result) {
  auto r = client_.eval(record_script(), {key_for(job_kind, entity, run_id)},
                        {std::string(completed_by), std::string(result), std::to_string(opts_.retention.count())},
                        {opts_.timeout});
  return parse_record(r, job_kind, entity, run_id);
}

std::optional<CompletionRecord> RedisCompletionStore::find(std::string_view job_kind, std::string_view entity,
                                                           std::string_view run_id) {
  const std::string key = key_for(job_kind, entity, run_id);
  redis::Reply r;
  try {
    r = client_.exec(redis::Command{"GET", key}, {opts_.timeout});
  } catch (const Error& e) {
    if (e.code() != make_error_code(errc::server_error) || e.detail().find("WRONGTYPE") == std::string_view::npos)
      throw;
    return parse_legacy_find(client_.exec(legacy_find_command(key), {opts_.timeout}), job_kind, entity, run_id);
  }
  return parse_find(r, key, job_kind, entity, run_id);
}

void RedisCompletionStore::async_record(std::string_view job_kind, std::string_view entity, std::string_view run_id,
                                        std::string_view completed_by, std::string_view result,
                                        Done<RecordOutcome> done) {
  std::string key;
  if (!checked(done, [&] { key = key_for(job_kind, entity, run_id); })) return;
  client_.async_eval(record_script(), {std::move(key)},
                     {std::string(completed_by), std::string(result), std::to_string(opts_.retention.count())},
                     reporting<RecordOutcome>(client_, std::move(done),
                                              [k = std::string(job_kind), e = std::string(entity),
                                               id = std::string(run_id)](const redis::Reply& r) {
                                                return parse_record(r, k, e, id);
                                              }),
                     {opts_.timeout});
}

void RedisCompletionStore::async_find(std::string_view job_kind, std::string_view entity, std::string_view run_id,
                                      Done<std::optional<CompletionRecord>> done) {
  std::string key;
  if (!checked(done, [&] { key = key_for(job_kind, entity, run_id); })) return;
  auto found = [this, done = std::move(done), key, k = std::string(job_kind), e = std::string(entity),
                id = std::string(run_id)](std::error_code ec, redis::Reply r) mutable {
    if (is_legacy(r)) {
      return client_.async_exec(legacy_find_command(key),
                                reporting<std::optional<CompletionRecord>>(
                                    client_, std::move(done),
                                    [k, e, id](const redis::Reply& h) { return parse_legacy_find(h, k, e, id); }),
                                {opts_.timeout});
    }
    reporting<std::optional<CompletionRecord>>(client_, std::move(done), [&](const redis::Reply& v) {
      return parse_find(v, key, k, e, id);
    })(ec, std::move(r));
  };
  client_.async_exec(redis::Command{"GET", key}, std::move(found), {opts_.timeout});
}

}  // namespace jobguard::guard
