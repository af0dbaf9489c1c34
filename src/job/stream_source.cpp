#include "jobguard/job/stream_source.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/script.hpp"
#include "job/awaiting.hpp"

namespace jobguard::job {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
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

namespace job_scripts {
extern const std::string_view unique_state;
extern const std::string_view unique_add;
extern const std::string_view unique_release;
extern const std::string_view unique_reap;
extern const std::string_view touch;
}  // namespace job_scripts

namespace {
const redis::Script& unique_add_script() {
  static const redis::Script s{std::string(job_scripts::unique_state) + std::string(job_scripts::unique_add)};
  return s;
}
const redis::Script& unique_release_script() {
  static const redis::Script s{std::string(job_scripts::unique_release)};
  return s;
}
const redis::Script& touch_script() {
  static const redis::Script s{std::string(job_scripts::touch)};
  return s;
}
const redis::Script& unique_reap_script() {
  static const redis::Script s{std::string(job_scripts::unique_state) + std::string(job_scripts::unique_reap)};
  return s;
}
}  // namespace

void StreamOptions::validate() const {
  if (stream.empty()) throw Error(errc::invalid_argument, "stream source: empty stream key");
  if (group.empty()) throw Error(errc::invalid_argument, "stream source: empty consumer group");
  if (block < std::chrono::milliseconds(1) || block > std::chrono::milliseconds(1000))
    throw Error(errc::invalid_argument,
                "stream source: block " + std::to_string(block.count()) + "ms outside [1ms, 1s]");
  if (claim_idle.count() <= 0) throw Error(errc::invalid_argument, "stream source: claim_idle must be > 0");
  if (max_attempts < 1) throw Error(errc::invalid_argument, "stream source: max_attempts must be >= 1");
  if (call_timeout.count() <= 0) throw Error(errc::invalid_argument, "stream source: call_timeout must be > 0");
}

StreamSource::StreamSource(redis::Client& client, StreamOptions options) : client_(client), opts_(std::move(options)) {
  opts_.validate();
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

template <class T>
T StreamSource::block_on(awaitable<T> aw) {
  if (client_.running_in_loop_thread())
    throw Error(errc::invalid_argument, "stream source: a blocking call on the event-loop thread (use async_*)");
  return asio::co_spawn(client_.get_executor(), std::move(aw), asio::use_future).get();
}

awaitable<Reply> StreamSource::exec_group(Command cmd, std::chrono::milliseconds timeout, bool retry,
                                          redis::Client* via) {
  redis::Client& c = via ? *via : client_;
  try {
    co_return co_await redis::async_exec(c, cmd, use_awaitable, CallOptions{timeout});
  } catch (const Error& e) {
    if (!group_vanished(e)) throw;
  }
  co_await async_ensure_group();
  groups_recreated_.fetch_add(1, std::memory_order_relaxed);
  if (!retry) co_return Reply::nil_reply();
  co_return co_await redis::async_exec(c, std::move(cmd), use_awaitable, CallOptions{timeout});
}

awaitable<void> StreamSource::async_ensure_group() {
  try {
    // Named, not a braced temporary in the co_await: g++ 12 miscompiles
    // those ("array used as initializer").
    Command create{"XGROUP", "CREATE", opts_.stream, opts_.group, "0", "MKSTREAM"};
    co_await redis::async_exec(client_, std::move(create), use_awaitable, CallOptions{opts_.call_timeout});
  } catch (const Error& e) {
    if (std::string_view(e.what()).find("BUSYGROUP") == std::string_view::npos) throw;
  }
}

void StreamSource::ensure_group() { block_on(async_ensure_group()); }

std::string StreamSource::add(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::vector<std::string> args{"XADD", opts_.stream, "*"};
  for (const auto& [k, v] : fields) {
    args.push_back(k);
    args.push_back(v);
  }
  return client_.exec(Command(args), CallOptions{opts_.call_timeout}).str;
}

UniqueAdd StreamSource::add_unique(std::vector<std::pair<std::string, std::string>> fields,
                                   const UniqueOptions& unique) {
  validate(unique);
  UniqueAdd out;
  const auto has = [&](std::string_view name) {
    return std::any_of(fields.begin(), fields.end(), [&](const auto& f) { return f.first == name; });
  };
  for (auto name : {kUniqueStrategyField, kUniqueKeyField, kUniqueConflictField})
    if (has(name))
      throw Error(errc::invalid_argument, fmt::format("unique job: field \"{}\" is jobguard's own", name));
  fields.emplace_back(kUniqueStrategyField, to_string(unique.strategy));
  fields.emplace_back(kUniqueConflictField, to_string(unique.on_conflict));
  if (unique.strategy == UniqueStrategy::while_executing) {
    out.id = add(fields);
    return out;
  }
  const std::vector<std::string> by = unique.by.empty() ? std::vector<std::string>{"id"} : unique.by;
  std::string value;
  for (const auto& name : by) {
    const auto f = std::find_if(fields.begin(), fields.end(), [&](const auto& kv) { return kv.first == name; });
    if (f == fields.end())
      throw Error(errc::invalid_argument,
                  fmt::format("unique job: no field \"{}\" to key by (give it, or choose fields to key by)", name));
    // Unit separator between values: "a b"+"c" and "a"+"b c" stay two keys.
    if (!value.empty()) value += '\x1f';
    value += f->second;
  }
  out.lock_key = unique_lock_key(opts_.stream, value);
  fields.emplace_back(kUniqueKeyField, out.lock_key);
  std::vector<std::string> args{opts_.group, std::to_string(unique.unique_for.count()),
                                std::string(to_string(unique.on_conflict)),
                                unique.strategy == UniqueStrategy::until_expired ? "0" : "1",
                                unique.strategy == UniqueStrategy::until_expired ? "1" : "0"};
  for (auto& [k, v] : fields) {
    args.push_back(std::move(k));
    args.push_back(std::move(v));
  }
  const Reply r = client_.eval(unique_add_script(), {opts_.stream, out.lock_key, unique_registry_key(opts_.stream)},
                               std::move(args), CallOptions{opts_.call_timeout});
  if (!r.is_array() || r.elements.size() < 4)
    throw Error(errc::protocol_error, "unique job: unexpected reply from the enqueue script");
  const std::string& what = r.elements[0].str;
  out.id = r.elements[1].str;
  out.holder = r.elements[2].str;
  out.holder_state = r.elements[3].str;
  out.result = what == "conflict"   ? UniqueAdd::Result::conflict
               : what == "replaced" ? UniqueAdd::Result::replaced
                                    : UniqueAdd::Result::added;
  return out;
}

awaitable<bool> StreamSource::async_touch(std::string consumer, std::string id) {
  std::vector<std::string> keys{opts_.stream};
  std::vector<std::string> args{opts_.group, std::move(consumer), std::move(id)};
  Reply r = co_await detail::eval_on_loop(client_, touch_script(), std::move(keys), std::move(args), opts_.call_timeout);
  co_return r.integer == 1;
}

awaitable<bool> StreamSource::async_release_unique(std::string lock_key, std::string job_id) {
  if (lock_key.empty()) co_return false;
  // Named, not braced temporaries in the co_await: g++ 12 mishandles those.
  std::vector<std::string> keys{std::move(lock_key), unique_registry_key(opts_.stream)};
  std::vector<std::string> args{std::move(job_id)};
  Reply r = co_await detail::eval_on_loop(client_, unique_release_script(), std::move(keys), std::move(args),
                                  opts_.call_timeout);
  co_return r.integer == 1;
}

awaitable<std::vector<std::pair<std::string, std::string>>> StreamSource::async_reap_unique(std::size_t budget) {
  std::vector<std::pair<std::string, std::string>> reaped;
  std::string cursor = "0";
  do {
    std::vector<std::string> keys{unique_registry_key(opts_.stream), opts_.stream};
    std::vector<std::string> args{opts_.group, cursor, std::to_string(std::max<std::size_t>(budget, 1))};
    Reply r = co_await detail::eval_on_loop(client_, unique_reap_script(), std::move(keys), std::move(args),
                                    opts_.call_timeout);
    if (!r.is_array() || r.elements.size() < 2) break;
    cursor = r.elements[0].str;
    const auto& freed = r.elements[1].elements;
    for (std::size_t i = 0; i + 1 < freed.size(); i += 2) reaped.emplace_back(freed[i].str, freed[i + 1].str);
  } while (cursor != "0");
  co_return reaped;
}

std::vector<std::pair<std::string, std::string>> StreamSource::unique_locks(std::size_t max) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string registry = unique_registry_key(opts_.stream);
  std::vector<std::string> locks;
  std::string cursor = "0";
  do {
    Reply r = client_.exec(Command{"SSCAN", registry, cursor, "COUNT", "256"}, CallOptions{opts_.call_timeout});
    if (!r.is_array() || r.elements.size() < 2) break;
    cursor = r.elements[0].str;
    for (const auto& e : r.elements[1].elements)
      if (locks.size() < max) locks.push_back(e.str);
  } while (cursor != "0" && locks.size() < max);
  std::sort(locks.begin(), locks.end());
  for (auto& lock : locks) {
    Reply holder = client_.exec(Command{"GET", lock}, CallOptions{opts_.call_timeout});
    if (holder.is_nil()) continue;  // released since the scan
    out.emplace_back(std::move(lock), holder.str);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> StreamSource::reap_unique(std::size_t budget) {
  return block_on(async_reap_unique(budget));
}

awaitable<std::vector<StreamJob>> StreamSource::async_next(std::string consumer, std::size_t max,
                                                           redis::Client* reader) {
  std::vector<StreamJob> jobs;
  if (max == 0) co_return jobs;
  bool scan = false;
  {
    std::lock_guard lk(mu_);
    auto now = std::chrono::steady_clock::now();
    if (now - last_scan_ >= opts_.claim_idle / 4) {
      last_scan_ = now;
      scan = true;
    }
  }
  if (scan) {
    jobs = co_await async_reclaim(consumer, max);
    if (!jobs.empty()) co_return jobs;
  }
  // The call's deadline must outlast the server-side BLOCK, or every empty
  // read would end as a client timeout.
  // A vanished group is recreated and this read ends empty (no retry: the
  // caller polls again, and a blocked read must not block twice).
  Command read{"XREADGROUP", "GROUP", opts_.group, consumer, "COUNT", std::to_string(max),
               "BLOCK",      std::to_string(opts_.block.count()), "STREAMS", opts_.stream, ">"};
  Reply r = co_await exec_group(std::move(read), opts_.block + opts_.call_timeout, false, reader);
  // [[stream, [[id, fields]...]]] or nil when BLOCK ran out.
  if (!r.is_array() || r.elements.empty()) co_return jobs;
  const auto& st = r.elements[0];
  if (!st.is_array() || st.elements.size() < 2 || !st.elements[1].is_array()) co_return jobs;
  for (const auto& e : st.elements[1].elements)
    if (auto j = parse_entry(e)) jobs.push_back(std::move(*j));
  co_return jobs;
}

std::optional<StreamJob> StreamSource::next(std::string_view consumer) {
  auto jobs = block_on(async_next(std::string(consumer), 1));
  if (jobs.empty()) return std::nullopt;
  return std::move(jobs.front());
}

awaitable<std::vector<StreamJob>> StreamSource::async_reclaim(std::string consumer, std::size_t max) {
  std::string start;
  {
    std::lock_guard lk(mu_);
    start = cursor_;
  }
  std::vector<StreamJob> jobs;
  for (;;) {
    Command claim{"XAUTOCLAIM", opts_.stream, opts_.group, consumer, std::to_string(opts_.claim_idle.count()),
                  start,        "COUNT",      std::to_string(max)};
    Reply r = co_await exec_group(std::move(claim), opts_.call_timeout, false);
    // [next-cursor, [[id, fields]...], [deleted ids]] (Redis 7).
    if (!r.is_array() || r.elements.size() < 2) co_return jobs;
    std::string next_cursor = r.elements[0].str;
    {
      std::lock_guard lk(mu_);
      cursor_ = next_cursor;
    }
    bool dead = false;
    if (r.elements[1].is_array()) {
      for (const auto& e : r.elements[1].elements) {
        auto job = parse_entry(e);
        if (!job) continue;
        job->reclaimed = true;
        job->deliveries = co_await async_deliveries(job->id);
        // The claim above counted as a delivery: a job that stalled its
        // consumer max_attempts times is poison, not bad luck.
        if (job->deliveries > opts_.max_attempts) {
          const auto n = job->deliveries - 1;
          StreamJob seen = *job;
          seen.deliveries = n;
          co_await dead_letter(std::move(*job),
                               "stalled: not acknowledged after " + std::to_string(n) + " deliveries", n);
          {
            std::lock_guard lk(mu_);
            stalled_.push_back(std::move(seen));
          }
          dead = true;
          continue;
        }
        jobs.push_back(std::move(*job));
      }
    }
    // Only dead letters in this scan: look further, until the scan wraps.
    if (!jobs.empty() || !dead) co_return jobs;
    start = next_cursor;
    if (start == "0-0") co_return jobs;
  }
}

std::optional<StreamJob> StreamSource::reclaim(std::string_view consumer) {
  auto jobs = block_on(async_reclaim(std::string(consumer), 1));
  if (jobs.empty()) return std::nullopt;
  return std::move(jobs.front());
}

awaitable<bool> StreamSource::async_ack(std::string id) {
  Command ack{"XACK", opts_.stream, opts_.group, id};
  Reply r = co_await exec_group(std::move(ack), opts_.call_timeout, false);
  co_return r.is_integer() && r.integer > 0;
}

awaitable<void> StreamSource::async_ack_gathered(std::string id) {
  const bool sent = co_await detail::await_done<bool>([this, &id](detail::Done<bool> done) {
    if (!acks_) {
      acks_ = std::make_shared<AckBatch>();
      // Posted: the other jobs finishing in this turn join the batch first.
      asio::post(client_.get_executor(), [this, b = acks_] {
        if (acks_ == b) acks_.reset();
        std::vector<std::string> args{"XACK", opts_.stream, opts_.group};
        args.insert(args.end(), b->ids.begin(), b->ids.end());
        Command xack(args);
        client_.async_exec(
            std::move(xack),
            [b](std::error_code ec, Reply) {
              for (auto& w : b->waiters) w(!ec);
            },
            CallOptions{opts_.call_timeout});
      });
    }
    acks_->ids.push_back(id);  // a copy: a failed batch acks it alone below
    acks_->waiters.push_back([done = std::move(done)](bool ok) mutable { done(nullptr, ok); });
  });
  // The batch failed (an outage, its deadline, a key that is no stream):
  // this id alone, the way an ack always went, so its error is its own.
  if (!sent) co_await async_ack(std::move(id));
}

awaitable<void> StreamSource::async_hand_back(std::string consumer, std::vector<std::string> ids) {
  if (ids.empty()) co_return;
  std::vector<std::string> args{"XCLAIM", opts_.stream, opts_.group, std::move(consumer), "0"};
  for (auto& id : ids) args.push_back(std::move(id));
  args.insert(args.end(), {"IDLE", std::to_string(opts_.claim_idle.count()), "JUSTID"});
  Command claim(args);
  co_await exec_group(std::move(claim), opts_.call_timeout, false);
}

awaitable<void> StreamSource::async_defer(std::string consumer, const StreamJob& job) {
  const auto uncharged = std::max<std::int64_t>(job.deliveries - 1, 0);
  Command claim{"XCLAIM",     opts_.stream, opts_.group, std::move(consumer), "0", job.id, "RETRYCOUNT",
                std::to_string(uncharged), "JUSTID"};
  co_await exec_group(std::move(claim), opts_.call_timeout, false);
}

std::vector<StreamJob> StreamSource::take_stalled() {
  std::lock_guard lk(mu_);
  return std::exchange(stalled_, {});
}

bool StreamSource::ack(std::string_view id) { return block_on(async_ack(std::string(id))); }

awaitable<std::int64_t> StreamSource::async_deliveries(std::string id) {
  Command pending{"XPENDING", opts_.stream, opts_.group, id, id, "1"};
  Reply r = co_await exec_group(std::move(pending), opts_.call_timeout, false);
  // [[id, consumer, idle ms, deliveries]]
  if (!r.is_array() || r.elements.empty() || !r.elements[0].is_array() || r.elements[0].elements.size() < 4)
    co_return 0;
  co_return r.elements[0].elements[3].integer;
}

std::int64_t StreamSource::deliveries(std::string_view id) { return block_on(async_deliveries(std::string(id))); }

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

namespace {
DeadLetter to_dead_letter(StreamJob entry) {
  DeadLetter d;
  d.id = entry.id;
  // The bookkeeping fields come first (dead_letter below); a job field with
  // the same name after them stays a job field.
  std::size_t i = 0;
  for (; i < entry.fields.size() && i < 3; ++i) {
    const auto& [k, v] = entry.fields[i];
    if (k == "source_id") d.source_id = v;
    else if (k == "attempts") d.attempts = std::strtoll(v.c_str(), nullptr, 10);
    else if (k == "last_error") d.last_error = v;
    else break;
  }
  d.fields.assign(entry.fields.begin() + static_cast<std::ptrdiff_t>(i), entry.fields.end());
  return d;
}
}  // namespace

std::vector<DeadLetter> StreamSource::dead_letters(std::size_t max) {
  std::vector<DeadLetter> out;
  if (max == 0) return out;
  Reply r = client_.exec(Command{"XREVRANGE", opts_.dead_letter, "+", "-", "COUNT", std::to_string(max)},
                         CallOptions{opts_.call_timeout});
  if (!r.is_array()) return out;
  for (const auto& e : r.elements) {
    auto entry = parse_entry(e);
    if (entry) out.push_back(to_dead_letter(std::move(*entry)));
  }
  return out;
}

std::optional<DeadLetter> StreamSource::dead_letter_entry(std::string_view id) {
  Reply r = client_.exec(Command{"XRANGE", opts_.dead_letter, std::string(id), std::string(id)},
                         CallOptions{opts_.call_timeout});
  if (!r.is_array() || r.elements.empty()) return std::nullopt;
  auto entry = parse_entry(r.elements[0]);
  if (!entry) return std::nullopt;
  return to_dead_letter(std::move(*entry));
}

std::optional<std::string> StreamSource::retry_dead_letter(std::string_view id) {
  auto d = dead_letter_entry(id);
  if (!d) return std::nullopt;
  std::vector<std::string> args{"XADD", opts_.stream, "*"};
  for (auto& [k, v] : d->fields) {
    args.push_back(std::move(k));
    args.push_back(std::move(v));
  }
  if (args.size() == 3) {
    // XADD needs a field: a dead letter that kept none is retried as what it was.
    args.push_back("source_id");
    args.push_back(d->source_id);
  }
  // Re-added first, then removed: a crash in between leaves the job in both
  // streams (a duplicate delivery, which completion records absorb), never in
  // neither. Two commands, not a script: the streams may live in different
  // cluster slots.
  Reply added = client_.exec(Command(args), CallOptions{opts_.call_timeout});
  client_.exec(Command{"XDEL", opts_.dead_letter, std::string(id)}, CallOptions{opts_.call_timeout});
  return added.str;
}

awaitable<bool> StreamSource::async_fail(StreamJob job, std::string error) {
  const std::int64_t n = co_await async_deliveries(job.id);
  if (n < opts_.max_attempts) co_return false;
  co_await dead_letter(std::move(job), std::move(error), n);
  co_return true;
}

bool StreamSource::fail(const StreamJob& job, std::string_view error) {
  return block_on(async_fail(job, std::string(error)));
}

awaitable<void> StreamSource::async_dead_letter(StreamJob job, std::string error) {
  const std::int64_t n = co_await async_deliveries(job.id);
  co_await dead_letter(std::move(job), std::move(error), n);
}

awaitable<void> StreamSource::dead_letter(StreamJob job, std::string error, std::int64_t n) {
  std::vector<std::string> args{"XADD", opts_.dead_letter, "*", "source_id", job.id, "attempts", std::to_string(n),
                                "last_error", std::move(error)};
  for (auto& [k, v] : job.fields) {
    args.push_back(std::move(k));
    args.push_back(std::move(v));
  }
  // Dead-letter first, then ack: a crash in between leaves a duplicate in the
  // dead-letter stream, never a job lost from both.
  Command add(args);
  co_await redis::async_exec(client_, std::move(add), use_awaitable, CallOptions{opts_.call_timeout});
  co_await async_ack(job.id);
}

}  // namespace jobguard::job
