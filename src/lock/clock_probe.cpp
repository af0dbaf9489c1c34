// The gate's watch of the server's clock (docs/lock-safety.md, "Server clock
// steps"): the samples every reply that carries TIME gives it, the probe that
// reads TIME while leases are held, and what a step found sets off.
#include <fmt/format.h>

#include <boost/asio/steady_timer.hpp>
#include <cstdlib>
#include <optional>

#include "jobguard/redis/client.hpp"
#include "jobguard/redis/options.hpp"
#include "lock/quarantine.hpp"

namespace jobguard::detail {
namespace {
using ms = std::chrono::milliseconds;
}  // namespace

bool StateGate::watches_clock() const noexcept { return !client_.options().cluster; }


bool StateGate::clock_sample(std::int64_t server_us, std::chrono::steady_clock::time_point sent,
                             std::chrono::steady_clock::time_point received) {
  if (!watches_clock()) return false;
  // A reconnect may have reached another server (a failover): its clock is
  // a new baseline, not a step of the old one (the lock-state check judges
  // the server change itself).
  if (const auto m = mark(); m != watch_mark_) {
    watch_.reset();
    watch_mark_ = m;
  }
  return judge(watch_.observe(server_us, sent, received), {});
}

bool StateGate::node_clock_sample(const std::string& node, std::int64_t server_us,
                                  std::chrono::steady_clock::time_point sent,
                                  std::chrono::steady_clock::time_point received) {
  // Unlike one server's watch, a node's is not started again when the client
  // connects anew: on a cluster any first connection to any node counts as
  // one (the fleet's key, a lease's node, a probe), and a step that fell
  // before such a connect went unseen. A node is its address, so a failover
  // to another host is another watch, and a process restarted at the same
  // address reads the same host's clock (the lock-state check judges the
  // restart itself).
  auto& w = node_watch_.try_emplace(node, ClockWatch(max_ttl_)).first->second;
  return judge(w.observe(server_us, sent, received), node);
}

bool StateGate::judge(std::chrono::microseconds step, const std::string& node) {
  if (step.count() > 0) {
    clock_stepped(step, node);
    return true;
  }
  if (step.count() < 0) {
    // Keys live longer by the step (a crashed holder's lock is freed that
    // much later) and the fence floor moves back, which the fence counter
    // itself stays above: liveness, not safety. Told, never quarantined.
    warn(fmt::format("the clock of {} stepped back by at least {} ms (its TIME against this host's monotonic "
                     "clock): locks of crashed holders expire that much later",
                     node.empty() ? client_.address() : node, -step.count() / 1000));
  }
  return false;
}

void StateGate::clock_stepped(std::chrono::microseconds step, const std::string& node) {
  const std::int64_t step_ms = std::max<std::int64_t>(1, step.count() / 1000);
  ++clock_gen_;  // grants in flight under an earlier ticket are handed back
  ++clock_steps_;
  reason_ = fmt::format("the server clock stepped forward by {} ms: lock keys may have expired early", step_ms);
  warn(fmt::format("the clock of {} stepped forward by at least {} ms (its TIME against this host's monotonic "
                   "clock): lock keys may have expired early; leases granted before are lost and grants refused "
                   "for {} ms",
                   node.empty() ? client_.address() : node, step_ms, max_ttl_.count()));
  // No grant until the record says so; the check below writes the step there
  // so every client of the server is quarantined with us.
  ticket_.reset();
  last_.reset();
  const auto now = clock_.now();
  checked_at_ = now;
  quarantine_until_ = now + max_ttl_;
  if (!last_epoch_.empty()) {
    // Every lease granted before the step is lost now, before the record's
    // round trip: its key may be gone already.
    last_epoch_ += "+clock-step";
    std::erase_if(listeners_, [](const auto& p) { return p.first.expired(); });
    auto ls = listeners_;
    for (auto& [owner, fn] : ls)
      if (auto keep = owner.lock()) fn(last_epoch_, reason_);
  }
  // On a cluster the quarantine is the cluster's (as for any shard's loss:
  // a grant need not know its shard before it is asked), and leases on
  // every shard are lost with it: conservative, since only the stepped
  // node's keys can have expired early.
  if (node != pending_step_node_) pending_step_ms_ = 0;
  pending_step_node_ = node;
  pending_step_ms_ = std::max(pending_step_ms_, step_ms);
  if (!checking_) {
    waiting_.push_back([](std::error_code, const std::string&, ms, TicketPtr) {});
    retries_ = 0;
    check();
  }
}

void StateGate::touch() {
  if (clock_probe_.count() <= 0) return;
  touched_ = std::chrono::steady_clock::now();
  if (!probing_) {
    probing_ = true;
    arm_probe();
  }
}

// The timer lives in its own handler, never in the gate: a gate dropped by
// another thread must not destroy a timer the loop is waiting on.
void StateGate::arm_probe() {
  auto timer = std::make_shared<boost::asio::steady_timer>(client_.get_executor(), clock_probe_);
  timer->async_wait([timer, w = weak_from_this()](const auto& ec) {
    if (ec) return;
    if (auto self = w.lock()) self->probe();
  });
}

namespace {
std::optional<std::int64_t> time_reply_us(const redis::Reply& r) {
  if (!r.is_array() || r.elements.size() != 2) return std::nullopt;
  const auto num = [](const redis::Reply& e) -> std::int64_t {
    return e.is_integer() ? e.integer : std::strtoll(e.str.c_str(), nullptr, 10);
  };
  return num(r.elements[0]) * 1000000 + num(r.elements[1]);
}
}  // namespace

void StateGate::probe() {
  const auto now = std::chrono::steady_clock::now();
  // Idle for a max TTL: nothing held can be shortened by a step any more.
  if (now - touched_ > max_ttl_) {
    probing_ = false;
    return;
  }
  if (client_.options().cluster) return probe_cluster();
  const auto sent_mark = mark();
  client_.async_exec(redis::Command{"TIME"}, [w = weak_from_this(), now, sent_mark](std::error_code ec, redis::Reply r) {
    auto self = w.lock();
    if (!self) return;
    const auto t = time_reply_us(r);
    if (!ec && t && self->mark() == sent_mark) self->clock_sample(*t, now, std::chrono::steady_clock::now());
    self->arm_probe();
  });
}

// Every primary the last good check saw, each asked on its own node; the
// next probe is armed when the last of them answers, so a slow node delays
// the watch rather than piling up probes. Before a good check (or right
// after a step) there is no list yet: the next check's own readings count.
void StateGate::probe_cluster() {
  if (!last_ || last_->shards.empty()) return arm_probe();
  struct Round {
    std::size_t left;
  };
  auto round = std::make_shared<Round>(Round{last_->shards.size()});
  for (const auto& s : last_->shards) {
    redis::CallOptions on;
    on.node = s.node.address;
    const auto sent = std::chrono::steady_clock::now();
    client_.async_exec(
        redis::Command{"TIME"},
        [w = weak_from_this(), round, sent, node = s.node.address](std::error_code ec, redis::Reply r) {
          auto self = w.lock();
          if (!self) return;
          // Asked of this node by its address: the reply is its clock,
          // whichever connection (even one this probe opened) carried it.
          const auto t = time_reply_us(r);
          if (!ec && t) self->node_clock_sample(node, *t, sent, std::chrono::steady_clock::now());
          if (--round->left == 0) self->arm_probe();
        },
        on);
  }
}

}  // namespace jobguard::detail
