#include "jobguard/lock.hpp"

#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <future>
#include <mutex>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include "jobguard/error.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/redis/subscriber.hpp"

namespace jobguard {
namespace lock_scripts {
extern const std::string_view acquire;
extern const std::string_view release;
extern const std::string_view extend;
extern const std::string_view leave_queue;
}  // namespace lock_scripts

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {
// The registry lookup takes a shared lock and a map search; a worker thread
// almost always asks for the same class again, so remember the last one.
observe::LockClassMetrics& class_metrics(const std::string& lock_class) {
  thread_local std::string last_name;
  thread_local observe::LockClassMetrics* last = nullptr;
  if (last == nullptr || last_name != lock_class) {
    last = &observe::Registry::global().lock_class(lock_class);
    last_name = lock_class;
  }
  return *last;
}

const redis::Script& script_acquire() {
  static const redis::Script s{std::string(lock_scripts::acquire)};
  return s;
}
const redis::Script& script_extend() {
  static const redis::Script s{std::string(lock_scripts::extend)};
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

// Loop-thread state of a LockService: the subscriber and the waiters.
struct LockService::Impl {
  std::mutex sub_mu;  // guards lazy creation only
  std::unique_ptr<redis::Subscriber> subscriber;
  // resource -> waiters to wake on release. Loop thread only.
  struct WaiterBase {
    virtual ~WaiterBase() = default;
    virtual void wake() = 0;
  };
  std::unordered_map<std::string, std::unordered_set<WaiterBase*>> waiters;
  std::unordered_map<std::string, redis::Subscriber::Id> subs;

  redis::Subscriber& sub(redis::Client& c) {
    std::lock_guard<std::mutex> g(sub_mu);
    if (!subscriber) {
      subscriber = std::make_unique<redis::Subscriber>(c);
      // Messages published while we were reconnecting are gone: wake every
      // waiter so none sleeps through a release it never heard about.
      subscriber->set_on_reconnect([this] {
        for (auto& [r, ws] : waiters)
          for (auto* w : std::vector<WaiterBase*>(ws.begin(), ws.end())) w->wake();
      });
    }
    return *subscriber;
  }
};

namespace {

// One acquire in progress: tries, then waits for a release message or its
// backoff timer, until granted or past its deadline. Lives on the loop
// thread; kept alive by its own pending operations.
class Waiter final : public LockService::Impl::WaiterBase, public std::enable_shared_from_this<Waiter> {
 public:
  Waiter(std::shared_ptr<LockService> svc, std::string resource, LockOptions opts, LockService::AcquireHandler done)
      : svc_(std::move(svc)),
        impl_(nullptr),
        resource_(std::move(resource)),
        opts_(std::move(opts)),
        done_(std::move(done)) {}

  void start(LockService::Impl* impl) {
    impl_ = impl;
    const auto& k = svc_->keys();
    key_ = k.lock_key(resource_);
    token_ = make_token(opts_.job_id);
    started_ = Clock::now();
    deadline_ = started_ + opts_.wait;
    metrics_ = &class_metrics(opts_.lock_class);
    if (opts_.fence || opts_.fair) {
      script_keys_ = {key_, k.fence_key(resource_), k.queue_key(resource_), k.queue_expiry_key(resource_)};
    }
    attempt();
  }

  void wake() override {
    if (finished_) return;
    if (in_flight_) {
      wake_pending_ = true;
      return;
    }
    if (timer_) timer_->cancel();
  }

 private:
  std::chrono::milliseconds waiter_lease() const {
    return std::max<std::chrono::milliseconds>(std::chrono::milliseconds(2000), opts_.backoff_max * 5);
  }

  void attempt() {
    in_flight_ = true;
    wake_pending_ = false;
    sent_at_ = Clock::now();
    auto self = shared_from_this();
    const bool may_wait = opts_.wait.count() > 0;
    if (script_keys_.empty()) {
      // The plain form other clients (ioredis, node-redlock, Laravel) use too.
      redis::Command cmd{"SET", key_, token_, "NX", "PX", std::to_string(opts_.ttl.count())};
      svc_->client().async_exec(std::move(cmd), [self](std::error_code ec, redis::Reply r) {
        self->in_flight_ = false;
        if (ec) return self->finish(ec, false, std::nullopt);
        if (r.is_ok()) return self->finish({}, true, std::nullopt);
        self->busy();
      });
      return;
    }
    std::vector<std::string> args = {token_,
                                     std::to_string(opts_.ttl.count()),
                                     opts_.fence ? "1" : "0",
                                     opts_.fair ? "1" : "0",
                                     may_wait ? "1" : "0",
                                     std::to_string(waiter_lease().count())};
    svc_->client().async_eval(script_acquire(), script_keys_, std::move(args),
                              [self](std::error_code ec, redis::Reply r) {
                                self->in_flight_ = false;
                                if (ec) return self->finish(ec, false, std::nullopt);
                                if (!r.is_array() || r.elements.size() != 2 || !r.elements[0].is_integer())
                                  return self->finish(make_error_code(errc::protocol_error), false, std::nullopt,
                                                      "unexpected reply to the acquire script: " + to_debug_string(r));
                                if (r.elements[0].integer == 1) {
                                  std::optional<std::int64_t> fence;
                                  if (r.elements[1].integer >= 0) fence = r.elements[1].integer;
                                  return self->finish({}, true, fence);
                                }
                                self->busy();
                              });
  }

  void busy() {
    metrics_->busy_total.inc();
    const auto now = Clock::now();
    if (now >= deadline_) return give_up();
    if (sub_id_ == 0) {
      // Subscribe, and only then look again: a release between our failed
      // attempt and the subscription would otherwise go unheard.
      auto self = shared_from_this();
      impl_->waiters[resource_].insert(this);
      registered_ = true;
      sub_id_ = svc_->impl_sub().subscribe(
          svc_->keys().channel(resource_),
          [w = std::weak_ptr<Waiter>(self)](const std::string&, const std::string& msg) {
            auto s = w.lock();
            if (!s) return;
            // A fair release names the queue head: only that waiter can win,
            // so the rest keep sleeping (their backoff still covers a head
            // that died, or a release by a client that names nobody).
            if (s->opts_.fair && msg != s->token_) return;
            s->wake();
          },
          [self] {
            if (!self->finished_ && !self->in_flight_ && self->timer_) self->timer_->cancel();
          });
    }
    if (wake_pending_) return attempt();
    // Full jitter: waiters spread out instead of stampeding in lockstep.
    const auto cap = std::min<long long>(opts_.backoff_max.count(),
                                         std::max<long long>(1, opts_.backoff_min.count()) << std::min(tries_, 16));
    ++tries_;
    // Seeded once per thread: a random_device per acquire costs more than the acquire.
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::uniform_int_distribution<long long> d(0, cap);
    auto sleep = std::chrono::milliseconds(d(rng));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - now);
    if (sleep > left) sleep = left;
    if (!timer_) timer_.emplace(svc_->client().get_executor());
    timer_->expires_after(sleep);
    timer_->async_wait([self = shared_from_this()](boost::system::error_code) {
      // Cancelled = woken by a release message: try at once either way.
      if (!self->finished_) self->attempt();
    });
  }

  void give_up() {
    if (opts_.fair && opts_.wait.count() > 0) {
      // Best effort; a waiter that cannot leave expires from the queue anyway.
      std::vector<std::string> keys = {script_keys_[2], script_keys_[3]};
      svc_->client().async_eval(script_leave(), std::move(keys), {token_}, [](std::error_code, redis::Reply) {});
    }
    finish({}, false, std::nullopt);
  }

  void finish(std::error_code ec, bool granted, std::optional<std::int64_t> fence, std::string detail = {}) {
    if (finished_) return;
    finished_ = true;
    if (timer_) timer_->cancel();
    if (registered_) {
      auto it = impl_->waiters.find(resource_);
      if (it != impl_->waiters.end()) {
        it->second.erase(this);
        if (it->second.empty()) impl_->waiters.erase(it);
      }
    }
    if (sub_id_ != 0) svc_->impl_sub().unsubscribe(sub_id_);
    auto done = std::move(done_);
    if (ec) {
      (void)detail;
      metrics_->redis_errors_total.inc();
      return done(ec, std::nullopt);
    }
    metrics_->wait_seconds.observe(Clock::now() - started_);
    if (!granted) return done({}, std::nullopt);
    metrics_->acquisitions_total.inc();
    // The waiter is finished: its strings move into the Lock, no copies.
    auto lock = svc_->make_lock(std::move(resource_), std::move(key_), std::move(token_), fence, opts_, sent_at_);
    done({}, std::move(lock));
  }

  std::shared_ptr<LockService> svc_;
  LockService::Impl* impl_;
  std::string resource_;
  LockOptions opts_;
  LockService::AcquireHandler done_;
  // Only a waiter that has to wait needs a timer: try-once acquires skip it.
  std::optional<asio::steady_timer> timer_;
  std::string key_, token_;
  std::vector<std::string> script_keys_;
  Clock::time_point started_, deadline_, sent_at_;
  observe::LockClassMetrics* metrics_ = nullptr;
  redis::Subscriber::Id sub_id_ = 0;
  int tries_ = 0;
  bool in_flight_ = false, wake_pending_ = false, finished_ = false, registered_ = false;
};

}  // namespace

LockService::LockService(redis::Client& client, KeyBuilder keys)
    : client_(client), keys_(std::move(keys)), impl_(std::make_shared<Impl>()) {}

LockService::~LockService() {
  // The subscriber posts its own shutdown to the loop; nothing else to undo:
  // waiters hold a shared_ptr to us, so none is left when we die.
}

std::shared_ptr<LockService> LockService::create(redis::Client& client, KeyBuilder keys) {
  return std::shared_ptr<LockService>(new LockService(client, std::move(keys)));
}

redis::Subscriber& LockService::impl_sub() { return impl_->sub(client_); }

Lock LockService::make_lock(std::string resource, std::string key, std::string token,
                            std::optional<std::int64_t> fence, const LockOptions& opts, Clock::time_point sent_at) {
  Lock l;
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
  return l;
}

void LockService::async_acquire(std::string resource, LockOptions opts, AcquireHandler done) {
  // Validate on the caller's thread so bad input throws where it was written.
  KeyBuilder::validate_resource(resource);
  if (opts.ttl < std::chrono::milliseconds(10))
    throw Error(errc::invalid_argument, fmt::format("lock ttl {} ms is below the 10 ms minimum", opts.ttl.count()));
  if (opts.wait.count() < 0) throw Error(errc::invalid_argument, "negative wait");
  auto w = std::make_shared<Waiter>(shared_from_this(), std::move(resource), std::move(opts), std::move(done));
  // On the loop already (a coroutine, a completion): start now, saving a hop.
  if (client_.running_in_loop_thread()) w->start(impl_.get());
  else asio::post(client_.get_executor(), [w, impl = impl_.get()] { w->start(impl); });
}

std::optional<Lock> LockService::acquire(std::string_view resource, const LockOptions& opts) {
  if (client_.running_in_loop_thread())
    throw Error(errc::invalid_argument, "blocking acquire on the event-loop thread would deadlock");
  std::promise<std::optional<Lock>> p;
  auto f = p.get_future();
  async_acquire(std::string(resource), opts, [&p](std::error_code ec, std::optional<Lock> l) {
    if (ec) p.set_exception(std::make_exception_ptr(Error(ec, "acquire")));
    else p.set_value(std::move(l));
  });
  return f.get();
}

void LockService::async_release(const std::string& resource, const std::string& token,
                                std::function<void(std::error_code, bool)> done, bool fair) {
  // A fair lock passes its queue key (same hash slot) so the release can name
  // the queue's head; a plain lock does not pay for the extra key and read.
  const std::string key = keys_.lock_key(resource);
  const std::string channel = keys_.channel(resource);
  auto on_reply = [done = std::move(done)](std::error_code ec, redis::Reply r) {
    if (done) done(ec, !ec && r.is_integer() && r.integer == 1);
  };
  if (fair) {
    const std::string queue = keys_.queue_key(resource);
    client_.async_eval_views(lock_release_script(), {key, queue}, {token, channel}, std::move(on_reply));
  } else {
    client_.async_eval_views(lock_release_script(), {key}, {token, channel}, std::move(on_reply));
  }
}

void LockService::async_extend(const std::string& resource, const std::string& token, std::chrono::milliseconds ttl,
                               std::function<void(std::error_code, bool)> done) {
  const std::string key = keys_.lock_key(resource);
  const std::string ms = std::to_string(ttl.count());
  client_.async_eval_views(script_extend(), {key}, {token, ms},
                           [done = std::move(done)](std::error_code ec, redis::Reply r) {
                             if (done) done(ec, !ec && r.is_integer() && r.integer == 1);
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
      held_(o.held_) {
  o.held_ = false;
}

Lock& Lock::operator=(Lock&& o) noexcept {
  if (this != &o) {
    if (held_ && service_) service_->async_release(resource_, token_, nullptr, fair_);
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
    o.held_ = false;
  }
  return *this;
}

Lock::~Lock() {
  // Scope exit is release; fire and forget so a destructor never blocks. If
  // it cannot reach Redis the TTL frees the lock.
  if (held_ && service_) {
    metrics_->hold_seconds.observe(Clock::now() - acquired_at_);
    service_->async_release(
        resource_, token_,
        [m = metrics_](std::error_code ec, bool ours) {
          if (ec) m->redis_errors_total.inc();
          else (ours ? m->releases_total : m->released_not_owner_total).inc();
        },
        fair_);
  }
}

bool Lock::release() {
  if (!held_) return false;
  held_ = false;
  std::promise<bool> p;
  auto f = p.get_future();
  metrics_->hold_seconds.observe(Clock::now() - acquired_at_);
  service_->async_release(
      resource_, token_,
      [&p, m = metrics_](std::error_code ec, bool ours) {
        if (ec) {
          m->redis_errors_total.inc();
          p.set_exception(std::make_exception_ptr(Error(ec, "release")));
          return;
        }
        (ours ? m->releases_total : m->released_not_owner_total).inc();
        p.set_value(ours);
      },
      fair_);
  return f.get();
}

bool Lock::extend(std::chrono::milliseconds ttl) {
  if (!held_) return false;
  if (ttl.count() == 0) ttl = ttl_;
  std::promise<bool> p;
  auto f = p.get_future();
  service_->async_extend(resource_, token_, ttl, [&p](std::error_code ec, bool ours) {
    if (ec) p.set_exception(std::make_exception_ptr(Error(ec, "extend")));
    else p.set_value(ours);
  });
  return f.get();
}

}  // namespace jobguard
