#include "lock/quarantine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "jobguard/admin.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/options.hpp"

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

// A refusal a failover under way explains: the node named primary says it is
// a replica, or a shard's node answers MOVED/ASK/CLUSTERDOWN/TRYAGAIN to the
// check pinned to it (the slot map moved under the check). A waiting acquire
// asks again this soon, within its wait, and the next check asks for a fresh
// map; a try-once acquire gets the refusal as it is.
constexpr ms kFailoverRetry{100};

bool failover_reply(const std::string& text) {
  for (const char* p : {"MOVED ", "ASK ", "CLUSTERDOWN", "TRYAGAIN"})
    if (text.rfind(p, 0) == 0) return true;
  return false;
}
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

std::string quarantine_message(const std::string& reason, ms left, const std::string& url) {
  std::string m = fmt::format("server lost lock state ({}); grants refused for {} ms more", reason, left.count());
  if (!url.empty() && only_missing_records(reason))
    m += fmt::format(": if the server was just provisioned (not restarted), `jobguard server trust --redis {}` ends "
                     "this now, else wait {} s",
                     url, std::chrono::ceil<std::chrono::seconds>(left).count());
  return m;
}

// Every shard's reason (on a cluster "address: reason" joined by "; ") is a
// missing record: the one case a new server shows. Anything else (another
// run_id, evictions) is a server that served, and trusting it is no way out.
bool only_missing_records(std::string_view reason) {
  if (reason.empty()) return false;
  std::size_t at = 0;
  while (at <= reason.size()) {
    auto end = reason.find("; ", at);
    if (end == std::string_view::npos) end = reason.size();
    if (reason.substr(at, end - at).find(kNoRecordReason) == std::string_view::npos) return false;
    at = end + 2;
  }
  return true;
}

std::string StateGate::refusal(ms left) const {
  return quarantine_message(reason_, left, redis::to_display_url(client_.options()));
}

StateGate::StateGate(redis::Client& client, ms max_ttl, ms recheck, const MonotonicClock& clock, ms clock_probe)
    : client_(client), clock_(clock), max_ttl_(max_ttl), recheck_(recheck), watch_(max_ttl), clock_probe_(clock_probe) {}

// On a cluster a first connect counts too: a connection to a node met for
// the first time (the replica a failover promoted) is a server the last
// check did not see. On one server the first connect comes before any check.
std::uint64_t StateGate::mark() const {
  const auto s = client_.stats();
  return client_.options().cluster ? s.connects : s.reconnects;
}

