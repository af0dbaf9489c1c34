// The Lock a grant becomes: scope exit is release (lock.hpp).
#include "jobguard/lock.hpp"

#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <boost/asio/system_executor.hpp>
#include <functional>
#include <future>

#include "jobguard/observe/metrics.hpp"
#include "lock/service_impl.hpp"

namespace jobguard {

namespace asio = boost::asio;

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

namespace detail {
std::exception_ptr caller_exception(const Error& e) {
  return std::make_exception_ptr(Error(e.code(), std::string(e.detail()), e.source()));
}
}  // namespace detail

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
    if (e) p.set_exception(detail::caller_exception(e));
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
