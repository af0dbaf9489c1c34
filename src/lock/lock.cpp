#include "jobguard/lock.hpp"

#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <boost/asio/system_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include "jobguard/error.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/subscriber.hpp"
#include "lock/quarantine.hpp"
#include "lock/rwlock_internal.hpp"
#include "lock/semaphore_internal.hpp"
#include "lock/waiter.hpp"

namespace jobguard {
namespace lock_scripts {
extern const std::string_view acquire;
extern const std::string_view release;
extern const std::string_view extend;
extern const std::string_view extend_many;
extern const std::string_view leave_queue;
}  // namespace lock_scripts

namespace asio = boost::asio;

namespace {
const redis::Script& script_acquire() {
  static const redis::Script s{std::string(lock_scripts::acquire)};
  return s;
}
const redis::Script& script_extend() {
  static const redis::Script s{std::string(lock_scripts::extend)};
  return s;
}
const redis::Script& script_extend_many() {
  static const redis::Script s{std::string(lock_scripts::extend_many)};
  return s;
}
const redis::Script& script_leave() {
  static const redis::Script s{std::string(lock_scripts::leave_queue)};
  return s;
}
}  // namespace

const redis::Script& lock_release_script() {
  static const redis::Script s{std::string(lock_scripts::release)};
  return s;
}

const char* to_string(LockMode m) noexcept {
  switch (m) {
    case LockMode::mutex: return "mutex";
    case LockMode::shared: return "shared";
    case LockMode::exclusive: return "exclusive";
  }
  return "?";
}

const char* to_string(Unconfirmed u) noexcept {
  switch (u) {
    case Unconfirmed::fail_closed: return "fail-closed";
    case Unconfirmed::warn: return "warn";
  }
  return "?";
}

namespace {
void warn_line(redis::Client& client, const std::string& line) {
  if (client.options().on_warning) client.options().on_warning(line);
  else std::fprintf(stderr, "jobguard: warning: %s\n", line.c_str());
}

// The WAIT (or WAITAOF, where the last lock-state check found Redis 7.2+
// with AOF on) a confirmation sends.
redis::Confirm to_confirm(const ReplicaConfirmation& c, const std::shared_ptr<void>& gate) {
  redis::Confirm r;
  r.replicas = c.replicas;
  r.timeout = c.timeout;
  r.waitaof = c.replicas > 0 && gate && static_cast<const detail::StateGate*>(gate.get())->waitaof();
  return r;
}

// Releases a lock by compare-and-delete; a fair lock's release hands it to the
// live head of its queue (release.lua). Shared by Lock, LockService and the
// grant listener, which must work after the service that started it is gone.
// `woke`: called on the loop thread when the release woke a default-mode
// waiter by name (release.lua's 2), before `done`.
void release_lock(redis::Client& client, const KeyBuilder& keys, const std::string& resource,
                  const std::string& token, LockService::ReleaseHandler done, bool fair,
                  std::function<void()> woke = nullptr) {
  const std::string key = keys.lock_key(resource);
  const std::string channel = keys.channel(resource);
  auto on_reply = [done = std::move(done), woke = std::move(woke), c = &client](std::error_code ec, redis::Reply r) {
    if (!ec && woke && r.is_integer() && r.integer == 2) woke();
    if (!done) return;
    if (ec) return done(redis::to_error(ec, r, c->address(), "release"), false);
    done(Error(), r.is_integer() && r.integer >= 1);
  };
  // On a cluster the waiters listen with SSUBSCRIBE, which only SPUBLISH
  // reaches (release.lua's ARGV[4]).
  const bool sharded = client.options().cluster;
  if (fair) {
    // Same hash slot for all four keys; a plain lock does not pay for them.
    const std::string queue = keys.queue_key(resource), qexp = keys.queue_expiry_key(resource),
                      fence = keys.fence_key(resource);
    if (sharded)
      client.async_eval_views(lock_release_script(), {key, queue, qexp, fence}, {token, channel, resource, "1"},
                              std::move(on_reply));
    else
      client.async_eval_views(lock_release_script(), {key, queue, qexp, fence}, {token, channel, resource},
                              std::move(on_reply));
  } else {
    // With its waiters' line, so the release wakes the longest-waiting one.
    const std::string waiters = keys.waiters_key(resource);
    if (sharded)
      client.async_eval_views(lock_release_script(), {key, waiters}, {token, channel, "", "1"}, std::move(on_reply));
    else
      client.async_eval_views(lock_release_script(), {key, waiters}, {token, channel}, std::move(on_reply));
  }
}

// Lets go of a reader or the writer of a read-write lock (rw_release.lua),
// which wakes by name the waiters the lock now belongs to.
void release_rw(redis::Client& client, const KeyBuilder& keys, const std::string& resource, const std::string& token,
                LockMode mode, LockService::ReleaseHandler done) {
  auto on_reply = [done = std::move(done), c = &client](std::error_code ec, redis::Reply r) {
    if (!done) return;
    if (ec) return done(redis::to_error(ec, r, c->address(), "release"), false);
    done(Error(), r.is_integer() && r.integer == 1);
  };
  const std::string readers = keys.rw_readers_key(resource), writer = keys.rw_writer_key(resource);
  client.async_eval(detail::rw_release_script(),
                    {mode == LockMode::exclusive ? writer : readers, readers, writer, keys.rw_line_key(resource),
                     keys.rw_line_expiry_key(resource), keys.rw_writers_line_key(resource)},
                    {token, keys.rw_channel(resource), client.options().cluster ? "1" : "0"}, std::move(on_reply));
}

// A grant channel name no other service can share: from the OS source like a
// token (a seeded generator would repeat itself in a forked child, and two
// services on one channel would take each other's grants).
std::string grant_channel_name(const KeyBuilder& keys) {
  const std::string t = make_token();
  return keys.prefix() + ":grant:" + t.substr(t.rfind('#') + 1);
}
}  // namespace

// Loop-thread state of a LockService: the subscriber, the channels it listens
// on and the waiters behind them.
struct LockService::Impl : std::enable_shared_from_this<LockService::Impl> {
  struct WaiterBase {
    virtual ~WaiterBase() = default;
    // A release on the waiter's resource channel (or a reconnect that may
    // have hidden one): look again.
    virtual void wake() = 0;
    // A fair release handed the lock to this waiter (release.lua).
    virtual void on_grant(std::optional<std::int64_t> fence) = 0;
    // Its entry in a default-mode line ("wake <id>" names it).
    virtual const std::string& waiter_id() const noexcept = 0;
  };

  // Plain waiters listen on their resource's release channel, shared by every
  // waiter of this service on it; fair waiters on this service's grant
  // channel, where a release names the waiter it handed the lock to. The
  // grant channel stays for the service's life, so a worker looping on a fair
  // lock does not SUBSCRIBE, UNSUBSCRIBE and try a second time around every wait.
  //
  // On a cluster (sharded pub/sub) a release can only SPUBLISH to a channel
  // in its own slot, so a service has a grant channel per fair resource it
  // waits on, with the resource's hash tag (grant_channel_for). Each is kept
  // while it has waiters and for `linger_until` after the last one left: a
  // waiter that gave up may still be handed the lock for as long as its queue
  // place lives, and the service passes such a grant on only while it hears it.
  struct Channel {
    redis::Subscriber::Id id = 0;
    std::unordered_set<WaiterBase*> waiters;
    bool ready = false;
    bool grants = false;                    // a grant channel (fair waiters)
    MonotonicClock::time_point ready_at{};  // when the loop saw the server's confirmation
    MonotonicClock::time_point linger_until{};  // cluster grant channel without waiters: dropped after
  };

