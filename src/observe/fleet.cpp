#include "jobguard/observe/fleet.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::observe_scripts {
extern const std::string_view fleet_publish;
}

namespace jobguard::observe {
namespace {

constexpr std::size_t kBuckets = kSecondsBuckets.size() + 1;

using CountField = std::uint64_t FleetCounts::*;
struct NamedField {
  const char* name;
  CountField field;
};
// Short names: they are stored once per class per minute.
constexpr NamedField kFields[] = {
    {"att", &FleetCounts::attempts},
    {"cont", &FleetCounts::contended},
    {"acq", &FleetCounts::acquisitions},
    {"busy", &FleetCounts::busy},
    {"rel", &FleetCounts::releases},
    {"reln", &FleetCounts::released_not_owner},
    {"lost", &FleetCounts::leases_lost},
    {"ren", &FleetCounts::renewals},
    {"renf", &FleetCounts::renewal_failures},
    {"fo", &FleetCounts::fail_open},
    {"stale", &FleetCounts::stale_writes_rejected},
    {"err", &FleetCounts::redis_errors},
    {"hns", &FleetCounts::hold_sum_ns},
    {"wns", &FleetCounts::wait_sum_ns},
    {"rl", &FleetCounts::rate_limited},
    {"rlms", &FleetCounts::rate_limit_wait_ms},
    {"cl", &FleetCounts::concurrency_limited},
    {"clms", &FleetCounts::concurrency_limit_wait_ms},
};

std::uint64_t minus(std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; }

HistogramSnapshot cumulative(const std::array<std::uint64_t, kBuckets>& b, std::uint64_t sum_ns) {
  HistogramSnapshot s;
  std::uint64_t running = 0;
  for (std::size_t i = 0; i < kBuckets; ++i) {
    running += b[i];
    s.cumulative[i] = running;
  }
  s.count = running;
  s.sum_seconds = static_cast<double>(sum_ns) / 1e9;
  return s;
}

// Per-bucket counts back from a cumulative snapshot.
std::array<std::uint64_t, kBuckets> per_bucket(const HistogramSnapshot& h) {
  std::array<std::uint64_t, kBuckets> out{};
  std::uint64_t prev = 0;
  for (std::size_t i = 0; i < kBuckets; ++i) {
    out[i] = minus(h.cumulative[i], prev);
    prev = std::max(prev, h.cumulative[i]);
  }
  return out;
}

std::uint64_t sum_ns(const HistogramSnapshot& h) {
  return h.sum_seconds <= 0 ? 0 : static_cast<std::uint64_t>(std::llround(h.sum_seconds * 1e9));
}

std::optional<std::uint64_t> parse_u64(std::string_view s) {
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) {
    // HINCRBY keeps signed 64-bit values; a negative one is not ours.
    return std::nullopt;
  }
  return v;
}

}  // namespace

// --- FleetCounts ----------------------------------------------------------------

FleetCounts& FleetCounts::operator+=(const FleetCounts& o) noexcept {
  for (const auto& f : kFields) this->*(f.field) += o.*(f.field);
  for (std::size_t i = 0; i < kBuckets; ++i) {
    hold_buckets[i] += o.hold_buckets[i];
    wait_buckets[i] += o.wait_buckets[i];
  }
  return *this;
}

bool FleetCounts::empty() const noexcept {
  for (const auto& f : kFields)
    if (this->*(f.field) != 0) return false;
  for (std::size_t i = 0; i < kBuckets; ++i)
    if (hold_buckets[i] != 0 || wait_buckets[i] != 0) return false;
  return true;
}

std::uint64_t FleetCounts::hold_count() const noexcept {
  std::uint64_t n = 0;
  for (auto v : hold_buckets) n += v;
  return n;
}
std::uint64_t FleetCounts::wait_count() const noexcept {
  std::uint64_t n = 0;
  for (auto v : wait_buckets) n += v;
  return n;
}
HistogramSnapshot FleetCounts::hold() const noexcept { return cumulative(hold_buckets, hold_sum_ns); }
HistogramSnapshot FleetCounts::wait() const noexcept { return cumulative(wait_buckets, wait_sum_ns); }

std::vector<std::pair<std::string, std::uint64_t>> FleetCounts::to_fields() const {
  std::vector<std::pair<std::string, std::uint64_t>> out;
  for (const auto& f : kFields)
    if (this->*(f.field) != 0) out.emplace_back(f.name, this->*(f.field));
  for (std::size_t i = 0; i < kBuckets; ++i) {
    if (hold_buckets[i] != 0) out.emplace_back(fmt::format("h{}", i), hold_buckets[i]);
    if (wait_buckets[i] != 0) out.emplace_back(fmt::format("w{}", i), wait_buckets[i]);
  }
  return out;
}

