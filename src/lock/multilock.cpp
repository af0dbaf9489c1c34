#include "jobguard/multilock.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <future>
#include <memory>
#include <random>

#include "jobguard/observe/metrics.hpp"
#include "jobguard/redis/client.hpp"
#include "lock/quarantine.hpp"

namespace jobguard {
namespace lock_scripts {
extern const std::string_view acquire_all;
}

namespace asio = boost::asio;
using ms = std::chrono::milliseconds;

const Lock* MultiLock::find(std::string_view resource) const noexcept {
  for (const auto& l : locks_)
    if (l.resource() == resource) return &l;
  return nullptr;
}

std::optional<std::int64_t> MultiLock::fence(std::string_view resource) const noexcept {
  const Lock* l = find(resource);
  return l ? l->fence() : std::nullopt;
}

bool MultiLock::held() const noexcept {
  return !locks_.empty() && std::all_of(locks_.begin(), locks_.end(), [](const Lock& l) { return l.held(); });
}

bool MultiLock::release() {
  bool all = true;
  std::optional<Error> first;
  for (auto& l : locks_) {
    try {
      all = l.release() && all;
    } catch (const Error& e) {
      all = false;
      if (!first) first = e;
    }
  }
  if (first) throw *first;
  return all;
}

namespace {

// Completes `done` once every one of `n` answers has come in: (the first
// Error, whether every answer said ours).
struct Joined {
  Joined(std::size_t n, std::function<void(const Error&, bool)> d) : left(n), done(std::move(d)) {}
  void answer(const Error& e, bool ours) {
    if (e && !first) first = e;
    all = all && ours && !e;
    if (--left == 0 && done) done(first ? *first : Error(), all);
  }
  std::size_t left;
  std::function<void(const Error&, bool)> done;
  std::optional<Error> first;
  bool all = true;
};

}  // namespace

void MultiLock::async_release(std::function<void(const Error&, bool)> done) {
  if (locks_.empty()) {
    // Nothing to release: still answered on an executor, never inside the call.
    asio::post(asio::system_executor(), [done = std::move(done)] {
      if (done) done(Error(), false);
    });
    return;
  }
  auto j = std::make_shared<Joined>(locks_.size(), std::move(done));
  for (auto& l : locks_) l.async_release([j](const Error& e, bool ours) { j->answer(e, ours); });
}

std::vector<std::string> canonical_resources(const LockService& service, std::vector<std::string> resources,
                                             const LockOptions& opts) {
  if (resources.empty()) throw Error(errc::invalid_argument, "acquire_all: no resource given");
  if (opts.permits != 0)
    throw Error(errc::invalid_argument, "acquire_all: permits are for one resource's semaphore, not a multi-lock");
  if (opts.fair)
    throw Error(errc::invalid_argument,
                "acquire_all: fair mode queues on one resource; a multi-lock retries with backoff instead");
  for (const auto& r : resources) KeyBuilder::validate_resource(r);
  service.check_options(opts);
  std::sort(resources.begin(), resources.end());
  if (auto d = std::adjacent_find(resources.begin(), resources.end()); d != resources.end())
    throw Error(errc::invalid_argument, fmt::format("acquire_all: resource \"{}\" named twice", *d));
  return resources;
}

namespace {

const redis::Script& script_acquire_all() {
  static const redis::Script s{std::string(lock_scripts::acquire_all)};
  return s;
}

// One acquire_all on the event loop. On one server, or for a cluster's keys
// that share a slot (no replica confirmation asked for): one script per
// attempt grants every key or none (acquire_all.lua), behind the quarantine
// gate as a mutex grant is. Elsewhere: rounds of try-once grants in canonical
// order; a busy key or a failure rolls the round back (every key taken is
// released, and the releases answered) before it waits or completes, so the
// caller is never told "busy" while it still holds a key.
class AllOrNone : public std::enable_shared_from_this<AllOrNone> {
 public:
  AllOrNone(std::shared_ptr<LockService> svc, std::vector<std::string> resources, LockOptions opts,
            AcquireAllHandler done)
      : svc_(std::move(svc)),
        resources_(std::move(resources)),
        once_(std::move(opts)),
        deadline_(svc_->clock().now() + once_.wait),
        backoff_min_(std::max(once_.backoff_min, ms(1))),
        backoff_max_(std::max(once_.backoff_max, backoff_min_)),
        timer_(svc_->client().get_executor()),
        done_(std::move(done)) {
    once_.wait = ms(0);
  }

  void start() {
    // A cluster runs one script only for keys in one slot: resources whose
    // names happen to hash to the same slot (a name cannot carry a hash tag of
    // its own: braces are refused).
    bool one_slot = true;
    if (svc_->client().options().cluster) {
      const auto slot = redis::key_slot(svc_->keys().lock_key(resources_.front()));
      for (const auto& r : resources_) one_slot = one_slot && redis::key_slot(svc_->keys().lock_key(r)) == slot;
    }
    one_script_ = one_slot && svc_->confirmation_for(once_).replicas == 0;
    round();
  }

