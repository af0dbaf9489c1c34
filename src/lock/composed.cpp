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
std::string acquire_as_function() { return as_lua_function("acquire", lock_scripts::acquire); }
std::string release_as_function() { return as_lua_function("release", lock_scripts::release); }

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
  std::string token = make_token(opts.job_id);
  const auto sent_at = svc.clock().now();
  auto self = svc.shared_from_this();
  // A try-once attempt on a client known to be down fails at once, as a
  // try-once acquire does: the caller's step-by-step path then meets the
  // outage itself, and a job does not wait out two deadlines for it.
  redis::CallOptions call;
  call.fail_if_down = opts.wait.count() == 0;
  const std::string ttl = std::to_string(opts.ttl.count());
  const bool plain = !c.plain_checks.empty() && !opts.fence && ticket->evicted.empty();
  // The reply as the script gives it ({status, fence or pttl, part}); the
  // plain form's is made into one (status 3: granted, but a checked key
  // exists).
  auto on_reply = [self, gate, ticket, sent_at, resource, opts, token, done = std::move(done)](
                      std::error_code ec, redis::Reply r) mutable {
    auto& m = self->class_metrics(opts.lock_class);
    const auto& client = self->client();
    const std::string key = self->keys().lock_key(resource);
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
    const auto status = r.elements[0].integer;
    if (status == 2) {
      out.status = ComposedStatus::declined;
      return done(Error(), std::move(out));
    }
    if (status == -1) {
      gate->invalidate();  // evicted keys: the gate checks the server again
      return done(Error(), std::move(out));
    }
    if (status == 3) {
      // The plain form's grant while the record or the key exists (finished
      // work delivered again, a run in progress elsewhere): handed back
      // unused, as below, and the caller's ordinary path reads what is
      // there. Sent before anything that path sends on the connection, the
      // release runs first; on another connection its acquire may still
      // find this grant and answer busy (the job comes back), never a
      // second holder.
      out.part = redis::Reply{};
      self->async_release(resource, token, nullptr, false);
      return done(Error(), std::move(out));
    }
    if (status == 0) {
      out.status = ComposedStatus::busy;
      m.busy_total.inc();
      if (opts.wait.count() == 0) {
        // A finished try-once acquire, counted as the waiter counts one.
        m.wait_seconds.observe(self->clock().now() - sent_at);
        m.contended_total.inc();
      }
      return done(Error(), std::move(out));
    }
    if (!gate->current(*ticket)) {
      // Granted on a connection the gate has not checked: maybe a server
      // that lost its state. Handed back unused, as the waiter does.
      self->async_release(resource, token, nullptr, false);
      return done(Error(), std::move(out));
    }
    std::optional<std::int64_t> fence;
    if (r.elements[1].is_integer() && r.elements[1].integer >= 0) fence = r.elements[1].integer;
    m.wait_seconds.observe(self->clock().now() - sent_at);
    m.acquisitions_total.inc();
    out.status = ComposedStatus::granted;
    out.lock = self->make_lock(std::move(resource), key, std::move(token), fence, opts, sent_at, ticket->epoch_for(key));
    done(Error(), std::move(out));
  };
  if (!plain) {
    std::vector<std::string> keys{k.lock_key(resource), k.fence_key(resource)};
    keys.insert(keys.end(), std::make_move_iterator(c.keys.begin()), std::make_move_iterator(c.keys.end()));
    std::vector<std::string> args{token, ttl, opts.fence ? "1" : "0", ticket->script_evicted_for(k.lock_key(resource))};
    args.insert(args.end(), std::make_move_iterator(c.args.begin()), std::make_move_iterator(c.args.end()));
    if (c.eval) return c.eval(std::move(keys), std::move(args), std::move(on_reply), call);
    return svc.client().async_eval(*c.script, std::move(keys), std::move(args), std::move(on_reply), call);
  }

  std::vector<redis::Command> cmds;
  cmds.emplace_back(std::initializer_list<std::string_view>{"SET", k.lock_key(resource), token, "NX", "PX", ttl});
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
        auto integer = [](std::int64_t v) {
          redis::Reply x;
          x.type = redis::Reply::Type::integer;
          x.integer = v;
          return x;
        };
        redis::Reply r;
        r.type = redis::Reply::Type::array;
        if (rs.size() != 2 || !(rs[0].is_nil() || rs[0].str == "OK") || !rs[1].is_integer()) {
          // Not what SET NX and EXISTS answer: reported as a script's would be.
          r.elements = std::move(rs);
          return on_reply({}, std::move(r));
        }
        const bool granted = !rs[0].is_nil(), found = granted && rs[1].integer > 0;
        r.elements.push_back(integer(found ? 3 : granted ? 1 : 0));
        r.elements.push_back(integer(-1));
        if (granted && !found && !part.empty()) {
          redis::Reply p;
          p.type = redis::Reply::Type::string;
          p.str = std::move(part);
          r.elements.push_back(std::move(p));
        }
        on_reply({}, std::move(r));
      },
      call);
}

}  // namespace detail

void Lock::released_by_script(bool ours) noexcept {
  if (!held_) return;
  held_ = false;
  metrics_->hold_seconds.observe(service_->clock().now() - acquired_at_);
  (ours ? metrics_->releases_total : metrics_->released_not_owner_total).inc();
}

}  // namespace jobguard
