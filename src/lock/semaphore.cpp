#include "jobguard/semaphore.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <optional>
#include <boost/asio/post.hpp>

#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"
#include "lock/inspect_internal.hpp"
#include "lock/quarantine.hpp"
#include "lock/rwlock_internal.hpp"
#include "lock/semaphore_internal.hpp"

namespace jobguard {
namespace lock_scripts {
extern const std::string_view sem_acquire;
extern const std::string_view sem_release;
extern const std::string_view sem_extend;
extern const std::string_view sem_inspect;
}  // namespace lock_scripts

namespace detail {
const redis::Script& sem_acquire_script() {
  static const redis::Script s{std::string(lock_scripts::sem_acquire)};
  return s;
}
const redis::Script& sem_release_script() {
  static const redis::Script s{std::string(lock_scripts::sem_release)};
  return s;
}
const redis::Script& sem_extend_script() {
  static const redis::Script s{std::string(lock_scripts::sem_extend)};
  return s;
}

// A call's keys and common arguments are built only by the first call of a
// turn's batch (`make`): the others add their own arguments to it.
template <class MakeBatch>
void SemaphoreCalls::add(BatchKey key, MakeBatch&& make, std::vector<std::string> item,
                         redis::ConfirmedCompletion done) {
  // A full call is sent at once, written before this turn of the loop ends,
  // so the server runs it while this client resumes the callers after it
  // and fills the next: the two overlap instead of taking turns. Smaller
  // calls cost the server more per attempt (each call's fixed part, and a
  // holders' key that a release of everyone no longer empties), so the size
  // is where the overlap gains most: 32, measured against 16, 24, 40, 48 and
  // one call a turn at 64 workers (docs/bench.md, "Semaphore").
  constexpr std::size_t kMaxBatch = 32;
  std::optional<Batch> full;
  bool first = false;
  {
    std::lock_guard g(mu_);
    auto it = pending_.find(key);
    if (it == pending_.end()) {
      first = true;
      it = pending_.emplace(key, make()).first;
    }
    for (auto& a : item) it->second.args.push_back(std::move(a));
    it->second.done.push_back(std::move(done));
    if (it->second.done.size() >= kMaxBatch) {
      full = std::move(it->second);
      pending_.erase(it);
    }
  }
  if (full) {
    send(std::move(*full));
    return client_.flush_writes();
  }
  if (!first) return;
  // Posted behind whatever the loop already has queued (the completions that
  // lead to more calls in this turn), then sent as one call.
  boost::asio::post(client_.get_executor(), [self = shared_from_this(), key = std::move(key)] {
    std::optional<Batch> b;
    {
      std::lock_guard g(self->mu_);
      auto it = self->pending_.find(key);
      if (it == self->pending_.end()) return;  // sent when it filled up
      b = std::move(it->second);
      self->pending_.erase(it);
    }
    self->send(std::move(*b));
  });
}

namespace {
// A batch's keys: the script's own, then the lock-state record when the
// epoch is compared.
std::vector<std::string> with_record(const std::vector<std::string>& keys, const std::string& epoch) {
  auto out = keys;
  if (!epoch.empty()) out.emplace_back(kLockStateKey);
  return out;
}
}  // namespace

void SemaphoreCalls::acquire(const std::vector<std::string>& keys, int permits, const std::string& evicted,
                             const std::string& epoch, const redis::Confirm& confirm, const PermitTerms& terms,
                             std::string token, std::string waiter, redis::ConfirmedCompletion done) {
  BatchKey key{keys[0],
               &sem_acquire_script(),
               permits,
               evicted + ' ' + epoch,
               confirm.replicas,
               static_cast<long long>(confirm.timeout.count()),
               confirm.waitaof,
               terms.ttl_ms,
               terms.waiter_lease_ms,
               (terms.fence ? 1 : 0) + (terms.wait ? 2 : 0)};
  const auto make = [&] {
    return Batch{&sem_acquire_script(),
                 with_record(keys, epoch),
                 {std::to_string(permits), evicted, epoch, std::to_string(terms.ttl_ms), terms.fence ? "1" : "0",
                  terms.wait ? "1" : "0", std::to_string(terms.waiter_lease_ms)},
                 confirm,
                 {},
                 true,
                 terms.fence};
  };
  std::vector<std::string> item;
  item.reserve(2);
  item.push_back(std::move(token));
  item.push_back(std::move(waiter));
  add(std::move(key), make, std::move(item), std::move(done));
}

void SemaphoreCalls::acquire_rw(const std::vector<std::string>& keys, LockMode mode, const std::string& evicted,
                                const std::string& epoch, const redis::Confirm& confirm,
                                std::vector<std::string> item, redis::ConfirmedCompletion done) {
  // One mode a call: a call of readers takes the common case's few calls
  // (rw_acquire.lua) unless a writer holds or waits.
  const bool writer = mode == LockMode::exclusive;
  BatchKey key{keys[0], &rw_acquire_script(), writer ? 1 : 0, evicted + ' ' + epoch, confirm.replicas,
               static_cast<long long>(confirm.timeout.count()), confirm.waitaof, 0, 0, 0};
  const auto make = [&] {
    return Batch{&rw_acquire_script(), with_record(keys, epoch), {writer ? "w" : "r", evicted, epoch}, confirm, {}};
  };
  add(std::move(key), make, std::move(item), std::move(done));
}

redis::ConfirmedCompletion SemaphoreCalls::release_completion(LockService::ReleaseHandler done) {
  if (!done) return nullptr;
  return [done = std::move(done), c = &client_](std::error_code ec, redis::Reply r, redis::Confirmation) {
    if (ec) return done(redis::to_error(ec, r, c->address(), "release"), false);
    done(Error(), r.is_integer() && r.integer == 1);
  };
}

void SemaphoreCalls::release(const KeyBuilder& keys, const std::string& resource, std::string member, int permits,
                             LockService::ReleaseHandler done) {
  std::string holders = keys.permit_holders_key(resource);
  BatchKey key{holders, &sem_release_script(), permits, std::string(), 0, 0, false, 0, 0, 0};
  const auto make = [&] {
    return Batch{&sem_release_script(),
                 {std::move(holders), keys.permit_line_key(resource), keys.permit_line_expiry_key(resource),
                  keys.permit_count_key(resource)},
                 {keys.permit_channel(resource), std::to_string(permits), client_.options().cluster ? "1" : "0"},
                 {},
                 {}};
  };
  std::vector<std::string> item;
  item.push_back(std::move(member));
  add(std::move(key), make, std::move(item), release_completion(std::move(done)));
}

void SemaphoreCalls::release_rw(const KeyBuilder& keys, const std::string& resource, std::string token, LockMode mode,
                                LockService::ReleaseHandler done) {
  // The mode is in the batch's key: each mode has its own holders' key.
  const bool writer = mode == LockMode::exclusive;
  std::string holders = writer ? keys.rw_writer_key(resource) : keys.rw_readers_key(resource);
  BatchKey key{holders, &rw_release_script(), 0, std::string(), 0, 0, false, 0, 0, 0};
  const auto make = [&] {
    std::string readers = writer ? keys.rw_readers_key(resource) : holders;
    std::string writers = writer ? holders : keys.rw_writer_key(resource);
    return Batch{&rw_release_script(),
                 {std::move(holders), std::move(readers), std::move(writers), keys.rw_line_key(resource),
                  keys.rw_line_expiry_key(resource), keys.rw_writers_line_key(resource)},
                 {keys.rw_channel(resource), client_.options().cluster ? "1" : "0"},
                 {},
                 {}};
  };
  std::vector<std::string> item;
  item.push_back(std::move(token));
  add(std::move(key), make, std::move(item), release_completion(std::move(done)));
}

namespace {
redis::Reply int_array(std::initializer_list<std::int64_t> values) {
  redis::Reply out;
  out.type = redis::Reply::Type::array;
  out.elements.resize(values.size());
  std::size_t i = 0;
  for (const auto v : values) {
    out.elements[i].type = redis::Reply::Type::integer;
    out.elements[i++].integer = v;
  }
  return out;
}

// One attempt of a grant's reply (sem_acquire.lua's layout), as the waiter
// reads an attempt: {1, fence or -1, slot, permits} granted, {0, ms until
// the soonest lease ends or -1, permits, 0} busy, {-1, evicted, 0, 0}
// refused.
redis::Reply grant_reply(const redis::Reply& r, std::size_t attempts, std::size_t i, bool fenced) {
  const auto& e = r.elements;
  const std::int64_t n = e[0].integer, left = e[1].integer, evicted = e[2].integer, code = e[3 + i].integer;
  if (code >= 0) return int_array({1, fenced ? e[3 + attempts + i].integer : -1, code, n});
  if (code == -1) return int_array({0, left, n, 0});
  return int_array({-1, evicted, 0, 0});
}

bool grant_shaped(const redis::Reply& r, std::size_t attempts, bool fenced) {
  if (!r.is_array() || r.elements.size() != 3 + attempts * (fenced ? 2 : 1)) return false;
  return std::all_of(r.elements.begin(), r.elements.end(), [](const redis::Reply& v) { return v.is_integer(); });
}
}  // namespace

void SemaphoreCalls::send(Batch b) {
  auto done = std::make_shared<std::vector<redis::ConfirmedCompletion>>(std::move(b.done));
  client_.async_eval_confirmed(
      *b.script, std::move(b.keys), std::move(b.args), b.confirm,
      [done, grants = b.grants, fenced = b.fenced](std::error_code ec, redis::Reply r, redis::Confirmation c) {
        const bool shaped =
            grants ? grant_shaped(r, done->size(), fenced) : r.is_array() && r.elements.size() == done->size();
        if (!ec && !shaped) {
          ec = make_error_code(errc::protocol_error);
          redis::Reply e;
          e.type = redis::Reply::Type::error;
          e.str = "unexpected reply to a coalesced lock script: " + redis::to_debug_string(r);
          r = std::move(e);
        }
        for (std::size_t i = 0; i < done->size(); ++i) {
          if (!(*done)[i]) continue;
          if (ec) {
            (*done)[i](ec, r, c);
          } else if (grants) {
            (*done)[i](ec, grant_reply(r, done->size(), i, fenced), c);
          } else {
            (*done)[i](ec, std::move(r.elements[i]), c);
          }
        }
      });
}
}  // namespace detail

namespace {
const redis::Script& sem_inspect_script() {
  static const redis::Script s{std::string(lock_scripts::sem_inspect)};
  return s;
}
// Stores the count and wakes every waiter (a message that is not "wake <id>"):
// a raised count may be theirs now.
const redis::Script& set_script() {
  static const redis::Script s{
      "if ARGV[1] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[1]) end\n"
      "redis.call(ARGV[3] == '1' and 'SPUBLISH' or 'PUBLISH', KEYS[2], ARGV[2])\n"
      "return 1"};
  return s;
}

void refuse_on_loop(LockService& svc, const char* what) {
  if (svc.client().running_in_loop_thread())
    throw Error(errc::invalid_argument,
                fmt::format("{}: blocking call on the Redis client's event-loop thread would deadlock", what));
}


void store(LockService& svc, std::string_view resource, const std::string& value) {
  refuse_on_loop(svc, "set_permits");
  const auto& k = svc.keys();
  const std::string count_key = k.permit_count_key(resource);
  try {
    svc.client().eval(set_script(), {count_key, k.permit_channel(resource)},
                      {value, "count " + (value.empty() ? std::string("cleared") : value),
                       svc.client().options().cluster ? "1" : "0"});
  } catch (const Error& e) {
    throw e.with_context(count_key);
  }
}
}  // namespace

void set_permits(LockService& service, std::string_view resource, int permits) {
  if (permits < 1 || permits > LockOptions::kMaxPermits)
    throw Error(errc::invalid_argument, fmt::format("permit count {} for {} is outside 1..{}", permits,
                                                    std::string(resource), LockOptions::kMaxPermits));
  store(service, resource, std::to_string(permits));
}

void clear_permits(LockService& service, std::string_view resource) { store(service, resource, std::string()); }

SemaphoreInfo inspect_semaphore(LockService& svc, std::string_view resource) {
  refuse_on_loop(svc, "inspect_semaphore");
  const auto& k = svc.keys();
  SemaphoreInfo info;
  info.resource = std::string(resource);
  info.key = k.permit_holders_key(resource);
  redis::Reply r;
  try {
    r = svc.client().eval(sem_inspect_script(),
                          {info.key, k.fence_key(resource), k.permit_line_key(resource),
                           k.permit_line_expiry_key(resource), k.permit_count_key(resource)},
                          {});
  } catch (const Error& e) {
    throw e.with_context("inspect of " + info.key);
  }
  if (!r.is_array() || r.elements.size() < 4 || r.elements.size() % 2 != 0)
    throw Error(errc::protocol_error,
                fmt::format("inspect of {}: unexpected reply {}", info.key, redis::to_debug_string(r)));
  const auto& e = r.elements;
  info.server_time_ms = detail::reply_int(e[0]).value_or(0);
  if (auto n = detail::reply_int(e[1])) info.stored_permits = static_cast<int>(*n);
  info.fence = detail::reply_int(e[2]);
  info.waiters = detail::reply_int(e[3]).value_or(0);
  for (std::size_t i = 4; i + 1 < e.size(); i += 2) {
    const std::string& m = e[i].str;
    const auto sp = m.rfind(' ');
    PermitHolder h;
    h.holder = token_owner(sp == std::string::npos ? m : m.substr(0, sp));
    h.slot = sp == std::string::npos ? -1 : std::atoi(m.c_str() + sp + 1);
    h.ttl_left = std::chrono::milliseconds(detail::reply_int(e[i + 1]).value_or(0) - info.server_time_ms);
    info.holders.push_back(std::move(h));
  }
  std::sort(info.holders.begin(), info.holders.end(), [](const auto& a, const auto& b) { return a.slot < b.slot; });
  return info;
}

}  // namespace jobguard