bool StateGate::current(const Ticket& t) const { return mark() == t.mark && t.clock_gen == clock_gen_; }

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
  touch();
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
  touch();
  const auto now = clock_.now();
  if (ticket_ && ticket_->mark == mark()) {
    // In quarantine on the same connection: the server's answer will not
    // change before the deadline, so do not ask it again.
    if (now < quarantine_until_) {
      const auto left = std::chrono::ceil<ms>(quarantine_until_ - now);
      return cb(make_error_code(errc::server_busy), refusal(left), left, nullptr);
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

// epoch.lua's reply from one server.
struct StateGate::Checked {
  std::string id, evicted, reason, role, version;
  ms left{0};
  bool evicting = false, aof = false;
  std::optional<std::int64_t> now_us;  // the server's TIME
  static std::optional<Checked> parse(const redis::Reply& r) {
    if (!r.is_array() || r.elements.size() < 8) return std::nullopt;
    Checked c;
    c.id = r.elements[0].str;
    c.left = ms(r.elements[1].integer);
    c.evicted = std::to_string(r.elements[2].integer);
    c.evicting = r.elements[3].integer == 1;
    c.reason = r.elements[4].str;
    c.role = r.elements[5].str;
    c.version = r.elements[6].str;
    c.aof = r.elements[7].is_integer() && r.elements[7].integer == 1;
    if (r.elements.size() > 8 && r.elements[8].is_integer()) c.now_us = r.elements[8].integer;
    return c;
  }
};

namespace {
const std::string kNoEpoch;
}

const StateGate::ShardCheck* StateGate::Ticket::shard_for(std::string_view key) const {
  const auto slot = redis::key_slot(key);
  for (const auto& s : shards)
    if (s.node.serves(slot)) return &s;
  return nullptr;
}

const std::string& StateGate::Ticket::epoch_for(std::string_view key) const {
  if (shards.empty()) return epoch;
  const auto* s = shard_for(key);
  return s ? s->epoch : kNoEpoch;
}

const std::string& StateGate::Ticket::evicted_for(std::string_view key) const {
  if (shards.empty()) return evicted;
  const auto* s = shard_for(key);
  return s ? s->evicted : kNoEpoch;
}

const std::string& StateGate::Ticket::script_evicted_for(std::string_view key) const {
  const auto& e = evicted_for(key);
  return e.empty() && shards.empty() ? evicted_count : e;
}

bool StateGate::checked_current(std::string_view key) const {
  if (checked_current()) return true;
  return partial_ && partial_->mark == mark() && !partial_->epoch_for(key).empty();
}

const std::string& StateGate::last_epoch_for(const redis::PrimaryShard& node) const {
  if (last_)
    for (const auto& s : last_->shards)
      if (s.node.address == node.address && s.node.slots == node.slots) return s.epoch;
  return kNoEpoch;
}

const std::string& StateGate::epoch_for(std::string_view key) const {
  return last_ ? last_->epoch_for(key) : last_epoch_;
}

std::string lock_state_key_for(const redis::PrimaryShard& shard) {
  if (shard.slots.empty()) return {};
  // Tags are tried in order, so every client of the cluster lands on the
  // same key for the same slots; a shard of one slot takes ~16k tries (µs).
  for (unsigned n = 0; n < (1u << 22); ++n) {
    std::string key = fmt::format("{}:{{{}}}", kLockStateKey, n);
    if (shard.serves(redis::key_slot(key))) return key;
  }
  return {};
}

void StateGate::check() {
  checking_ = true;
  const auto sent_mark = mark();
  if (client_.options().cluster) return check_cluster(sent_mark);
  std::vector<std::string> keys{kLockStateKey};
  std::vector<std::string> args{std::to_string(max_ttl_.count()), "check"};
  // A step found and not yet in the record: this check writes it there.
  const bool stepping = pending_step_ms_ > 0;
  if (stepping) {
    args[1] = "step";
    args.push_back(std::to_string(pending_step_ms_));
  }
  const auto sent = std::chrono::steady_clock::now();
  client_.async_eval(script_epoch(), std::move(keys), std::move(args),
                     [self = shared_from_this(), sent_mark, sent, stepping](std::error_code ec, redis::Reply r) {
                       self->on_checked(sent_mark, sent, stepping, ec, std::move(r));
                     });
}

// Every primary's own record, asked on that node: a shard restarted empty
// or failed over is found by its own record, whichever shard the lock-state
// key of one server would have landed on.
void StateGate::check_cluster(std::uint64_t sent_mark) {
  client_.async_primaries([self = shared_from_this(), sent_mark](const Error& err, std::vector<redis::PrimaryShard> nodes) {
    if (err) return self->settle(err.code(), std::string(err.detail()), ms(0));
    struct Round {
      std::vector<ShardCheck> shards;
      std::vector<std::pair<std::error_code, redis::Reply>> replies;
      std::size_t left = 0;
    };
    auto round = std::make_shared<Round>();
    for (auto& n : nodes) round->shards.push_back(ShardCheck{std::move(n), {}, {}});
    // A step found on a primary that has left the map has no record to go
    // to; the quarantine it started here stands.
    std::string stepping;
    if (self->pending_step_ms_ > 0) {
      for (const auto& sc : round->shards)
        if (sc.node.address == self->pending_step_node_) stepping = sc.node.address;
      if (stepping.empty()) self->pending_step_ms_ = 0;
    }
    const auto sent = std::chrono::steady_clock::now();
    round->replies.resize(round->shards.size());
    round->left = round->shards.size();
    if (round->left == 0)
      return self->settle(make_error_code(errc::protocol_error), "the cluster's slot map names no primary", ms(0));
    for (std::size_t i = 0; i < round->shards.size(); ++i) {
      std::string key = lock_state_key_for(round->shards[i].node);
      std::vector<std::string> args{std::to_string(self->max_ttl_.count()), "check"};
      if (!stepping.empty() && round->shards[i].node.address == stepping) {
        args[1] = "step";
        args.push_back(std::to_string(self->pending_step_ms_));
      }
      redis::CallOptions on;
      on.node = round->shards[i].node.address;
      self->client_.async_eval(
          script_epoch(), {std::move(key)}, std::move(args),
          [self, sent_mark, round, i, sent, stepping](std::error_code ec2, redis::Reply r) {
            round->replies[i] = {ec2, std::move(r)};
            if (--round->left == 0)
              self->on_cluster_checked(sent_mark, sent, stepping, std::move(round->shards), std::move(round->replies));
          },
          on);
    }
  });
}

bool StateGate::retry_after_flap(std::uint64_t sent_mark) {
  if (mark() == sent_mark) return false;
  // Sent on one connection, answered on another (or a reconnect came in
  // between): we cannot tell which server answered. Ask again.
  if (++retries_ <= kMaxCheckRetries) {
    check();
  } else {
    settle(make_error_code(errc::connection_lost),
           fmt::format("the connection to {} kept reconnecting while its lock state was checked", client_.address()),
           ms(0));
  }
  return true;
}

void StateGate::on_checked(std::uint64_t sent_mark, std::chrono::steady_clock::time_point sent, bool stepping,
                           std::error_code ec, redis::Reply r) {
  if (ec) return settle(ec, r.str, ms(0));
  if (retry_after_flap(sent_mark)) return;
  const auto c = Checked::parse(r);
  if (!c)
    return settle(make_error_code(errc::protocol_error),
                  "unexpected reply to the lock-state check: " + to_debug_string(r), ms(0));
  if (stepping) pending_step_ms_ = 0;
  // The check's own reading of the server's clock; a step it shows (or one
  // found while it was on its way) is written by a check of its own.
  if (c->now_us) clock_sample(*c->now_us, sent, std::chrono::steady_clock::now());
  if (pending_step_ms_ > 0) {
    retries_ = 0;
    return check();
  }
  if (c->role != "master") {
    ticket_.reset();
    return settle(make_error_code(errc::server_busy),
                  fmt::format("{} is a {}, not a primary: no grants from it", client_.address(), c->role),
                  kFailoverRetry);
  }
  server_version_ = c->version;
  aof_enabled_ = c->aof;
  auto t = std::make_shared<Ticket>();
  t->mark = sent_mark;
  t->clock_gen = clock_gen_;
  t->epoch = c->id;
  if (c->evicting) t->evicted = c->evicted;
  t->evicted_count = c->evicted;
  apply(std::move(t), c->left, c->reason);
}

void StateGate::on_cluster_checked(std::uint64_t sent_mark, std::chrono::steady_clock::time_point sent,
                                   const std::string& stepping, std::vector<ShardCheck> shards,
                                   std::vector<std::pair<std::error_code, redis::Reply>> replies) {
  if (retry_after_flap(sent_mark)) return;
  // Each primary's own reading of its clock; a step written to its record
  // is done with, one found now (or while the check was on its way) is
  // written by a check of its own.
  const auto received = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (replies[i].first) continue;
    const auto c = Checked::parse(replies[i].second);
    if (!c) continue;
    if (!stepping.empty() && shards[i].node.address == stepping && pending_step_node_ == stepping) pending_step_ms_ = 0;
    if (c->now_us) node_clock_sample(shards[i].node.address, *c->now_us, sent, received);
  }
  if (pending_step_ms_ > 0) {
    retries_ = 0;
    return check();
  }
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (!replies[i].first) continue;
    // No grants on this check. What the healthy shards said still vouches
    // for replies about their keys (checked_current(key)) while no
    // connection changes; a new epoch among them is left to a full check.
    auto part = std::make_shared<Ticket>();
    part->mark = sent_mark;
    for (std::size_t j = 0; j < shards.size(); ++j) {
      ShardCheck sc{shards[j].node, {}, {}};
      const auto c = replies[j].first ? std::nullopt : Checked::parse(replies[j].second);
      if (c && c->role == "master" && c->left.count() == 0 && c->id == last_epoch_for(sc.node)) sc.epoch = c->id;
      part->shards.push_back(std::move(sc));
    }
    partial_ = std::move(part);
    const std::string& text = replies[i].second.str;
    return settle(replies[i].first, shards[i].node.address + ": " + text,
                  failover_reply(text) ? kFailoverRetry : ms(0));
  }
  auto t = std::make_shared<Ticket>();
  t->mark = sent_mark;
  ms left{0};
  std::string reason;
  bool aof = true;
  std::string version;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const auto& at = shards[i].node.address;
    const auto c = Checked::parse(replies[i].second);
    if (!c)
      return settle(make_error_code(errc::protocol_error),
                    fmt::format("{}: unexpected reply to the lock-state check: {}", at, to_debug_string(replies[i].second)),
                    ms(0));
    if (c->role != "master") {
      // The slot map said primary, the node says otherwise: a failover
      // under way. No grants until a check finds the map and the roles agree.
      ticket_.reset();
      return settle(make_error_code(errc::server_busy),
                    fmt::format("{} is a {}, not a primary: no grants from it", at, c->role), kFailoverRetry);
    }
    shards[i].epoch = c->id;
    if (c->evicting) shards[i].evicted = c->evicted;
    // The quarantine is the cluster's: the longest any shard asks for, so a
    // grant never has to know which shard a loss was on before it is asked.
    left = std::max(left, c->left);
    if (!c->reason.empty()) reason += (reason.empty() ? "" : "; ") + at + ": " + c->reason;
    // Replica confirmation by WAITAOF only where every shard has it.
    aof = aof && c->aof;
    if (version.empty() || !version_at_least(c->version, 7, 2)) version = c->version;
    t->epoch += (t->epoch.empty() ? "" : " ") + at + "=" + c->id;
  }
  server_version_ = version;
  aof_enabled_ = aof;
  t->shards = std::move(shards);
  apply(std::move(t), left, std::move(reason));
}