FleetCounts FleetCounts::from_fields(const std::vector<std::pair<std::string, std::string>>& fields) {
  FleetCounts c;
  for (const auto& [name, text] : fields) {
    const auto v = parse_u64(text);
    if (!v) continue;
    bool known = false;
    for (const auto& f : kFields) {
      if (name == f.name) {
        c.*(f.field) = *v;
        known = true;
        break;
      }
    }
    if (known || name.size() < 2 || (name[0] != 'h' && name[0] != 'w')) continue;
    const auto idx = parse_u64(std::string_view(name).substr(1));
    if (!idx || *idx >= kBuckets) continue;
    (name[0] == 'h' ? c.hold_buckets : c.wait_buckets)[*idx] = *v;
  }
  return c;
}

FleetCounts counts_between(const LockClassSnapshot& now, const LockClassSnapshot* before) {
  static const LockClassSnapshot zero;
  const LockClassSnapshot& b = before ? *before : zero;
  FleetCounts c;
  c.attempts = minus(now.wait_seconds.count, b.wait_seconds.count);
  c.contended = minus(now.contended_total, b.contended_total);
  c.acquisitions = minus(now.acquisitions_total, b.acquisitions_total);
  c.busy = minus(now.busy_total, b.busy_total);
  c.releases = minus(now.releases_total, b.releases_total);
  c.released_not_owner = minus(now.released_not_owner_total, b.released_not_owner_total);
  c.leases_lost = minus(now.leases_lost_total, b.leases_lost_total);
  c.renewals = minus(now.renewals_total, b.renewals_total);
  c.renewal_failures = minus(now.renewal_failures_total, b.renewal_failures_total);
  c.fail_open = minus(now.fail_open_total, b.fail_open_total);
  c.stale_writes_rejected = minus(now.stale_writes_rejected_total, b.stale_writes_rejected_total);
  c.redis_errors = minus(now.redis_errors_total, b.redis_errors_total);
  c.rate_limited = minus(now.rate_limited_total, b.rate_limited_total);
  c.rate_limit_wait_ms = minus(now.rate_limit_wait_ms_total, b.rate_limit_wait_ms_total);
  c.concurrency_limited = minus(now.concurrency_limited_total, b.concurrency_limited_total);
  c.concurrency_limit_wait_ms = minus(now.concurrency_limit_wait_ms_total, b.concurrency_limit_wait_ms_total);
  const auto hn = per_bucket(now.hold_seconds), hb = per_bucket(b.hold_seconds);
  const auto wn = per_bucket(now.wait_seconds), wb = per_bucket(b.wait_seconds);
  for (std::size_t i = 0; i < kBuckets; ++i) {
    c.hold_buckets[i] = minus(hn[i], hb[i]);
    c.wait_buckets[i] = minus(wn[i], wb[i]);
  }
  c.hold_sum_ns = minus(sum_ns(now.hold_seconds), sum_ns(b.hold_seconds));
  c.wait_sum_ns = minus(sum_ns(now.wait_seconds), sum_ns(b.wait_seconds));
  return c;
}

FleetCounts counts_minus(const FleetCounts& a, const FleetCounts& b) noexcept {
  FleetCounts c;
  for (const auto& f : kFields) c.*(f.field) = minus(a.*(f.field), b.*(f.field));
  for (std::size_t i = 0; i < kBuckets; ++i) {
    c.hold_buckets[i] = minus(a.hold_buckets[i], b.hold_buckets[i]);
    c.wait_buckets[i] = minus(a.wait_buckets[i], b.wait_buckets[i]);
  }
  return c;
}

void FleetAccumulator::add(const FleetSeries& s) {
  if (s.minutes.empty()) return;
  for (const auto& [name, per_minute] : s.classes) {
    auto& total = totals_[name];
    for (std::size_t i = 0; i < per_minute.size() && i < s.minutes.size(); ++i) {
      // Forgotten buckets: read (and counted) before, then pruned below.
      if (s.minutes[i] < floor_) continue;
      auto& prev = seen_[{name, s.minutes[i]}];
      total += counts_minus(per_minute[i], prev);
      prev = per_minute[i];
    }
  }
  // Buckets older than this read are never read again: forget them (their
  // counts stay in the totals).
  const std::int64_t oldest = s.minutes.front();
  floor_ = std::max(floor_, oldest);
  for (auto it = seen_.begin(); it != seen_.end();) {
    if (it->first.second < floor_) it = seen_.erase(it);
    else ++it;
  }
}

// --- keys and windows -------------------------------------------------------------