  // What a waiter that just registered must do to be sure it hears the release.
  using Heard = detail::WaiterMachine::Heard;

  Impl(redis::Client& c, KeyBuilder k, const MonotonicClock& clk)
      : client(c),
        clock(clk),
        keys(std::move(k)),
        grant_channel(grant_channel_name(keys)),
        sharded(c.options().cluster),
        semaphore_calls(std::make_shared<detail::SemaphoreCalls>(c)) {}

  // The client outlives the service and so every handler that finds us alive.
  redis::Client& client;
  // The service's clock: channel confirmations are compared with attempts' send times.
  const MonotonicClock& clock;
  const KeyBuilder keys;
  const std::string grant_channel;
  const bool sharded;  // a Redis Cluster: sharded pub/sub
  // Semaphore attempts and releases: one script call per resource per turn of the loop.
  std::shared_ptr<detail::SemaphoreCalls> semaphore_calls;

  // Where a release tells a fair waiter of ours on `resource` that it has the
  // lock. On a cluster "<prefix>:grant:{resource}:<id>", in the lock's slot.
  std::string grant_channel_for(const std::string& resource) const {
    if (!sharded) return grant_channel;
    std::string c = keys.prefix();
    c.append(":grant:{").append(resource).append("}:").append(grant_channel, grant_channel.rfind(':') + 1);
    return c;
  }

  std::unique_ptr<redis::Subscriber> subscriber;  // made on first wait; loop thread only
  mutable std::mutex sub_error_mu;
  Error sub_error;  // the subscriber's last refusal; guarded by sub_error_mu
  std::unordered_map<std::string, Channel> channels;               // by channel name; loop thread only
  std::unordered_map<std::string, WaiterBase*> granted_by_token;   // fair waiters; loop thread only
  std::unordered_map<std::string, MonotonicClock::time_point> abandoned;   // token -> forget after; loop thread only
  // Default mode: a release of ours woke the waiter that has waited longest
  // (release.lua), and that waiter's acquire is still on its way: the lock is
  // free until it lands. A holder that loops (release, then at once wait for
  // the same lock again) would take it back first almost every time its
  // acquire beats the woken waiter's — on a slow host often enough to matter
  // (see docs/bench.md), each one sending the woken waiter to the back of its wait and
  // stretching the tail of every worker's wait. So our next waiting acquire
  // of that resource holds its first attempt until the instant here: one of
  // the release's round trips from its reply (at least 200 us, at most 5 ms).
  // The wake left the server with our reply, so by then the woken waiter's
  // attempt has normally landed, and we join the line behind it. Longer is
  // worse: a yield that outlasts the woken waiter's hold lands in the next
  // handoff's gap and takes the lock from the next woken waiter (three
  // round trips raise the p99 wait above no yield at all with a 1 ms hold:
  // see docs/bench.md). It then asks as usual, so a woken
  // waiter that died costs the loop that little and no more; a live one
  // costs it nothing, as it would find the lock taken anyway. Try-once
  // acquires never wait for it: their caller wants an answer now.
  // Resource -> until; entries last a few ms and are swept on insert.
  std::unordered_map<std::string, MonotonicClock::time_point> yield_until;  // loop thread only

  void woke_waiter(const std::string& resource, MonotonicClock::time_point sent, MonotonicClock::time_point replied) {
    using std::chrono::microseconds;
    const auto rtt = std::chrono::duration_cast<microseconds>(replied - sent);
    const auto y = std::clamp(rtt, microseconds(kYieldMinUs), microseconds(kYieldMaxUs));
    if (yield_until.size() >= 64) std::erase_if(yield_until, [&](const auto& e) { return e.second <= replied; });
    yield_until[resource] = replied + y;
  }
  // The instant our next waiting acquire of `resource` may first ask, if one
  // is owed to a waiter we woke; consumed by that acquire.
  std::optional<MonotonicClock::time_point> take_yield(const std::string& resource, MonotonicClock::time_point now) {
    if (yield_until.empty()) return std::nullopt;
    auto it = yield_until.find(resource);
    if (it == yield_until.end()) return std::nullopt;
    const auto until = it->second;
    yield_until.erase(it);
    if (until <= now) return std::nullopt;
    return until;
  }
  static constexpr long kYieldMinUs = 200, kYieldMaxUs = 5000;

  std::string last_class;                                  // LockService::class_metrics; loop thread only
  observe::LockClassMetrics* last_metrics = nullptr;

  redis::Subscriber& sub() {
    if (!subscriber) {
      subscriber = std::make_unique<redis::Subscriber>(client);
      // Messages published while we were reconnecting are gone: wake every
      // waiter so none sleeps through a release it never heard about. The
      // subscriptions are restored as of now; a waiter that registers later
      // was sent after that.
      // A refused AUTH or SUBSCRIBE (an ACL without pub/sub rights) leaves
      // waiters polling: said once per refusal, and kept for
      // subscriber_error(), instead of a silent fallback.
      subscriber->set_on_error([weak = weak_from_this()](const Error& e) {
        auto self = weak.lock();
        if (!self) return;
        {
          std::lock_guard g(self->sub_error_mu);
          self->sub_error = e;
        }
        const std::string line =
            fmt::format("lock waiters cannot hear releases and fall back to polling: {}", e.what());
        if (self->client.options().on_warning) self->client.options().on_warning(line);
        else std::fprintf(stderr, "jobguard: warning: %s\n", line.c_str());
      });
      subscriber->set_on_reconnect([weak = weak_from_this()] {
        auto self = weak.lock();
        if (!self) return;
        const auto now = self->clock.now();
        for (auto& [name, ch] : self->channels) {
          if (ch.ready) ch.ready_at = now;
          for (auto* w : std::vector<WaiterBase*>(ch.waiters.begin(), ch.waiters.end())) w->wake();
        }
      });
      // On a cluster each channel's node comes and goes on its own: the same,
      // for the one channel that is back (lost meanwhile: its slot moved, its
      // node's connection broke).
      subscriber->set_on_resubscribed([weak = weak_from_this()](const std::string& channel) {
        auto self = weak.lock();
        if (!self) return;
        auto it = self->channels.find(channel);
        if (it == self->channels.end()) return;
        if (it->second.ready) it->second.ready_at = self->clock.now();
        for (auto* w : std::vector<WaiterBase*>(it->second.waiters.begin(), it->second.waiters.end())) w->wake();
      });
    }
    return *subscriber;
  }

  // "<token> <fence or -1> <resource>" on the grant channel.
  void on_grant_message(const std::string& msg) {
    const auto a = msg.find(' ');
    const auto b = a == std::string::npos ? a : msg.find(' ', a + 1);
    if (b == std::string::npos) return;
    const std::string token = msg.substr(0, a);
    std::int64_t fence = -1;
    try {
      fence = std::stoll(msg.substr(a + 1, b - a - 1));
    } catch (const std::exception&) {
      return;
    }
    auto it = granted_by_token.find(token);
    if (it != granted_by_token.end()) {
      it->second->on_grant(fence >= 0 ? std::optional<std::int64_t>(fence) : std::nullopt);
      return;
    }
    // Granted to a waiter of ours that gave up or failed while its place was
    // still in the queue: nobody will use the lock, so hand it on now instead
    // of blocking it for its TTL. Any other token is left alone: its waiter
    // may hold the lock already (its own attempt found the grant first).
    auto ab = abandoned.find(token);
    if (ab == abandoned.end()) return;
    abandoned.erase(ab);
    release_lock(client, keys, msg.substr(b + 1), token, nullptr, true);
  }