 private:
  void round() {
    taken_.clear();
    if (!one_script_) return take(0);
    if (auto t = gate_->ready()) return send_all(std::move(t));
    gate_->admit([self = shared_from_this()](std::error_code ec, const std::string& detail, std::chrono::milliseconds,
                                             detail::StateGate::TicketPtr t) {
      // Posted: the gate's fast path may answer inside admit(), and a
      // completion never runs inside its initiating call.
      asio::post(self->svc_->client().get_executor(), [self, ec, detail, t = std::move(t)]() mutable {
        if (ec) {
          self->metrics().redis_errors_total.inc();
          return self->finish(Error(ec, detail).with_context("acquire_all of " + self->names()), std::nullopt);
        }
        self->send_all(std::move(t));
      });
    });
  }

  observe::LockClassMetrics& metrics() const { return svc_->class_metrics(once_.lock_class); }

  std::string names() const {
    std::string out;
    for (const auto& r : resources_) out += (out.empty() ? "" : ", ") + svc_->keys().lock_key(r);
    return out;
  }

  void send_all(detail::StateGate::TicketPtr ticket) {
    const auto& k = svc_->keys();
    const std::size_t n = resources_.size();
    std::vector<std::string> keys(2 * n), tokens(n);
    for (std::size_t i = 0; i < n; ++i) {
      keys[i] = k.lock_key(resources_[i]);
      keys[n + i] = k.fence_key(resources_[i]);
      tokens[i] = make_token(once_.job_id);
    }
    // The epoch compared in the script as acquire.lua's grants do it, on one
    // server (on a cluster the record is in another slot than the keys).
    const bool compare = gate_->watches_clock() && !ticket->epoch.empty();
    std::vector<std::string> args = {std::to_string(once_.ttl.count()), once_.fence ? "1" : "0",
                                     ticket->script_evicted_for(keys[0]), compare ? ticket->epoch : std::string()};
    args.insert(args.end(), tokens.begin(), tokens.end());
    std::vector<std::string> call_keys = keys;
    if (compare) call_keys.emplace_back(detail::kLockStateKey);
    const auto sent_at = svc_->clock().now();
    const auto steady_sent = std::chrono::steady_clock::now();
    svc_->client().async_eval(
        script_acquire_all(), std::move(call_keys), std::move(args),
        [self = shared_from_this(), ticket, keys, tokens = std::move(tokens), sent_at, steady_sent](
            std::error_code ec, redis::Reply r) mutable {
          auto& m = self->metrics();
          if (ec) {
            m.redis_errors_total.inc();
            return self->finish(redis::to_error(ec, r, self->svc_->client().address(), "acquire_all of " + self->names()),
                                std::nullopt);
          }
          const std::size_t count = self->resources_.size();
          if (!r.is_array() || r.elements.size() < 2 || !r.elements[0].is_integer() ||
              (r.elements[0].integer == 1 && r.elements.size() != 2 + count))
            return self->finish(Error(errc::protocol_error, "unexpected reply to the acquire_all script: " +
                                                                redis::to_debug_string(r)),
                                std::nullopt);
          const auto verdict = r.elements[0].integer;
          if (verdict == -1) {
            // Keys were evicted or the record changed since the gate's
            // check: nothing was written; ask again at once, through a new
            // check, which answers with the quarantine (a try-once attempt
            // must not end as "busy" when the server lost lock state).
            self->gate_->invalidate();
            return self->round();
          }
          if (verdict == 0) {
            m.busy_total.inc();
            self->saw_busy_ = true;
            return self->after_roll_back(Error(), Error());  // nothing was written
          }
          if (self->gate_->watches_clock() && r.elements[1].is_integer())
            self->gate_->clock_sample(r.elements[1].integer, steady_sent, std::chrono::steady_clock::now());
          std::vector<Lock> locks;
          for (std::size_t i = 0; i < count; ++i) {
            std::optional<std::int64_t> fence;
            if (r.elements[2 + i].is_integer() && r.elements[2 + i].integer >= 0) fence = r.elements[2 + i].integer;
            locks.push_back(self->svc_->make_lock(self->resources_[i], keys[i], std::move(tokens[i]), fence,
                                                  self->once_, sent_at, ticket->epoch_for(keys[i])));
          }
          // A reply on a connection the gate did not check (a reconnect, or a
          // clock step this reply revealed) proves nothing: handed back, and
          // asked for again through the gate.
          if (!self->gate_->current(*ticket)) {
            self->taken_ = std::move(locks);
            return self->roll_back(Error());
          }
          for (std::size_t i = 0; i < count; ++i) m.acquisitions_total.inc();
          self->finish(Error(), MultiLock(std::move(locks)));
        });
  }