FleetKeys::FleetKeys(std::string prefix) : prefix_(std::move(prefix)) {
  if (prefix_.empty() || prefix_.find_first_of("{} \t\r\n") != std::string::npos)
    throw Error(errc::invalid_argument,
                fmt::format("fleet key prefix \"{}\": must be non-empty, without braces or whitespace", prefix_));
  tag_ = "{" + prefix_ + ":fleet}";
}
std::string FleetKeys::classes() const { return tag_ + ":classes"; }
std::string FleetKeys::bucket(std::int64_t unix_minute, std::string_view lock_class) const {
  return fmt::format("{}:m:{}:{}", tag_, unix_minute, lock_class);
}

std::int64_t unix_minute(WallClock::time_point t) noexcept {
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
  // Floor division: a clock before 1970 (a test's fake clock) still maps to
  // the minute that contains it.
  return s >= 0 ? s / 60 : -((-s + 59) / 60);
}

WindowPlan plan_window(WallClock::time_point now, std::chrono::minutes window) {
  WindowPlan p;
  const auto w = std::max<std::int64_t>(0, window.count());
  const std::int64_t cur = unix_minute(now);
  for (std::int64_t m = cur - w; m <= cur; ++m) p.minutes.push_back(m);
  const double now_s = std::chrono::duration<double>(now.time_since_epoch()).count();
  p.span_seconds = now_s - static_cast<double>((cur - w) * 60);
  return p;
}

std::chrono::minutes parse_window(std::string_view text) {
  if (text == "1m") return std::chrono::minutes(1);
  if (text == "5m") return std::chrono::minutes(5);
  if (text == "15m") return std::chrono::minutes(15);
  if (text == "60m" || text == "1h") return std::chrono::minutes(60);
  throw Error(errc::invalid_argument, fmt::format("--window \"{}\": must be 1m, 5m, 15m or 60m", text));
}

// --- the four numbers ---------------------------------------------------------------

double FleetClassStats::acquisitions_per_second() const noexcept {
  return span_seconds > 0 ? static_cast<double>(counts.acquisitions) / span_seconds : 0;
}
std::optional<double> FleetClassStats::contention_ratio() const noexcept {
  if (counts.attempts == 0) return std::nullopt;
  return std::min(1.0, static_cast<double>(counts.contended) / static_cast<double>(counts.attempts));
}
std::optional<double> FleetClassStats::hold_avg_seconds() const noexcept {
  const auto n = counts.hold_count();
  if (n == 0) return std::nullopt;
  return static_cast<double>(counts.hold_sum_ns) / 1e9 / static_cast<double>(n);
}
std::optional<double> FleetClassStats::hold_quantile_seconds(double q) const noexcept {
  return counts.hold().quantile(q);
}
double FleetClassStats::expired_per_minute() const noexcept {
  return span_seconds > 0 ? static_cast<double>(counts.expired()) * 60.0 / span_seconds : 0;
}

const FleetClassStats* FleetSnapshot::find(std::string_view lock_class) const noexcept {
  for (const auto& c : classes)
    if (c.lock_class == lock_class) return &c;
  return nullptr;
}

// --- reader ---------------------------------------------------------------------------

FleetReader::FleetReader(redis::Client& client, FleetReaderOptions options)
    : client_(client), options_(std::move(options)), keys_(options_.prefix) {}

FleetSeries FleetReader::series(std::chrono::minutes window) const {
  const auto now = options_.now ? options_.now() : WallClock::now();
  const WindowPlan plan = plan_window(now, window);
  redis::CallOptions call{options_.timeout};
  FleetSeries out;
  out.minutes = plan.minutes;

  const std::string classes_key = keys_.classes();
  const std::string min_score = std::to_string(plan.minutes.front());
  const std::string limit = std::to_string(options_.max_classes);
  redis::Reply names = client_.exec(
      redis::Command{"ZRANGEBYSCORE", classes_key, min_score, "+inf", "LIMIT", "0", limit}, call);
  if (!names.is_array())
    throw Error(errc::protocol_error, fmt::format("unexpected reply to ZRANGEBYSCORE {}", classes_key));

  // Every bucket of every class in one pipeline: the client writes the
  // calls submitted together in one go, and they all live on one slot.
  struct Pending {
    std::string lock_class;
    std::size_t index;
    std::future<redis::Reply> reply;
  };
  std::vector<Pending> pending;
  pending.reserve(names.elements.size() * plan.minutes.size());
  for (const auto& n : names.elements) {
    if (!n.is_string()) continue;
    out.classes[n.str].resize(plan.minutes.size());
    for (std::size_t i = 0; i < plan.minutes.size(); ++i)
      pending.push_back({n.str, i, client_.exec_future(redis::Command{"HGETALL", keys_.bucket(plan.minutes[i], n.str)}, call)});
  }
  for (auto& p : pending) {
    redis::Reply r = p.reply.get();  // throws jobguard::Error on failure or deadline
    if (!r.is_array()) continue;
    std::vector<std::pair<std::string, std::string>> fields;
    fields.reserve(r.elements.size() / 2);
    for (std::size_t i = 0; i + 1 < r.elements.size(); i += 2)
      fields.emplace_back(std::move(r.elements[i].str), std::move(r.elements[i + 1].str));
    out.classes[p.lock_class][p.index] = FleetCounts::from_fields(fields);
  }
  return out;
}