  // Loop thread. A fair waiter that ended without the lock; its place in the
  // queue outlives it by at most `place_lease`.
  void abandon(std::string token, std::chrono::milliseconds place_lease) {
    const auto now = clock.now();
    std::erase_if(abandoned, [now](const auto& kv) { return kv.second < now; });
    abandoned.emplace(std::move(token), now + place_lease);
  }

  // Loop thread. `sent_at`: when the waiter sent the attempt that found the lock busy.
  Heard watch(const std::string& channel, WaiterBase* w, MonotonicClock::time_point sent_at, bool grants) {
    if (sharded) drop_idle_grant_channels(channel);
    Channel& ch = channels[channel];
    ch.waiters.insert(w);
    ch.grants = grants;
    if (ch.id == 0) {
      std::weak_ptr<Impl> weak = weak_from_this();
      ch.id = sub().subscribe(
          channel,
          [weak, channel, grants](const std::string&, const std::string& msg) {
            auto self = weak.lock();
            if (!self) return;
            if (grants) return self->on_grant_message(msg);
            auto it = self->channels.find(channel);
            if (it == self->channels.end()) return;
            // "wake <id>": the release woke one waiter, the longest waiting
            // (release.lua); the others sleep on, or the herd they would
            // make races for the lock and the tail of the wait grows with
            // every lost race. Anything else (a token) wakes every waiter.
            if (msg.size() > 5 && msg.compare(0, 5, "wake ") == 0) {
              const std::string_view id = std::string_view(msg).substr(5);
              for (auto* x : std::vector<WaiterBase*>(it->second.waiters.begin(), it->second.waiters.end()))
                if (x->waiter_id() == id) x->wake();
              return;
            }
            for (auto* x : std::vector<WaiterBase*>(it->second.waiters.begin(), it->second.waiters.end()))
              x->wake();
          },
          [weak, channel] {
            auto self = weak.lock();
            if (!self) return;
            auto it = self->channels.find(channel);
            if (it == self->channels.end()) return;
            it->second.ready = true;
            it->second.ready_at = self->clock.now();
            // A release between a waiter's attempt and this moment went
            // unheard: every waiter registered so far looks once more.
            for (auto* x : std::vector<WaiterBase*>(it->second.waiters.begin(), it->second.waiters.end()))
              x->wake();
          });
      return Heard::on_ready;
    }
    if (!ch.ready) return Heard::on_ready;
    return ch.ready_at <= sent_at ? Heard::yes : Heard::look_again;
  }

  // Loop thread. `linger`: how long a cluster grant channel is kept once its
  // last waiter leaves (the waiter's queue place may outlive it that long).
  void unwatch(const std::string& channel, WaiterBase* w, std::chrono::milliseconds linger = {}) {
    auto it = channels.find(channel);
    if (it == channels.end()) return;
    Channel& ch = it->second;
    ch.waiters.erase(w);
    if (!ch.waiters.empty()) return;
    if (ch.grants) {
      // Standalone: the one grant channel stays for the service's life.
      if (!sharded) return;
      ch.linger_until = std::max(ch.linger_until, clock.now() + linger);
      drop_idle_grant_channels(channel);
      return;
    }
    // Not kept for the next wait: Redis delivers a message to a channel's
    // subscribers in the order they subscribed, and plain waiters race to the
    // free lock, so a subscription kept across waits made the same workers win
    // every time (`bench --contention`'s shares drift far apart: see
    // docs/bench.md).
    // Subscribing afresh puts the last winner at the back.
    subscriber->unsubscribe(ch.id);
    channels.erase(it);
  }

  // Cluster: the grant channels without waiters whose linger has passed
  // (`keep` excepted: it is about to be used). Swept when a waiter comes or
  // goes, so an idle service keeps at most the channels of its last waits.
  void drop_idle_grant_channels(const std::string& keep) {
    const auto now = clock.now();
    for (auto it = channels.begin(); it != channels.end();) {
      Channel& ch = it->second;
      if (ch.grants && ch.waiters.empty() && ch.linger_until < now && it->first != keep) {
        subscriber->unsubscribe(ch.id);
        it = channels.erase(it);
      } else {
        ++it;
      }
    }
  }
};

namespace {

// One acquire in progress: the I/O shell around detail::WaiterMachine. The
// machine decides (try, listen, sleep, use a grant, give up); this class
// passes the gate, sends the attempts, listens, arms the timer and builds the
// Lock. Lives on the loop thread; kept alive by its own pending operations.
class Waiter final : public LockService::Impl::WaiterBase, public std::enable_shared_from_this<Waiter> {
  using Machine = detail::WaiterMachine;

 public:
  Waiter(std::shared_ptr<LockService> svc, std::string resource, LockOptions opts, LockService::AcquireHandler done)
      : svc_(std::move(svc)),
        clock_(svc_->clock()),
        resource_(std::move(resource)),
        opts_(std::move(opts)),
        done_(std::move(done)),
        m_(Machine::Config{opts_.ttl, opts_.wait, opts_.fair, opts_.backoff_min, opts_.backoff_max}) {}

  void start(LockService::Impl* impl) {
    impl_ = impl;
    confirmation_ = svc_->confirmation_for(opts_);
    const auto& k = svc_->keys();
    key_ = k.lock_key(resource_);
    token_ = make_token(opts_.job_id);
    started_ = clock_.now();
    metrics_ = &svc_->class_metrics(opts_.lock_class);
    if (opts_.permits > 0) {
      // A semaphore permit: always its own script, and a waiter keeps a place
      // in the permits' line under its first token (sem_acquire.lua).
      key_ = k.permit_holders_key(resource_);
      script_keys_ = {key_, k.fence_key(resource_), k.permit_line_key(resource_),
                      k.permit_line_expiry_key(resource_), k.permit_count_key(resource_)};
      if (opts_.wait.count() > 0) waiter_id_ = token_;
      return run(m_.start(started_));
    }
    if (rw()) {
      // A reader or the writer of a read-write lock: the permits' way, with
      // its own scripts and line (rw_acquire.lua).
      key_ = opts_.mode == LockMode::exclusive ? k.rw_writer_key(resource_) : k.rw_readers_key(resource_);
      script_keys_ = {k.rw_readers_key(resource_), k.rw_writer_key(resource_), k.fence_key(resource_),
                      k.rw_line_key(resource_), k.rw_line_expiry_key(resource_), k.rw_writers_line_key(resource_)};
      if (opts_.wait.count() > 0) waiter_id_ = token_;
      return run(m_.start(started_));
    }
    if (opts_.fence || opts_.fair) use_script();
    if (!opts_.fair && opts_.wait.count() > 0) {
      // A default-mode wait goes through acquire.lua from the first attempt:
      // a busy reply puts it in the line in the same step, so no release can
      // come between the two unseen. Its id is its first token (a discarded
      // grant changes the token, not the place).
      use_script();
      script_keys_.push_back(k.waiters_key(resource_));
      waiter_id_ = token_;
      // Our last release of it woke a waiter whose acquire is on its way.
      if (auto y = impl_->take_yield(resource_, started_)) m_.yield_until(*y);
    }
    if (opts_.fair) {
      // What a release needs to hand us the lock: our TTL, whether we want a
      // fence, where to tell us, and who we are (release.lua parses it).
      channel_ = impl_->grant_channel_for(resource_);
      entry_ = fmt::format("{} {} {} {}", opts_.ttl.count(), opts_.fence ? 1 : 0, channel_, token_);
    }
    run(m_.start(started_));
  }

  // acquire.lua's first four keys (a default-mode wait adds its line).
  void use_script() {
    if (!script_keys_.empty()) return;
    const auto& k = svc_->keys();
    script_keys_ = {key_, k.fence_key(resource_), k.queue_key(resource_), k.queue_expiry_key(resource_)};
  }

