#include "jobguard/detail/lock_compose.hpp"

#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <memory>

#include "jobguard/observe/metrics.hpp"
#include "jobguard/redis/client.hpp"
#include "lock/quarantine.hpp"

namespace jobguard {
namespace lock_scripts {
extern const std::string_view acquire;
extern const std::string_view release;
}  // namespace lock_scripts

namespace detail {
namespace {
void answer(LockService& svc, ComposedHandler done, Error e, ComposedResult r) {
  // Posted: a caller's completion never runs inside its initiating call.
  boost::asio::post(svc.client().get_executor(),
                    [done = std::move(done), e = std::move(e), r = std::move(r)]() mutable { done(e, std::move(r)); });
}
}  // namespace

std::string as_lua_function(std::string_view name, std::string_view body) {
  return fmt::format("local function {}(KEYS, ARGV)\n{}\nend\n", name, body);
}
// The named forms are how another part calls the lock: acquire.lua's and
// release.lua's argument layouts (and the values a try-once grant leaves
// unused) stay here, beside those scripts, not in the callers' scripts.
std::string acquire_as_function() {
  return as_lua_function("acquire", lock_scripts::acquire) +
         "local function grant_once(lock, fence_counter, record, token, ttl_ms, fence, evicted, epoch)\n"
         "  return acquire({lock, fence_counter, lock, lock, lock, record},\n"
         "                 {token, ttl_ms, fence, '0', '0', '0', '', evicted, '', '', '0', epoch})\n"
         "end\n";
}
std::string release_as_function() {
  return as_lua_function("release", lock_scripts::release) +
         "local function release_held(lock, waiters, token, channel, sharded)\n"
         "  return release({lock, waiters}, {token, channel, '', sharded})\n"
         "end\n";
}

namespace {
// One composed attempt's reply, as the script gives it ({status, fence or
// pttl, part}); the plain form's is made into one (status 3: granted, but a
// checked key exists). Copyable: it is the call's completion.
struct ComposedReply {
  std::shared_ptr<LockService> svc;
  std::shared_ptr<StateGate> gate;
  StateGate::TicketPtr ticket;
  MonotonicClock::time_point sent_at;
  std::string resource;
  LockOptions opts;
  std::string token;
  ComposedHandler done;

  void operator()(std::error_code ec, redis::Reply r) {
    auto& m = svc->class_metrics(opts.lock_class);
    const auto& client = svc->client();
    const std::string key = svc->keys().lock_key(resource);
    if (ec) {
      m.redis_errors_total.inc();
      return done(redis::to_error(ec, r, client.address(), "acquire of " + key), {});
    }
    if (!r.is_array() || r.elements.size() < 2 || !r.elements[0].is_integer())
      return done(Error(errc::protocol_error, fmt::format("{}: acquire of {}: unexpected reply to a composed script: {}",
                                                          client.address(), key, redis::to_debug_string(r))),
                  {});
    ComposedResult out;
    out.token = token;
    if (r.elements.size() > 2) out.part = std::move(r.elements[2]);
    switch (r.elements[0].integer) {
      case 2:
        out.status = ComposedStatus::declined;
        return done(Error(), std::move(out));
      case -1:
        gate->invalidate();  // evicted keys: the gate checks the server again
        return done(Error(), std::move(out));
      case 3:
        // The plain form's grant while the record or the key exists (finished
        // work delivered again, a run in progress elsewhere): handed back
        // unused, as below, and the caller's ordinary path reads what is
        // there. Sent before anything that path sends on the connection, the
        // release runs first; on another connection its acquire may still
        // find this grant and answer busy (the job comes back), never a
        // second holder.
        out.part = redis::Reply{};
        svc->async_release(resource, token, nullptr, false);
        return done(Error(), std::move(out));
      case 0: return busy(m, std::move(out));
      default: return granted(m, key, r.elements[1], std::move(out));
    }
  }

  void busy(observe::LockClassMetrics& m, ComposedResult out) {
    out.status = ComposedStatus::busy;
    m.busy_total.inc();
    if (opts.wait.count() == 0) {
      // A finished try-once acquire, counted as the waiter counts one.
      m.wait_seconds.observe(svc->clock().now() - sent_at);
      m.contended_total.inc();
    }
    done(Error(), std::move(out));
  }