FleetSnapshot FleetReader::read(std::chrono::minutes window) const {
  const auto now = options_.now ? options_.now() : WallClock::now();
  FleetReaderOptions fixed = options_;
  fixed.now = [now] { return now; };  // series() and the span use the same instant
  const FleetSeries s = FleetReader(client_, fixed).series(window);
  FleetSnapshot snap;
  snap.window = window;
  snap.as_of = now;
  snap.span_seconds = plan_window(now, window).span_seconds;
  for (const auto& [name, per_minute] : s.classes) {
    FleetClassStats c;
    c.lock_class = name;
    c.span_seconds = snap.span_seconds;
    for (const auto& m : per_minute) c.counts += m;
    snap.classes.push_back(std::move(c));
  }
  return snap;
}

// --- publisher -------------------------------------------------------------------------

struct FleetPublisher::Impl {
  Impl(redis::Client& c, FleetPublisherOptions o)
      : client(c),
        opts(std::move(o)),
        keys(opts.prefix),
        registry(opts.registry ? *opts.registry : Registry::global()),
        script(std::string(observe_scripts::fleet_publish)) {
    if (opts.retention < std::chrono::minutes(1))
      throw Error(errc::invalid_argument, "fleet publisher: retention must be at least 1 minute");
    if (!opts.now) opts.now = [] { return WallClock::now(); };
  }

  redis::Client& client;
  FleetPublisherOptions opts;
  FleetKeys keys;
  Registry& registry;
  redis::Script script;

  // The snapshot the last confirmed batch was computed from, per class.
  // Guarded by flush_mu (one batch at a time).
  std::mutex flush_mu;
  std::map<std::string, LockClassSnapshot, std::less<>> published;

  mutable std::mutex stats_mu;
  FleetPublisherStats st;

  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::thread thread;

  bool flush() {
    std::lock_guard<std::mutex> g(flush_mu);
    std::vector<LockClassSnapshot> now = registry.snapshot();
    std::vector<std::string> keys_arg{keys.classes()};
    std::vector<std::string> args;
    const auto t = opts.now();
    const std::int64_t minute = unix_minute(t);
    const std::int64_t expire_at = (minute + 1) * 60 + opts.retention.count() * 60;
    args.push_back(std::to_string(minute));
    args.push_back(std::to_string(expire_at));
    args.push_back(std::to_string(minute - opts.retention.count()));
    std::vector<const LockClassSnapshot*> sent;
    for (const auto& s : now) {
      auto it = published.find(s.lock_class);
      const FleetCounts d = counts_between(s, it == published.end() ? nullptr : &it->second);
      if (d.empty()) continue;
      const auto fields = d.to_fields();
      keys_arg.push_back(keys.bucket(minute, s.lock_class));
      args.push_back(s.lock_class);
      args.push_back(std::to_string(fields.size()));
      for (const auto& [f, v] : fields) {
        args.push_back(f);
        args.push_back(std::to_string(v));
      }
      sent.push_back(&s);
    }
    if (sent.empty()) return true;
    try {
      client.eval(script, std::move(keys_arg), std::move(args), redis::CallOptions{opts.timeout});
    } catch (const std::exception&) {
      // Not advanced: the next batch carries these counts too.
      std::lock_guard<std::mutex> sg(stats_mu);
      ++st.failures;
      return false;
    }
    for (const auto* s : sent) published[s->lock_class] = *s;
    std::lock_guard<std::mutex> sg(stats_mu);
    ++st.batches;
    st.classes_sent += sent.size();
    return true;
  }

  void loop() {
    std::unique_lock<std::mutex> g(mu);
    while (!stopping) {
      cv.wait_for(g, opts.interval, [this] { return stopping; });
      if (stopping) break;
      g.unlock();
      flush();
      g.lock();
    }
  }
};

FleetPublisher::FleetPublisher(redis::Client& client, FleetPublisherOptions options)
    : impl_(std::make_unique<Impl>(client, std::move(options))) {
  if (impl_->opts.interval.count() > 0) impl_->thread = std::thread([i = impl_.get()] { i->loop(); });
}

FleetPublisher::~FleetPublisher() {
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  // The final batch: what happened since the last one (a `jobguard run` that
  // lives a second publishes only here). Best effort within `timeout`.
  if (!impl_->client.running_in_loop_thread()) impl_->flush();
}

bool FleetPublisher::flush() { return impl_->flush(); }

FleetPublisherStats FleetPublisher::stats() const {
  std::lock_guard<std::mutex> g(impl_->stats_mu);
  return impl_->st;
}

}  // namespace jobguard::observe