  void wake() override { run(m_.release_message(clock_.now())); }
  void on_grant(std::optional<std::int64_t> fence) override { run(m_.grant_message(clock_.now(), fence)); }
  const std::string& waiter_id() const noexcept override { return waiter_id_; }

 private:
  bool rw() const noexcept { return opts_.mode != LockMode::mutex; }
  // A semaphore permit or a read-write lock: holders in a zset, a line of
  // its own, renewed by sem_extend.lua with the holder's member.
  bool counted() const noexcept { return opts_.permits > 0 || rw(); }
  std::string member() const { return opts_.permits > 0 ? detail::permit_member(token_, slot_) : token_; }

  static std::uint64_t seed() {
    // Seeded once per thread: a random_device per acquire costs more than the acquire.
    thread_local std::mt19937_64 rng{std::random_device{}()};
    return rng();
  }

  std::chrono::milliseconds waiter_lease() const {
    return std::max<std::chrono::milliseconds>(std::chrono::milliseconds(2000), opts_.backoff_max * 5);
  }

  // Carries out the machine's actions in order. An action that starts I/O
  // comes last in its list, so a completion that runs inline (and feeds the
  // machine again) never interleaves with the rest of a list.
  void run(const Machine::Actions& actions) {
    for (const auto& a : actions) {
      switch (a.kind) {
        case Machine::Action::send_attempt: attempt(); break;
        case Machine::Action::arm_timer: arm(a.at); break;
        case Machine::Action::cancel_timer:
          ++timer_gen_;
          if (timer_) timer_->cancel();
          break;
        case Machine::Action::subscribe: subscribe(); break;
        case Machine::Action::unsubscribe:
          impl_->unwatch(channel_, this, waiter_lease() * 2);
          if (opts_.fair) impl_->granted_by_token.erase(token_);
          break;
        case Machine::Action::discard_grant:
          release_grant();
          // A fresh token, so a late release of this one cannot delete the
          // next grant (with several connections their order is not kept). A
          // fair waiter keeps its token: it names its place in the queue.
          if (!opts_.fair) token_ = make_token(opts_.job_id);
          break;
        case Machine::Action::leave_queue: leave_queue(); break;
        case Machine::Action::abandon: impl_->abandon(token_, waiter_lease() * 2); break;
        case Machine::Action::pass_on_grant: svc_->async_release(resource_, token_, nullptr, opts_.fair); break;
        case Machine::Action::complete: complete(a); break;
      }
    }
  }

  void arm(Machine::time_point at) {
    if (!timer_) timer_.emplace(svc_->client().get_executor());
    // Timers run on the host's steady clock; the machine's instants are the
    // service's clock's, so the wait is what is left by that clock.
    const auto left = at - clock_.now();
    timer_->expires_after(left.count() > 0 ? left : Machine::time_point::duration::zero());
    timer_->async_wait([self = shared_from_this(), gen = ++timer_gen_](boost::system::error_code ec) {
      // A handler already queued when the timer was cancelled or re-armed
      // still runs with success: the generation tells it apart.
      if (ec || gen != self->timer_gen_) return;
      self->run(self->m_.timer_fired(self->clock_.now()));
    });
  }

  // Hands back a grant this waiter will not use (unchecked, unconfirmed).
  void release_grant() {
    if (opts_.permits > 0) {
      impl_->semaphore_calls->release(svc_->keys(), resource_, detail::permit_member(token_, slot_), opts_.permits,
                                      nullptr);
      return;
    }
    if (rw()) return release_rw(svc_->client(), svc_->keys(), resource_, token_, opts_.mode, nullptr);
    svc_->async_release(resource_, token_, nullptr, opts_.fair);
  }

  void subscribe() {
    // Only a waiter that waits sleeps: the jitter is drawn now, and a try-once
    // acquire, the common case, never pays for it. Likewise a plain waiter's
    // channel is built only now.
    m_.seed(seed());
    if (opts_.fair) impl_->granted_by_token[token_] = this;
    else if (opts_.permits > 0) channel_ = svc_->keys().permit_channel(resource_);
    else if (rw()) channel_ = svc_->keys().rw_channel(resource_);
    else channel_ = svc_->keys().channel(resource_);
    const auto heard = impl_->watch(channel_, this, sent_at_, opts_.fair);
    run(m_.subscribed(clock_.now(), heard));
  }

  void leave_queue() {
    // A release may have handed us the lock just now: pass it on.
    std::vector<std::string> keys = {script_keys_[2], script_keys_[3], key_};
    svc_->client().async_eval(script_leave(), std::move(keys), {entry_, token_},
                              [svc = svc_, resource = resource_, token = token_](std::error_code ec, redis::Reply r) {
                                if (!ec && r.is_integer() && r.integer == 1)
                                  svc->async_release(resource, token, nullptr, true);
                              });
  }

  // Every attempt passes the lock-state gate first (lock/quarantine.hpp):
  // usually a few comparisons, a check of the server after a reconnect or
  // every `recheck`, a refusal while the server is in quarantine.
  void attempt() {
    if (auto t = gate_->ready()) {
      ticket_ = std::move(t);
      return send();
    }
    gate_->admit([self = shared_from_this()](std::error_code ec, const std::string& detail,
                                             std::chrono::milliseconds retry_in, detail::StateGate::TicketPtr t) {
      if (self->m_.done()) return;
      if (ec) {
        // Posted: a refusal from the gate's fast path arrives inside
        // async_acquire itself, and a caller's completion must never run
        // before its initiating call returns (a coroutine would be resumed
        // inside its own co_await).
        asio::post(self->svc_->client().get_executor(), [self, ec, detail, retry_in] {
          self->ec_ = ec;
          self->detail_ = detail;
          self->run(self->m_.refused(self->clock_.now(), retry_in));
        });
        return;
      }
      self->ticket_ = std::move(t);
      self->send();
    });
  }

  void failed(std::error_code ec, std::string detail) {
    ec_ = ec;
    detail_ = std::move(detail);
    run(m_.reply(clock_.now(), Machine::Reply::error));
  }

  // A grant from a server the gate did not check (the reply came after a
  // reconnect) may come from one that lost its state: handed back unused
  // (discard_grant) and asked for again through the gate.
  Machine::Reply granted() const {
    return gate_->current(*ticket_) ? Machine::Reply::granted : Machine::Reply::unchecked_grant;
  }

  redis::Confirm confirm() const { return to_confirm(confirmation_, svc_->gate()); }

  // A grant in a reply, with the confirmation pipelined behind it. A grant
  // the gate refuses (unchecked) is handed back by the machine whatever the
  // replicas said; a checked one counts only once enough replicas have it.
  void granted_reply(std::optional<std::int64_t> fence, const redis::Confirmation& c) {
    const auto verdict = granted();
    if (verdict == Machine::Reply::granted && confirmation_.replicas > 0) {
      if (!accept(c, confirm())) return;
      confirmed_ = true;
    }
    run(m_.reply(clock_.now(), verdict, fence));
  }

  // False when the grant was not confirmed and the class is fail-closed: the
  // grant is then released and the acquire fails (told to the machine here).
  bool accept(const redis::Confirmation& c, const redis::Confirm& wanted) {
    if (c.met(wanted)) return true;
    const std::string why = redis::describe(c, wanted);
    if (confirmation_.on_unconfirmed == Unconfirmed::warn) {
      warn_line(svc_->client(), fmt::format("grant of {} on {} kept although not confirmed: {} (lock class '{}', "
                                            "on_unconfirmed=warn: a failover may grant it again)",
                                            key_, svc_->client().address(), why, opts_.lock_class));
      return true;
    }
    release_grant();
    if (!opts_.fair) token_ = make_token(opts_.job_id);
    failed(make_error_code(errc::server_busy), fmt::format("grant not confirmed by replicas: {}; released", why));
    return false;
  }

