// Where a LockService's waiters hear that a lock may be theirs: the release
// channels plain waiters share, the grant channel a fair release names its
// waiter on, and the subscriber under both (service_impl.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "lock/service_impl.hpp"

namespace jobguard {

namespace {
// A grant channel name no other service can share: from the OS source like a
// token (a seeded generator would repeat itself in a forked child, and two
// services on one channel would take each other's grants).
std::string grant_channel_name(const KeyBuilder& keys) {
  const std::string t = make_token();
  return keys.prefix() + ":grant:" + t.substr(t.rfind('#') + 1);
}
}  // namespace

LockService::Impl::Impl(redis::Client& c, KeyBuilder k, const MonotonicClock& clk)
    : client(c),
      clock(clk),
      keys(std::move(k)),
      grant_channel(grant_channel_name(keys)),
      sharded(c.options().cluster),
      semaphore_calls(std::make_shared<detail::SemaphoreCalls>(c)) {}

std::string LockService::Impl::grant_channel_for(const std::string& resource) const {
  if (!sharded) return grant_channel;
  std::string c = keys.prefix();
  c.append(":grant:{").append(resource).append("}:").append(grant_channel, grant_channel.rfind(':') + 1);
  return c;
}

void LockService::Impl::woke_waiter(const std::string& resource, MonotonicClock::time_point sent,
                                    MonotonicClock::time_point replied) {
  using std::chrono::microseconds;
  const auto rtt = std::chrono::duration_cast<microseconds>(replied - sent);
  const auto y = std::clamp(rtt, microseconds(kYieldMinUs), microseconds(kYieldMaxUs));
  if (yield_until.size() >= 64) std::erase_if(yield_until, [&](const auto& e) { return e.second <= replied; });
  yield_until[resource] = replied + y;
}

std::optional<MonotonicClock::time_point> LockService::Impl::take_yield(const std::string& resource,
                                                                         MonotonicClock::time_point now) {
  if (yield_until.empty()) return std::nullopt;
  auto it = yield_until.find(resource);
  if (it == yield_until.end()) return std::nullopt;
  const auto until = it->second;
  yield_until.erase(it);
  if (until <= now) return std::nullopt;
  return until;
}

void LockService::Impl::wake_all(const Channel& ch) {
  for (auto* w : std::vector<WaiterBase*>(ch.waiters.begin(), ch.waiters.end())) w->wake();
}

redis::Subscriber& LockService::Impl::sub() {
  if (subscriber) return *subscriber;
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
    detail::warn_line(self->client,
                      fmt::format("lock waiters cannot hear releases and fall back to polling: {}", e.what()));
  });
  subscriber->set_on_reconnect([weak = weak_from_this()] {
    auto self = weak.lock();
    if (!self) return;
    const auto now = self->clock.now();
    for (auto& [name, ch] : self->channels) {
      if (ch.ready) ch.ready_at = now;
      wake_all(ch);
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
    wake_all(it->second);
  });
  return *subscriber;
}

void LockService::Impl::on_grant_message(const std::string& msg) {
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
  detail::release_lock(client, keys, msg.substr(b + 1), token, nullptr, true);
}

void LockService::Impl::abandon(std::string token, std::chrono::milliseconds place_lease) {
  const auto now = clock.now();
  std::erase_if(abandoned, [now](const auto& kv) { return kv.second < now; });
  abandoned.emplace(std::move(token), now + place_lease);
}

void LockService::Impl::on_release_message(const std::string& channel, const std::string& msg) {
  auto it = channels.find(channel);
  if (it == channels.end()) return;
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
  wake_all(it->second);
}

void LockService::Impl::on_channel_ready(const std::string& channel) {
  auto it = channels.find(channel);
  if (it == channels.end()) return;
  it->second.ready = true;
  it->second.ready_at = clock.now();
  // A release between a waiter's attempt and this moment went
  // unheard: every waiter registered so far looks once more.
  wake_all(it->second);
}

LockService::Impl::Heard LockService::Impl::watch(const std::string& channel, WaiterBase* w,
                                                  MonotonicClock::time_point sent_at, bool grants) {
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
          self->on_release_message(channel, msg);
        },
        [weak, channel] {
          if (auto self = weak.lock()) self->on_channel_ready(channel);
        });
    return Heard::on_ready;
  }
  if (!ch.ready) return Heard::on_ready;
  return ch.ready_at <= sent_at ? Heard::yes : Heard::look_again;
}

void LockService::Impl::unwatch(const std::string& channel, WaiterBase* w, std::chrono::milliseconds linger) {
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

void LockService::Impl::drop_idle_grant_channels(const std::string& keep) {
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

}  // namespace jobguard