void StateGate::apply(std::shared_ptr<Ticket> t, ms left, std::string reason) {
  const auto now = clock_.now();
  const std::string old = ticket_ ? ticket_->epoch : last_epoch_;
  const std::string id = t->epoch;
  ticket_ = t;
  last_ = t;
  partial_.reset();
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
  if (left.count() > 0) return settle(make_error_code(errc::server_busy), refusal(left), left);
  settle({}, {}, ms(0));
}

void StateGate::settle(std::error_code ec, const std::string& detail, ms retry_in) {
  checking_ = false;
  auto waiting = std::move(waiting_);
  waiting_.clear();
  for (auto& cb : waiting) cb(ec, detail, retry_in, ec ? nullptr : ticket_);
}

void StateGate::warn(const std::string& line) const {
  if (client_.options().on_warning) client_.options().on_warning(line);
  else std::fprintf(stderr, "jobguard: warning: %s\n", line.c_str());
}

}  // namespace detail

void trust_new_server(redis::Client& client) {
  if (client.running_in_loop_thread())
    throw Error(errc::invalid_argument, "trust_new_server on the event-loop thread would deadlock");
  const auto max_ttl = client.options().lock_max_ttl;
  auto trust = [&](std::string key, std::string_view node, const std::string& address) {
    std::vector<std::string> args{std::to_string(max_ttl.count()), "trust"};
    redis::CallOptions on;
    on.node = node;
    const auto r = client.eval(detail::script_epoch(), {std::move(key)}, std::move(args), on);
    if (!r.is_array() || r.elements.size() < 8)
      throw Error(errc::protocol_error,
                  fmt::format("{}: unexpected reply to the lock-state record: {}", address, redis::to_debug_string(r)));
    if (r.elements[5].str != "master")
      throw Error(errc::invalid_argument,
                  fmt::format("{} is a {}: only a primary can be trusted as new", address, r.elements[5].str));
  };
  // On a cluster every primary's own record (StateGate::check_cluster).
  for (const auto& r : admin::lock_state_records(client)) trust(r.key, r.node, r.address);
}

}  // namespace jobguard