  void busy() {
    metrics_->busy_total.inc();
    run(m_.reply(clock_.now(), Machine::Reply::busy));
  }

  // A semaphore permit or a reader / the writer of a read-write lock: their
  // scripts take the same arguments but the fourth and answer alike.
  void send_permit() {
    const bool may_wait = opts_.wait.count() > 0;
    auto on_reply = [self = shared_from_this(), may_wait](std::error_code ec, redis::Reply r, redis::Confirmation c) {
      if (ec) return self->failed(ec, std::move(r.str));
      if (!r.is_array() || r.elements.size() < 3 || !r.elements[0].is_integer())
        return self->failed(make_error_code(errc::protocol_error),
                            std::string(self->rw() ? "unexpected reply to the read-write lock's acquire script: "
                                                   : "unexpected reply to the semaphore acquire script: ") +
                                to_debug_string(r));
      const auto& e = r.elements;
      if (e[0].integer == -1) {
        self->gate_->invalidate();
        return self->run(self->m_.reply(self->clock_.now(), Machine::Reply::retry));
      }
      if (e[0].integer == 1 && e.size() >= 4) {
        std::optional<std::int64_t> fence;
        if (e[1].integer >= 0) fence = e[1].integer;
        self->slot_ = static_cast<int>(e[2].integer);
        self->granted_permits_ = static_cast<int>(e[3].integer);
        return self->granted_reply(fence, c);
      }
      // In the line from now (the script put us there): a release wakes
      // us by name when a permit is ours, so polling only refreshes the
      // place and notices a lease that ended without a release.
      if (may_wait) {
        self->arrival_ = "in line";
        self->m_.in_line();
      }
      self->busy();
    };
    if (rw()) {
      std::vector<std::string> args = {token_,
                                       std::to_string(opts_.ttl.count()),
                                       opts_.fence ? "1" : "0",
                                       opts_.mode == LockMode::exclusive ? "w" : "r",
                                       may_wait ? "1" : "0",
                                       std::to_string(waiter_lease().count()),
                                       ticket_->evicted_for(key_),
                                       waiter_id_};
      svc_->client().async_eval_confirmed(detail::rw_acquire_script(), script_keys_, std::move(args), confirm(),
                                          std::move(on_reply));
      return;
    }
    // Coalesced with this turn's other attempts on the resource (SemaphoreCalls).
    std::vector<std::string> item = {token_,
                                     std::to_string(opts_.ttl.count()),
                                     opts_.fence ? "1" : "0",
                                     may_wait ? "1" : "0",
                                     std::to_string(waiter_lease().count()),
                                     waiter_id_};
    impl_->semaphore_calls->acquire(script_keys_, opts_.permits, ticket_->evicted_for(key_), confirm(), std::move(item),
                                    std::move(on_reply));
  }

  void send() {
    sent_at_ = clock_.now();
    m_.sent(sent_at_);
    if (counted()) return send_permit();
    auto self = shared_from_this();
    const bool may_wait = opts_.wait.count() > 0;
    if (script_keys_.empty() && ticket_->evicted_for(key_).empty()) {
      // The plain form other clients (ioredis, node-redlock, Laravel) use too.
      redis::Command cmd{"SET", key_, token_, "NX", "PX", std::to_string(opts_.ttl.count())};
      svc_->client().async_exec_confirmed(
          std::move(cmd), confirm(), [self](std::error_code ec, redis::Reply r, redis::Confirmation c) {
            if (ec) return self->failed(ec, std::move(r.str));
            if (r.is_ok()) return self->granted_reply(std::nullopt, c);
            self->busy();
          });
      return;
    }
    // A server that evicts keys: the grant goes through acquire.lua, which
    // refuses it if anything was evicted since the gate's check.
    use_script();
    std::vector<std::string> args = {token_,
                                     std::to_string(opts_.ttl.count()),
                                     opts_.fence ? "1" : "0",
                                     opts_.fair ? "1" : "0",
                                     may_wait ? "1" : "0",
                                     std::to_string(waiter_lease().count()),
                                     entry_,
                                     ticket_->script_evicted_for(key_),
                                     waiter_id_,
                                     arrival_};
    // The grant carries the server's clock: a grant that reveals a step is
    // beside a holder whose key the step expired, and is handed back.
    const bool clock = gate_->watches_clock();
    if (clock) args.emplace_back("1");
    const auto steady_sent = std::chrono::steady_clock::now();
    svc_->client().async_eval_confirmed(
        script_acquire(), script_keys_, std::move(args), confirm(),
        [self, clock, steady_sent](std::error_code ec, redis::Reply r, redis::Confirmation c) {
          if (ec) return self->failed(ec, std::move(r.str));
          if (!r.is_array() || r.elements.size() < 2 || !r.elements[0].is_integer())
            return self->failed(make_error_code(errc::protocol_error),
                                "unexpected reply to the acquire script: " + to_debug_string(r));
          if (r.elements[0].integer == -1) {
            // Keys were evicted since the gate's check: check again (that
            // starts a quarantine for every client of the server).
            self->gate_->invalidate();
            return self->run(self->m_.reply(self->clock_.now(), Machine::Reply::retry));
          }
          if (r.elements[0].integer == 1) {
            if (clock && r.elements.size() > 2 && r.elements[2].is_integer())
              self->gate_->clock_sample(r.elements[2].integer, steady_sent, std::chrono::steady_clock::now());
            std::optional<std::int64_t> fence;
            if (r.elements[1].integer >= 0) fence = r.elements[1].integer;
            return self->granted_reply(fence, c);
          }
          // In the line: the arrival it was given keeps its place if a
          // release wakes it and a newcomer wins the race.
          if (r.elements.size() > 2 && r.elements[2].is_string()) {
            self->arrival_ = r.elements[2].str;
            self->m_.in_line();
          }
          self->busy();
        });
  }

  // A grant that did not come with a confirmed reply (a fair handoff by
  // another client's release, a grant message) is confirmed from here: a
  // compare-and-pexpire of our own, then WAIT on the same connection. WAIT
  // covers only what its connection wrote, and the handoff was written by
  // the releaser's; the pexpire comes after it in the replication stream,
  // so replicas that acknowledged it have the handoff too.
  void confirm_then_complete(Machine::Action a) {
    // The machine is done: nothing it armed may fire into it meanwhile.
    ++timer_gen_;
    if (timer_) timer_->cancel();
    const std::string ttl = std::to_string(opts_.ttl.count());
    const auto wanted = confirm();
    const std::string held = member();
    svc_->client().async_eval_views_confirmed(
        counted() ? detail::sem_extend_script() : script_extend(), {key_}, {held, ttl}, wanted,
        [self = shared_from_this(), a, wanted](std::error_code ec, redis::Reply r, redis::Confirmation c) mutable {
          if (ec) {
            self->release_grant();
            self->ec_ = ec;
            self->detail_ = std::move(r.str);
            return self->complete_failed();
          }
          if (!r.is_integer() || r.integer != 1) {
            self->ec_ = make_error_code(errc::lease_lost);
            self->detail_ = "the lock handed to this waiter was gone before replicas could confirm it";
            return self->complete_failed();
          }
          if (!c.met(wanted)) {
            if (self->confirmation_.on_unconfirmed == Unconfirmed::fail_closed) {
              self->release_grant();
              self->ec_ = make_error_code(errc::server_busy);
              self->detail_ = fmt::format("grant not confirmed by replicas: {}; released", redis::describe(c, wanted));
              return self->complete_failed();
            }
            self->accept(c, wanted);  // warns
          }
          self->confirmed_ = true;
          self->complete(a);
        });
  }