  void granted(observe::LockClassMetrics& m, const std::string& key, const redis::Reply& f, ComposedResult out) {
    if (!gate->current(*ticket)) {
      // Granted on a connection the gate has not checked: maybe a server
      // that lost its state. Handed back unused, as the waiter does.
      svc->async_release(resource, token, nullptr, false);
      return done(Error(), std::move(out));
    }
    std::optional<std::int64_t> fence;
    if (f.is_integer() && f.integer >= 0) fence = f.integer;
    m.wait_seconds.observe(svc->clock().now() - sent_at);
    m.acquisitions_total.inc();
    out.status = ComposedStatus::granted;
    out.lock = svc->make_lock(std::move(resource), key, std::move(token), fence, opts, sent_at, ticket->epoch_for(key));
    done(Error(), std::move(out));
  }
};

redis::Reply integer_reply(std::int64_t v) {
  redis::Reply x;
  x.type = redis::Reply::Type::integer;
  x.integer = v;
  return x;
}

// SET NX PX's and EXISTS's replies as the composed script's would be.
redis::Reply plain_as_composed(std::vector<redis::Reply> rs, std::string part) {
  redis::Reply r;
  r.type = redis::Reply::Type::array;
  if (rs.size() != 2 || !(rs[0].is_nil() || rs[0].str == "OK") || !rs[1].is_integer()) {
    // Not what SET NX and EXISTS answer: reported as a script's would be.
    r.elements = std::move(rs);
    return r;
  }
  const bool granted = !rs[0].is_nil(), found = granted && rs[1].integer > 0;
  r.elements.push_back(integer_reply(found ? 3 : granted ? 1 : 0));
  r.elements.push_back(integer_reply(-1));
  if (granted && !found && !part.empty()) {
    redis::Reply p;
    p.type = redis::Reply::Type::string;
    p.str = std::move(part);
    r.elements.push_back(std::move(p));
  }
  return r;
}

// The plain form: SET NX PX, then EXISTS of the caller's checks, back to back
// on one connection (ComposedAttempt::plain_checks).
void send_plain(LockService& svc, const std::string& key, const std::string& token, const std::string& ttl,
                ComposedAttempt c, ComposedReply on_reply, const redis::CallOptions& call) {
  std::vector<redis::Command> cmds;
  cmds.emplace_back(std::initializer_list<std::string_view>{"SET", key, token, "NX", "PX", ttl});
  std::vector<std::string> exists{"EXISTS"};
  exists.insert(exists.end(), std::make_move_iterator(c.plain_checks.begin()),
                std::make_move_iterator(c.plain_checks.end()));
  cmds.emplace_back(exists);
  svc.client().async_exec_in_order(
      std::move(cmds),
      [on_reply = std::move(on_reply), part = std::move(c.plain_part)](std::error_code ec,
                                                                       std::vector<redis::Reply> rs) mutable {
        if (ec) {
          // In doubt, as a script call that failed: the failed command's
          // reply names the error (none when the connection failed it).
          for (auto& x : rs)
            if (x.is_error()) return on_reply(ec, std::move(x));
          return on_reply(ec, redis::Reply{});
        }
        on_reply({}, plain_as_composed(std::move(rs), std::move(part)));
      },
      call);
}
}  // namespace

void async_attempt_composed(LockService& svc, std::string resource, const LockOptions& opts, ComposedAttempt c,
                            ComposedHandler done) {
  KeyBuilder::validate_resource(resource);
  auto gate = std::static_pointer_cast<StateGate>(svc.gate());
  // Fair grants queue and wait; a gate that must check the server first (or
  // refuses grants) is the waiter's business: both take the ordinary path.
  // Replica-confirmed grants need their WAIT, and on a Redis Cluster the
  // caller's keys are in other slots than the lock's: the ordinary path.
  auto ticket = opts.fair || svc.confirmation_for(opts).replicas > 0 || svc.client().options().cluster
                    ? nullptr
                    : gate->ready();
  if (!ticket || opts.ttl > svc.max_ttl() || opts.ttl < std::chrono::milliseconds(10))
    return answer(svc, std::move(done), Error(), {});
  const auto& k = svc.keys();
  const std::string key = k.lock_key(resource), ttl = std::to_string(opts.ttl.count());
  std::string token = make_token(opts.job_id);
  const auto sent_at = svc.clock().now();
  // A try-once attempt on a client known to be down fails at once, as a
  // try-once acquire does: the caller's step-by-step path then meets the
  // outage itself, and a job does not wait out two deadlines for it.
  redis::CallOptions call;
  call.fail_if_down = opts.wait.count() == 0;
  const bool plain = !c.plain_checks.empty() && !opts.fence && ticket->evicted.empty();
  ComposedReply on_reply{svc.shared_from_this(), gate, ticket, sent_at, resource, opts, token, std::move(done)};
  if (plain) return send_plain(svc, key, token, ttl, std::move(c), std::move(on_reply), call);
  // One server here (a cluster took the ordinary path above): the record is
  // the one every client of it reads, compared in the script.
  std::vector<std::string> keys{key, k.fence_key(resource), kLockStateKey};
  std::vector<std::string> args{token, ttl, opts.fence ? "1" : "0", ticket->script_evicted_for(key), ticket->epoch};
  keys.insert(keys.end(), std::make_move_iterator(c.keys.begin()), std::make_move_iterator(c.keys.end()));
  args.insert(args.end(), std::make_move_iterator(c.args.begin()), std::make_move_iterator(c.args.end()));
  if (c.eval) return c.eval(std::move(keys), std::move(args), std::move(on_reply), call);
  svc.client().async_eval(*c.script, std::move(keys), std::move(args), std::move(on_reply), call);
}

}  // namespace detail

void Lock::released_by_script(bool ours) noexcept {
  if (!held_) return;
  held_ = false;
  metrics_->hold_seconds.observe(service_->clock().now() - acquired_at_);
  (ours ? metrics_->releases_total : metrics_->released_not_owner_total).inc();
}

}  // namespace jobguard