  void take(std::size_t i) {
    if (i == resources_.size()) return finish(Error(), MultiLock(std::exchange(taken_, {})));
    svc_->async_acquire(resources_[i], once_, [self = shared_from_this(), i](const Error& e, std::optional<Lock> l) {
      if (e) return self->roll_back(e);
      if (!l) return self->roll_back(Error());
      self->taken_.push_back(std::move(*l));
      self->take(i + 1);
    });
  }

  // `cause`: the acquire's Error, or none for a busy key.
  void roll_back(Error cause) {
    if (taken_.empty()) return after_roll_back(cause, Error());
    auto j = std::make_shared<Joined>(taken_.size(), [self = shared_from_this(), cause](const Error& e, bool) {
      self->after_roll_back(cause, e);
    });
    for (auto& l : taken_) l.async_release([j](const Error& e, bool ours) { j->answer(e, ours); });
  }

  void after_roll_back(const Error& cause, const Error& release_error) {
    taken_.clear();
    if (cause) return finish(cause, std::nullopt);
    // A key we took may still be held (until its TTL): not "busy, none held".
    if (release_error)
      return finish(release_error.with_context("rolling back a partial acquire_all (the key expires by its TTL)"),
                    std::nullopt);
    const auto now = svc_->clock().now();
    if (now >= deadline_) return finish(Error(), std::nullopt);
    // Full jitter: contenders that collided on a key do not retry in step.
    const auto cap = std::min<std::int64_t>(backoff_max_.count(),
                                            backoff_min_.count() << std::min<std::uint32_t>(attempt_++, 20));
    std::uniform_int_distribution<std::int64_t> d(1, std::max<std::int64_t>(cap, 1));
    auto delay = ms(d(rng_));
    const auto left = std::chrono::duration_cast<ms>(deadline_ - now);
    if (delay > left) delay = std::max(left, ms(1));
    timer_.expires_after(delay);
    timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec) return self->finish(Error(errc::shutdown, "acquire_all: the wait was cancelled (the client is closing)"), std::nullopt);
      self->round();
    });
  }

  void finish(const Error& e, std::optional<MultiLock> m) {
    // The one script's calls, counted per key as a mutex's acquire calls are
    // (its grants and holds are per key too): the wait of the whole call,
    // contended when an attempt met a busy key. The ordered path's try-once
    // acquires count themselves, each as a call.
    if (one_script_ && !e) {
      auto& metrics = this->metrics();
      const auto waited = svc_->clock().now() - started_;
      for (std::size_t i = 0; i < resources_.size(); ++i) {
        metrics.wait_seconds.observe(waited);
        if (saw_busy_) metrics.contended_total.inc();
      }
    }
    auto done = std::move(done_);
    if (done) done(e, std::move(m));
  }

  std::shared_ptr<LockService> svc_;
  std::shared_ptr<detail::StateGate> gate_ = std::static_pointer_cast<detail::StateGate>(svc_->gate());
  bool one_script_ = false;
  std::vector<std::string> resources_;
  LockOptions once_;
  MonotonicClock::time_point started_ = svc_->clock().now(), deadline_;
  ms backoff_min_, backoff_max_;
  asio::steady_timer timer_;
  AcquireAllHandler done_;
  std::vector<Lock> taken_;
  std::uint32_t attempt_ = 0;
  bool saw_busy_ = false;
  std::mt19937_64 rng_{std::random_device{}()};
};

}  // namespace

void async_acquire_all(LockService& service, std::vector<std::string> resources, LockOptions opts,
                       AcquireAllHandler done) {
  auto sorted = canonical_resources(service, std::move(resources), opts);
  auto op = std::make_shared<AllOrNone>(service.shared_from_this(), std::move(sorted), std::move(opts),
                                        std::move(done));
  // On the loop: the quarantine gate and the class metrics are the loop's
  // alone. Every answer comes from a reply or a post, never inside this call.
  if (service.client().running_in_loop_thread()) op->start();
  else asio::post(service.client().get_executor(), [op] { op->start(); });
}

std::optional<MultiLock> acquire_all(LockService& service, std::vector<std::string> resources,
                                     const LockOptions& opts) {
  if (service.client().running_in_loop_thread())
    throw Error(errc::invalid_argument, "blocking acquire_all on the event-loop thread would deadlock");
  std::promise<std::optional<MultiLock>> p;
  auto f = p.get_future();
  async_acquire_all(service, std::move(resources), opts, [&p](const Error& e, std::optional<MultiLock> m) {
    if (e) p.set_exception(std::make_exception_ptr(Error(e.code(), std::string(e.detail()), e.source())));
    else p.set_value(std::move(m));
  });
  return f.get();
}

}  // namespace jobguard