  void leave_line() {
    if (opts_.permits > 0) {
      // Both the place and its liveness entry, or a release wakes a waiter
      // that is gone and the permit idles until the entry expires.
      svc_->client().async_exec(redis::Command{"ZREM", script_keys_[2], waiter_id_}, [](std::error_code, redis::Reply) {});
      svc_->client().async_exec(redis::Command{"ZREM", script_keys_[3], waiter_id_}, [](std::error_code, redis::Reply) {});
    } else if (rw()) {
      // Likewise, and a writer's entry among the writers: left behind, it
      // would keep new readers out until its place expired.
      for (std::size_t i = 3; i < 6; ++i)
        svc_->client().async_exec(redis::Command{"ZREM", script_keys_[i], waiter_id_},
                                  [](std::error_code, redis::Reply) {});
    } else {
      svc_->client().async_exec(redis::Command{"ZREM", script_keys_.back(), waiter_id_},
                                [](std::error_code, redis::Reply) {});
    }
    arrival_.clear();
  }

  void complete_failed() {
    if (timer_) timer_->cancel();
    if (!arrival_.empty()) leave_line();
    auto done = std::move(done_);
    metrics_->redis_errors_total.inc();
    done(redis::to_error(ec_, redis::Reply::error_reply(std::move(detail_)), svc_->client().address(),
                         "acquire of " + key_),
         std::nullopt);
  }

  void complete(const Machine::Action& a) {
    if (a.result == Machine::Result::granted && confirmation_.replicas > 0 && !confirmed_)
      return confirm_then_complete(a);
    if (timer_) timer_->cancel();
    // Gave up, failed or was cancelled in line: leave it, or the next release
    // wakes nobody and the next waiter waits out its own backoff.
    if (a.result != Machine::Result::granted && !arrival_.empty()) leave_line();
    auto done = std::move(done_);
    if (a.result == Machine::Result::failed) {
      metrics_->redis_errors_total.inc();
      return done(redis::to_error(ec_, redis::Reply::error_reply(std::move(detail_)), svc_->client().address(),
                                  "acquire of " + key_),
                  std::nullopt);
    }
    metrics_->wait_seconds.observe(clock_.now() - started_);
    // Counted with the wait histogram (whose count is the acquire calls), so
    // contended / calls is the fleet's contention rate.
    if (m_.saw_busy()) metrics_->contended_total.inc();
    // Busy for the whole wait (or cancelled: the machine handed back any grant).
    if (a.result != Machine::Result::granted) return done(Error(), std::nullopt);
    metrics_->acquisitions_total.inc();
    // The waiter is finished: its strings move into the Lock, no copies.
    std::string epoch = ticket_ ? ticket_->epoch_for(key_) : std::string();
    auto lock = svc_->make_lock(std::move(resource_), std::move(key_), std::move(token_), a.fence(), opts_, a.at,
                                std::move(epoch), granted_permits_, slot_);
    done(Error(), std::move(lock));
  }

