#include "lock/quarantine.hpp"

#include <fmt/format.h>

#include <future>

#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard {
namespace lock_scripts {
extern const std::string_view epoch;
}

namespace detail {
namespace {
using Clock = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;

const redis::Script& script_epoch() {
  static const redis::Script s{std::string(lock_scripts::epoch)};
  return s;
}

// A check whose reply keeps arriving on a newer connection than it was sent
// on (a flapping link) gives up after this many tries and reports the flap.
constexpr int kMaxCheckRetries = 5;
}  // namespace

bool version_at_least(std::string_view version, int major, int minor) {
  int v[2] = {0, 0};
  std::size_t i = 0;
  for (int part = 0; part < 2; ++part) {
    if (i >= version.size() || version[i] < '0' || version[i] > '9') return false;
    while (i < version.size() && version[i] >= '0' && version[i] <= '9') v[part] = v[part] * 10 + (version[i++] - '0');
    if (part == 0) {
      if (i >= version.size() || version[i] != '.') return false;
      ++i;
    }
  }
  return v[0] > major || (v[0] == major && v[1] >= minor);
}

bool StateGate::waitaof() const noexcept {
  return client_.options().lock_waitaof && aof_enabled_ && version_at_least(server_version_, 7, 2);
}

std::string quarantine_message(const std::string& reason, ms left) {
  return fmt::format("server lost lock state ({}); grants refused for {} ms more", reason, left.count());
}

StateGate::StateGate(redis::Client& client, ms max_ttl, ms recheck, const MonotonicClock& clock)
    : client_(client), clock_(clock), max_ttl_(max_ttl), recheck_(recheck) {}

std::uint64_t StateGate::mark() const { return client_.stats().reconnects; }

bool StateGate::current(const Ticket& t) const { return mark() == t.mark; }

void StateGate::invalidate() { ticket_.reset(); }

void StateGate::recheck() {
  if (checking_ || checked_current()) return;
  waiting_.push_back([](std::error_code, const std::string&, ms, TicketPtr) {});
  retries_ = 0;
  check();
}

void StateGate::listen(std::weak_ptr<void> owner, Listener l) {
  std::erase_if(listeners_, [](const auto& p) { return p.first.expired(); });
  listeners_.emplace_back(std::move(owner), std::move(l));
}

StateGate::TicketPtr StateGate::ready() {
  if (!ticket_ || ticket_->mark != mark()) return nullptr;
  const auto now = clock_.now();
  if (now < quarantine_until_ || checked_at_ < quarantine_until_) return nullptr;
  if (now >= checked_at_ + recheck_ && !checking_) {
    retries_ = 0;
    check();
  }
  return ticket_;
}

void StateGate::admit(Admit cb) {
  const auto now = clock_.now();
  if (ticket_ && ticket_->mark == mark()) {
    // In quarantine on the same connection: the server's answer will not
    // change before the deadline, so do not ask it again.
    if (now < quarantine_until_) {
      const auto left = std::chrono::ceil<ms>(quarantine_until_ - now);
      return cb(make_error_code(errc::server_busy), quarantine_message(reason_, left), left, nullptr);
    }
    // A quarantine just ended: the server says whether grants resume (it may
    // have found another loss meanwhile).
    if (checked_at_ < quarantine_until_) {
      waiting_.push_back(std::move(cb));
      if (!checking_) {
        retries_ = 0;
        check();
      }
      return;
    }
    // The periodic check runs beside the grants instead of in front of them:
    // what it looks for (a FLUSHALL on a live connection) is the window it
    // bounds, and 64 callers must not stall on it every second.
    if (now >= checked_at_ + recheck_ && !checking_) {
      retries_ = 0;
      check();
    }
    return cb({}, {}, ms(0), ticket_);
  }
  waiting_.push_back(std::move(cb));
  if (!checking_) {
    retries_ = 0;
    check();
  }
}

void StateGate::check() {
  checking_ = true;
  const auto sent_mark = mark();
  std::vector<std::string> keys{kLockStateKey};
  std::vector<std::string> args{std::to_string(max_ttl_.count()), "check"};
  client_.async_eval(script_epoch(), std::move(keys), std::move(args),
                     [self = shared_from_this(), sent_mark](std::error_code ec, redis::Reply r) {
                       self->on_checked(sent_mark, ec, std::move(r));
                     });
}

void StateGate::on_checked(std::uint64_t sent_mark, std::error_code ec, redis::Reply r) {
  const auto now = clock_.now();
  if (ec) return settle(ec, r.str, ms(0));
  if (mark() != sent_mark) {
    // Sent on one connection, answered on another (or a reconnect came in
    // between): we cannot tell which server answered. Ask again.
    if (++retries_ <= kMaxCheckRetries) return check();
    return settle(make_error_code(errc::connection_lost),
                  fmt::format("the connection to {} kept reconnecting while its lock state was checked",
                              client_.address()),
                  ms(0));
  }
  if (!r.is_array() || r.elements.size() != 8)
    return settle(make_error_code(errc::protocol_error),
                  "unexpected reply to the lock-state check: " + to_debug_string(r), ms(0));
  const std::string& id = r.elements[0].str;
  const ms left(r.elements[1].integer);
  const std::string evicted = std::to_string(r.elements[2].integer);
  const bool evicting = r.elements[3].integer == 1;
  std::string reason = r.elements[4].str;
  if (r.elements[5].str != "master") {
    ticket_.reset();
    return settle(make_error_code(errc::server_busy),
                  fmt::format("{} is a {}, not a primary: no grants from it", client_.address(), r.elements[5].str),
                  ms(0));
  }
  server_version_ = r.elements[6].str;
  aof_enabled_ = r.elements[7].is_integer() && r.elements[7].integer == 1;
  const std::string old = ticket_ ? ticket_->epoch : last_epoch_;
  auto t = std::make_shared<Ticket>();
  t->mark = sent_mark;
  t->epoch = id;
  if (evicting) t->evicted = evicted;
  ticket_ = t;
  last_epoch_ = id;
  checked_at_ = now;
  quarantine_until_ = now + left;
  if (reason.empty() && !old.empty() && old != id) reason = "lock state lost (found by another client)";
  if (!reason.empty()) reason_ = reason;
  if (!old.empty() && old != id) {
    std::erase_if(listeners_, [](const auto& p) { return p.first.expired(); });
    auto ls = listeners_;  // a listener may add or drop listeners
    for (auto& [owner, fn] : ls)
      if (auto keep = owner.lock()) fn(id, reason_);
  }
  if (left.count() > 0) return settle(make_error_code(errc::server_busy), quarantine_message(reason_, left), left);
  settle({}, {}, ms(0));
}

void StateGate::settle(std::error_code ec, const std::string& detail, ms retry_in) {
  checking_ = false;
  auto waiting = std::move(waiting_);
  waiting_.clear();
  for (auto& cb : waiting) cb(ec, detail, retry_in, ec ? nullptr : ticket_);
}

}  // namespace detail

void trust_new_server(redis::Client& client) {
  if (client.running_in_loop_thread())
    throw Error(errc::invalid_argument, "trust_new_server on the event-loop thread would deadlock");
  const auto max_ttl = client.options().lock_max_ttl;
  std::vector<std::string> keys{detail::kLockStateKey};
  std::vector<std::string> args{std::to_string(max_ttl.count()), "trust"};
  const auto r = client.eval(detail::script_epoch(), std::move(keys), std::move(args));
  if (!r.is_array() || r.elements.size() != 8)
    throw Error(errc::protocol_error, "unexpected reply to the lock-state record: " + redis::to_debug_string(r));
  if (r.elements[5].str != "master")
    throw Error(errc::invalid_argument, fmt::format("{} is a {}: only a primary can be trusted as new", client.address(),
                                                    r.elements[5].str));
}

}  // namespace jobguard
