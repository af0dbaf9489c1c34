// A LockService's calls: acquire (handed to a waiter, waiter_shell.cpp),
// release, extend, and the scripts behind them (service_impl.hpp).
#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <cstdio>
#include <future>
#include <span>

#include "jobguard/observe/metrics.hpp"
#include "lock/quarantine.hpp"
#include "lock/service_impl.hpp"

namespace jobguard {
namespace lock_scripts {
extern const std::string_view acquire;
extern const std::string_view release;
extern const std::string_view extend;
extern const std::string_view extend_many;
extern const std::string_view leave_queue;
}  // namespace lock_scripts

namespace asio = boost::asio;

namespace detail {
const redis::Script& lock_acquire_script() {
  static const redis::Script s{std::string(lock_scripts::acquire)};
  return s;
}
const redis::Script& lock_extend_script() {
  static const redis::Script s{std::string(lock_scripts::extend)};
  return s;
}
const redis::Script& lock_leave_script() {
  static const redis::Script s{std::string(lock_scripts::leave_queue)};
  return s;
}
}  // namespace detail

namespace {
const redis::Script& script_extend_many() {
  static const redis::Script s{std::string(lock_scripts::extend_many)};
  return s;
}
}  // namespace

const redis::Script& lock_release_script() {
  static const redis::Script s{std::string(lock_scripts::release)};
  return s;
}

namespace detail {
void warn_line(redis::Client& client, const std::string& line) {
  if (client.options().on_warning) client.options().on_warning(line);
  else std::fprintf(stderr, "jobguard: warning: %s\n", line.c_str());
}

redis::Confirm to_confirm(const ReplicaConfirmation& c, const std::shared_ptr<void>& gate) {
  redis::Confirm r;
  r.replicas = c.replicas;
  r.timeout = c.timeout;
  r.waitaof = c.replicas > 0 && gate && static_cast<const detail::StateGate*>(gate.get())->waitaof();
  return r;
}

void release_lock(redis::Client& client, const KeyBuilder& keys, const std::string& resource,
                  const std::string& token, LockService::ReleaseHandler done, bool fair,
                  std::function<void()> woke) {
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
}  // namespace detail

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
      detail::start_waiter(detail::make_waiter(self, std::move(resource), std::move(opts), std::move(done)), self->impl_.get());
    });
    return;
  }
  auto w = detail::make_waiter(shared_from_this(), std::move(resource), std::move(opts), std::move(done));
  // On the loop already (a coroutine, a completion): start now, saving a hop.
  if (client_.running_in_loop_thread()) detail::start_waiter(w, impl_.get());
  else asio::post(client_.get_executor(), [w, impl = impl_.get()] { detail::start_waiter(w, impl); });
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
    if (e) p.set_exception(detail::caller_exception(e));
    else p.set_value(std::move(l));
  });
  return f.get();
}

void LockService::async_release(const std::string& resource, const std::string& token,
                                ReleaseHandler done, bool fair) {
  if (fair) return detail::release_lock(client_, keys_, resource, token, std::move(done), true);
  // The reply may come after the service is gone (a Lock released as its
  // last owner drops it): the Impl is held weakly.
  detail::release_lock(client_, keys_, resource, token, std::move(done), false,
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
  const redis::Confirm wanted = detail::to_confirm(confirmation, gate);
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
          detail::warn_line(*c, fmt::format("extension of {} on {} counted although not confirmed: {} (on_unconfirmed=warn)",
                                    key, c->address(), why));
        }
        done(Error(), ours);
      });
}

}  // namespace

void LockService::async_extend(const std::string& resource, const std::string& token, std::chrono::milliseconds ttl,
                               ReleaseHandler done, ReplicaConfirmation confirmation) {
  extend_with(client_, gate_, detail::lock_extend_script(), keys_.lock_key(resource), token, ttl, std::move(done), confirmation);
}

void LockService::async_release_held(const Lock& l, ReleaseHandler done) {
  if (l.permits() > 0)
    return impl_->semaphore_calls->release(keys_, l.resource(), detail::permit_member(l.token(), l.permit_slot()),
                                           l.permits(), std::move(done));
  if (l.mode() != LockMode::mutex)
    return impl_->semaphore_calls->release_rw(keys_, l.resource(), l.token(), l.mode(), std::move(done));
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

}  // namespace jobguard