  std::shared_ptr<LockService> svc_;
  const MonotonicClock& clock_;
  std::shared_ptr<detail::StateGate> gate_ = std::static_pointer_cast<detail::StateGate>(svc_->gate());
  detail::StateGate::TicketPtr ticket_;  // the gate's check the attempt in flight went out under
  LockService::Impl* impl_ = nullptr;
  std::string resource_;
  LockOptions opts_;
  LockService::AcquireHandler done_;
  Machine m_;
  // Only a waiter that has to wait needs a timer: try-once acquires skip it.
  std::optional<asio::steady_timer> timer_;
  std::uint64_t timer_gen_ = 0;
  std::string key_, token_, channel_, entry_;
  std::string waiter_id_, arrival_;  // default-mode wait: its place in the line (acquire.lua)
  std::vector<std::string> script_keys_;
  MonotonicClock::time_point started_, sent_at_;
  observe::LockClassMetrics* metrics_ = nullptr;
  std::error_code ec_;  // the failure complete(failed) reports
  std::string detail_;
  ReplicaConfirmation confirmation_;
  bool confirmed_ = false;  // the grant delivered came with enough acknowledgements
  int slot_ = -1, granted_permits_ = 0;  // a permit's grant (sem_acquire.lua)
};

}  // namespace

namespace {
// The exception a blocking call rethrows on the caller's thread, with a text
// of its own: copies of an Error share their text, and the loop thread drops
// its copy after the handler that fulfils the promise returns. Sharing it,
// the caller's thread and the loop race to free it as far as TSan can see
// (tests/tsan_suppressions.cpp); unshared, each frees its own.
std::exception_ptr caller_exception(const Error& e) {
  return std::make_exception_ptr(Error(e.code(), std::string(e.detail()), e.source()));
}
}  // namespace

LockService::LockService(redis::Client& client, LockServiceOptions o)
    : client_(client),
      clock_(o.clock ? o.clock : &MonotonicClock::steady()),
      registry_(o.metrics ? o.metrics : &observe::Registry::global()),
      keys_(std::move(o.keys)),
      max_ttl_(o.quarantine.max_ttl.count() > 0 ? o.quarantine.max_ttl : client.options().lock_max_ttl),
      impl_(std::make_shared<Impl>(client, keys_, *clock_)) {
  if (max_ttl_ < std::chrono::milliseconds(10))
    throw Error(errc::invalid_argument, fmt::format("max TTL {} ms is below the 10 ms minimum", max_ttl_.count()));
  if (o.quarantine.recheck.count() <= 0) throw Error(errc::invalid_argument, "quarantine recheck must be positive");
  if (o.quarantine.clock_probe.count() < 0)
    throw Error(errc::invalid_argument, "quarantine clock_probe must not be negative");
  gate_ = std::make_shared<detail::StateGate>(client, max_ttl_, o.quarantine.recheck, *clock_, o.quarantine.clock_probe);
}

observe::LockClassMetrics& LockService::class_metrics(const std::string& lock_class) const {
  // The registry lookup takes a shared lock and a map search; a service almost
  // always asks for the same class again, so it remembers the last one. Per
  // service, not per thread: a thread-local cache keyed by the registry's
  // address would hand out a dead registry's metrics when a new registry
  // (a test's) is allocated where an old one was.
  auto& im = *impl_;
  if (im.last_metrics == nullptr || im.last_class != lock_class) {
    im.last_metrics = &registry_->lock_class(lock_class);
    im.last_class = lock_class;
  }
  return *im.last_metrics;
}

LockService::~LockService() {
  // The subscriber posts its own shutdown to the loop; nothing else to undo:
  // waiters hold a shared_ptr to us, so none is left when we die.
}

std::shared_ptr<LockService> LockService::create(redis::Client& client, KeyBuilder keys, QuarantineOptions q) {
  return create(client, LockServiceOptions{.keys = std::move(keys), .quarantine = q});
}

std::shared_ptr<LockService> LockService::create(redis::Client& client, LockServiceOptions options) {
  return std::shared_ptr<LockService>(new LockService(client, std::move(options)));
}


Lock LockService::make_lock(std::string resource, std::string key, std::string token,
                            std::optional<std::int64_t> fence, const LockOptions& opts,
                            MonotonicClock::time_point sent_at,
                            std::string epoch, int permits, int slot) {
  Lock l;
  l.permits_ = permits;
  l.slot_ = slot;
  l.mode_ = opts.mode;
  l.service_ = shared_from_this();
  l.resource_ = std::move(resource);
  l.key_ = std::move(key);
  l.token_ = std::move(token);
  l.lock_class_ = opts.lock_class;
  l.metrics_ = &class_metrics(opts.lock_class);
  l.fence_ = fence;
  l.fair_ = opts.fair;
  l.ttl_ = opts.ttl;
  // The TTL started when the server ran SET, which is after we sent it: the
  // send time is the conservative start of the lease.
  l.acquired_at_ = sent_at;
  l.held_ = true;
  l.epoch_ = std::move(epoch);
  l.confirmation_ = confirmation_for(opts);
  return l;
}

void LockService::check_options(const LockOptions& opts) const {
  if (opts.permits < 0 || opts.permits > LockOptions::kMaxPermits)
    throw Error(errc::invalid_argument,
                fmt::format("permit count {} is outside 0..{}", opts.permits, LockOptions::kMaxPermits));
  if (opts.permits > 0 && opts.fair)
    throw Error(errc::invalid_argument, "fair mode is for a mutex: semaphore permits are always served in order");
  if (opts.mode != LockMode::mutex && opts.mode != LockMode::shared && opts.mode != LockMode::exclusive)
    throw Error(errc::invalid_argument, fmt::format("lock mode {} is not mutex, shared or exclusive",
                                                    static_cast<int>(opts.mode)));
  if (opts.mode != LockMode::mutex && opts.permits > 0)
    throw Error(errc::invalid_argument, fmt::format("lock mode {} (a read-write lock) does not go with permits {} (a "
                                                    "semaphore)",
                                                    to_string(opts.mode), opts.permits));
  if (opts.mode != LockMode::mutex && opts.fair)
    throw Error(errc::invalid_argument,
                "fair mode is for a mutex: a read-write lock's line is always served in order");
  if (opts.ttl < std::chrono::milliseconds(10))
    throw Error(errc::invalid_argument, fmt::format("lock ttl {} ms is below the 10 ms minimum", opts.ttl.count()));
  if (opts.wait.count() < 0) throw Error(errc::invalid_argument, "negative wait");
  // A lease longer than the quarantine could outlive it (docs/lock-safety.md).
  if (opts.ttl > max_ttl_)
    throw Error(errc::invalid_argument,
                fmt::format("lock ttl {} ms is above the max TTL {} ms (the `max_ttl` URL option / "
                            "QuarantineOptions::max_ttl): a quarantine after lost lock state would not cover it",
                            opts.ttl.count(), max_ttl_.count()));
}

void LockService::async_acquire(std::string resource, LockOptions opts, AcquireHandler done) {
  // Validate on the caller's thread so bad input throws where it was written.
  KeyBuilder::validate_resource(resource);
  check_options(opts);
  // Try-once on a client known to be down: the answer is known now, and
  // waiting out the command timeout for it helps nobody (a caller that
  // wants to ride out a reconnect passes a wait). Answered from the loop,
  // posted (never inside this call), and looked at again there: a client
  // that came back meanwhile tries after all.
  if (opts.wait.count() == 0 && client_.down_error()) {
    asio::post(client_.get_executor(), [self = shared_from_this(), resource = std::move(resource),
                                        opts = std::move(opts), done = std::move(done)]() mutable {
      if (Error down = self->client_.down_error(); down) {
        self->class_metrics(opts.lock_class).redis_errors_total.inc();
        return done(down.with_context("acquire of " + self->keys_.lock_key(resource)), std::nullopt);
      }
      std::make_shared<Waiter>(self, std::move(resource), std::move(opts), std::move(done))->start(self->impl_.get());
    });
    return;
  }
  auto w = std::make_shared<Waiter>(shared_from_this(), std::move(resource), std::move(opts), std::move(done));
  // On the loop already (a coroutine, a completion): start now, saving a hop.
  if (client_.running_in_loop_thread()) w->start(impl_.get());
  else asio::post(client_.get_executor(), [w, impl = impl_.get()] { w->start(impl); });
}

Error LockService::subscriber_error() const {
  std::lock_guard g(impl_->sub_error_mu);
  return impl_->sub_error;
}

std::optional<Lock> LockService::acquire(std::string_view resource, const LockOptions& opts) {
  if (client_.running_in_loop_thread())
    throw Error(errc::invalid_argument, "blocking acquire on the event-loop thread would deadlock");
  // Try-once on a client known to be down: answered on this thread, without
  // a trip through the loop (async_acquire's check, for the blocking form).
  if (opts.wait.count() == 0) {
    if (Error down = client_.down_error(); down) {
      const std::string key = keys_.lock_key(resource);  // a malformed resource is still invalid_argument
      // The registry itself: class_metrics() caches on the loop thread only.
      registry_->lock_class(opts.lock_class).redis_errors_total.inc();
      throw down.with_context("acquire of " + key);
    }
  }
  std::promise<std::optional<Lock>> p;
  auto f = p.get_future();
  async_acquire(std::string(resource), opts, [&p](const Error& e, std::optional<Lock> l) {
    if (e) p.set_exception(caller_exception(e));
    else p.set_value(std::move(l));
  });
  return f.get();
}

void LockService::async_release(const std::string& resource, const std::string& token,
                                ReleaseHandler done, bool fair) {
  if (fair) return release_lock(client_, keys_, resource, token, std::move(done), true);
  // The reply may come after the service is gone (a Lock released as its
  // last owner drops it): the Impl is held weakly.
  release_lock(client_, keys_, resource, token, std::move(done), false,
               [impl = std::weak_ptr<Impl>(impl_), resource, sent = clock_->now()]() {
                 if (auto im = impl.lock()) im->woke_waiter(resource, sent, im->clock.now());
               });
}

ReplicaConfirmation LockService::confirmation_for(const LockOptions& opts) const {
  ReplicaConfirmation c;
  c.replicas = opts.replicas >= 0 ? opts.replicas : client_.options().lock_replicas;
  c.timeout = opts.replicas_timeout.count() > 0 ? opts.replicas_timeout : client_.options().lock_replicas_timeout;
  c.on_unconfirmed = opts.on_unconfirmed;
  return c;
}

namespace {
// Compare-and-pexpire by `script` (a lock's extend.lua, a permit's
// sem_extend.lua), confirmed by replicas when asked.
void extend_with(redis::Client& client_, const std::shared_ptr<void>& gate, const redis::Script& script,
                 const std::string& key, const std::string& token, std::chrono::milliseconds ttl,
                 LockService::ReleaseHandler done, ReplicaConfirmation confirmation) {
  const std::string ms = std::to_string(ttl.count());
  const redis::Confirm wanted = to_confirm(confirmation, gate);
  client_.async_eval_views_confirmed(
      script, {key}, {token, ms}, wanted,
      [done = std::move(done), c = &client_, wanted, policy = confirmation.on_unconfirmed, key](
          std::error_code ec, redis::Reply r, redis::Confirmation conf) {
        if (!done) return;
        if (ec) return done(redis::to_error(ec, r, c->address(), "extend"), false);
        const bool ours = r.is_integer() && r.integer == 1;
        if (ours && !conf.met(wanted)) {
          const std::string why = redis::describe(conf, wanted);
          if (policy == Unconfirmed::fail_closed)
            return done(Error(errc::server_busy,
                              fmt::format("extend of {} on {}: not confirmed by replicas: {}", key, c->address(), why),
                              error_source::redis),
                        false);
          warn_line(*c, fmt::format("extension of {} on {} counted although not confirmed: {} (on_unconfirmed=warn)",
                                    key, c->address(), why));
        }
        done(Error(), ours);
      });
}

}  // namespace

void LockService::async_extend(const std::string& resource, const std::string& token, std::chrono::milliseconds ttl,
                               ReleaseHandler done, ReplicaConfirmation confirmation) {
  extend_with(client_, gate_, script_extend(), keys_.lock_key(resource), token, ttl, std::move(done), confirmation);
}

void LockService::async_release_held(const Lock& l, ReleaseHandler done) {
  if (l.permits() > 0)
    return impl_->semaphore_calls->release(keys_, l.resource(), detail::permit_member(l.token(), l.permit_slot()),
                                           l.permits(), std::move(done));
  if (l.mode() != LockMode::mutex) return release_rw(client_, keys_, l.resource(), l.token(), l.mode(), std::move(done));
  async_release(l.resource(), l.token(), std::move(done), l.fair());
}

void LockService::async_extend_held(const Lock& l, std::chrono::milliseconds ttl, ReleaseHandler done) {
  if (l.permits() > 0)
    return extend_with(client_, gate_, detail::sem_extend_script(), l.key(),
                       detail::permit_member(l.token(), l.permit_slot()), ttl, std::move(done), l.confirmation());
  if (l.mode() != LockMode::mutex)
    return extend_with(client_, gate_, detail::sem_extend_script(), l.key(), l.token(), ttl, std::move(done),
                       l.confirmation());
  async_extend(l.resource(), l.token(), ttl, std::move(done), l.confirmation());
}


void LockService::async_extend_many(const std::vector<ExtendEntry>& entries, ExtendManyHandler done) {
  // Views wherever the caller has the string; what must be built (a key from
  // a resource, a TTL as text) is built once into storage reserved up front,
  // so no view into it moves.
  const std::size_t n = entries.size();
  std::vector<std::string> built;
  built.reserve(n * 2);
  std::vector<std::string_view> keys, args;
  keys.reserve(n);
  args.reserve(n * 2);
  std::chrono::milliseconds last_ttl{-1};
  std::string_view ttl_text;
  for (const auto& e : entries) {
    if (!e.key.empty()) {
      keys.push_back(e.key);
    } else {
      built.push_back(keys_.lock_key(e.resource));
      keys.push_back(built.back());
    }
    args.push_back(e.token);
    if (e.ttl != last_ttl) {
      built.push_back(std::to_string(e.ttl.count()));
      ttl_text = built.back();
      last_ttl = e.ttl;
    }
    args.push_back(ttl_text);
  }
  client_.async_eval_views(script_extend_many(), std::span<const std::string_view>(keys),
                           std::span<const std::string_view>(args),
                     [done = std::move(done), c = &client_, n](std::error_code ec, redis::Reply r) {
                       if (!done) return;
                       if (ec) return done(redis::to_error(ec, r, c->address(), "extend"), {});
                       if (!r.is_array() || r.elements.size() != n)
                         return done(Error(errc::protocol_error,
                                           fmt::format("{}: extend of {} locks: unexpected reply", c->address(), n)),
                                     {});
                       std::vector<bool> ours(n);
                       for (std::size_t i = 0; i < n; ++i)
                         ours[i] = r.elements[i].is_integer() && r.elements[i].integer == 1;
                       done(Error(), std::move(ours));
                     });
}

// --- Lock ---------------------------------------------------------------------

Lock::Lock(Lock&& o) noexcept
    : service_(std::move(o.service_)),
      resource_(std::move(o.resource_)),
      key_(std::move(o.key_)),
      token_(std::move(o.token_)),
      lock_class_(std::move(o.lock_class_)),
      fence_(o.fence_),
      metrics_(o.metrics_),
      fair_(o.fair_),
      ttl_(o.ttl_),
      acquired_at_(o.acquired_at_),
      held_(o.held_),
      epoch_(std::move(o.epoch_)),
      confirmation_(o.confirmation_),
      permits_(o.permits_),
      slot_(o.slot_),
      mode_(o.mode_) {
  o.held_ = false;
}

Lock& Lock::operator=(Lock&& o) noexcept {
  if (this != &o) {
    if (held_ && service_) service_->async_release_held(*this, nullptr);
    service_ = std::move(o.service_);
    resource_ = std::move(o.resource_);
    key_ = std::move(o.key_);
    token_ = std::move(o.token_);
    lock_class_ = std::move(o.lock_class_);
    fence_ = o.fence_;
    metrics_ = o.metrics_;
    fair_ = o.fair_;
    ttl_ = o.ttl_;
    acquired_at_ = o.acquired_at_;
    held_ = o.held_;
    epoch_ = std::move(o.epoch_);
    confirmation_ = o.confirmation_;
    permits_ = o.permits_;
    slot_ = o.slot_;
    mode_ = o.mode_;
    o.held_ = false;
  }
  return *this;
}

Lock::~Lock() {
  // Scope exit is release; fire and forget so a destructor never blocks. If
  // it cannot reach Redis the TTL frees the lock.
  if (held_ && service_) {
    metrics_->hold_seconds.observe(service_->clock().now() - acquired_at_);
    service_->async_release_held(*this, [m = metrics_](const Error& e, bool ours) {
      if (e) m->redis_errors_total.inc();
      else (ours ? m->releases_total : m->released_not_owner_total).inc();
    });
  }
}

namespace {
// A Lock no longer held answers false, posted like every other answer.
void answer_not_held(const std::shared_ptr<LockService>& service, Lock::Handler done) {
  asio::post(service ? service->client().get_executor() : asio::any_io_executor(asio::system_executor()),
             [done = std::move(done)] {
               if (done) done(Error(), false);
             });
}
}  // namespace

void Lock::async_release(Handler done) {
  if (!held_) return answer_not_held(service_, std::move(done));
  held_ = false;
  metrics_->hold_seconds.observe(service_->clock().now() - acquired_at_);
  service_->async_release_held(*this, [done = std::move(done), m = metrics_, key = key_](const Error& e, bool ours) {
    if (e) m->redis_errors_total.inc();
    else (ours ? m->releases_total : m->released_not_owner_total).inc();
    if (done) done(e ? e.with_context(key) : e, ours);
  });
}

void Lock::async_extend(std::chrono::milliseconds ttl, Handler done) {
  if (!held_) return answer_not_held(service_, std::move(done));
  if (ttl.count() == 0) ttl = ttl_;
  service_->async_extend_held(*this, ttl, [done = std::move(done), key = key_](const Error& e, bool ours) {
    if (done) done(e ? e.with_context(key) : e, ours);
  });
}

namespace {
// The blocking forms wait for a reply only the event loop can deliver.
void refuse_on_loop(const std::shared_ptr<LockService>& service, const char* what) {
  if (service && service->client().running_in_loop_thread())
    throw Error(errc::invalid_argument,
                fmt::format("blocking Lock::{0}() on the event-loop thread would deadlock; use Lock::async_{0}() "
                            "or jobguard::async_{0}(lock, token) (docs/async.md)",
                            what));
}

bool wait_for(const std::function<void(Lock::Handler)>& start) {
  std::promise<bool> p;
  auto f = p.get_future();
  start([&p](const Error& e, bool ours) {
    if (e) p.set_exception(caller_exception(e));
    else p.set_value(ours);
  });
  return f.get();
}
}  // namespace

bool Lock::release() {
  if (!held_) return false;
  refuse_on_loop(service_, "release");
  return wait_for([this](Handler h) { async_release(std::move(h)); });
}

bool Lock::extend(std::chrono::milliseconds ttl) {
  if (!held_) return false;
  refuse_on_loop(service_, "extend");
  return wait_for([this, ttl](Handler h) { async_extend(ttl, std::move(h)); });
}

}  // namespace jobguard
