#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <algorithm>
#include <array>
#include <random>
#include <vector>

#include "jobguard/detail/identity.hpp"
#include "jobguard/observe/metrics.hpp"
#include "lock/quarantine.hpp"
#include "lock/rwlock_internal.hpp"
#include "lock/service_impl.hpp"

namespace jobguard::detail {

namespace asio = boost::asio;

// One acquire in progress: the I/O shell around WaiterMachine. The
// machine decides (try, listen, sleep, use a grant, give up); this class
// passes the gate, sends the attempts, listens, arms the timer and builds the
// Lock. Lives on the loop thread; kept alive by its own pending operations.
class LockWaiter final : public LockService::Impl::WaiterBase, public std::enable_shared_from_this<LockWaiter> {
  using Machine = WaiterMachine;

 public:
  LockWaiter(std::shared_ptr<LockService> svc, std::string resource, LockOptions opts, LockService::AcquireHandler done)
      : svc_(std::move(svc)),
        clock_(svc_->clock()),
        resource_(std::move(resource)),
        opts_(std::move(opts)),
        done_(std::move(done)),
        m_(Machine::Config{opts_.ttl, opts_.wait, opts_.fair, opts_.backoff_min, opts_.backoff_max}) {}

  void start(LockService::Impl* impl) {
    impl_ = impl;
    confirmation_ = svc_->confirmation_for(opts_);
    const auto& k = svc_->keys();
    key_ = k.lock_key(resource_);
    token_ = new_token();
    started_ = clock_.now();
    metrics_ = &svc_->class_metrics(opts_.lock_class);
    if (opts_.permits > 0) {
      // A semaphore permit: always its own script, and a waiter keeps a place
      // in the permits' line under its first token (sem_acquire.lua).
      key_ = k.permit_holders_key(resource_);
      script_keys_ = {key_, k.fence_key(resource_), k.permit_line_key(resource_),
                      k.permit_line_expiry_key(resource_), k.permit_count_key(resource_)};
      if (opts_.wait.count() > 0) waiter_id_ = token_;
      return run(m_.start(started_));
    }
    if (rw()) {
      // A reader or the writer of a read-write lock: the permits' way, with
      // its own scripts and line (rw_acquire.lua).
      key_ = opts_.mode == LockMode::exclusive ? k.rw_writer_key(resource_) : k.rw_readers_key(resource_);
      script_keys_ = {k.rw_readers_key(resource_), k.rw_writer_key(resource_), k.fence_key(resource_),
                      k.rw_line_key(resource_), k.rw_line_expiry_key(resource_), k.rw_writers_line_key(resource_)};
      if (opts_.wait.count() > 0) waiter_id_ = token_;
      return run(m_.start(started_));
    }
    if (opts_.fence || opts_.fair) use_script();
    if (!opts_.fair && opts_.wait.count() > 0) {
      // A default-mode wait goes through acquire.lua from the first attempt:
      // a busy reply puts it in the line in the same step, so no release can
      // come between the two unseen. Its id is its first token (a discarded
      // grant changes the token, not the place).
      use_script();
      script_keys_.push_back(k.waiters_key(resource_));
      waiter_id_ = token_;
      // Our last release of it woke a waiter whose acquire is on its way.
      if (auto y = impl_->take_yield(resource_, started_)) m_.yield_until(*y);
    }
    if (opts_.fair) {
      // What a release needs to hand us the lock: our TTL, whether we want a
      // fence, where to tell us, and who we are (release.lua parses it).
      channel_ = impl_->grant_channel_for(resource_);
      entry_ = fmt::format("{} {} {} {}", opts_.ttl.count(), opts_.fence ? 1 : 0, channel_, token_);
    }
    run(m_.start(started_));
  }

  // acquire.lua's first four keys (a default-mode wait adds its line).
  void use_script() {
    if (!script_keys_.empty()) return;
    const auto& k = svc_->keys();
    script_keys_ = {key_, k.fence_key(resource_), k.queue_key(resource_), k.queue_expiry_key(resource_)};
  }

  void wake() override { run(m_.release_message(clock_.now())); }
  void on_grant(std::optional<std::int64_t> fence) override { run(m_.grant_message(clock_.now(), fence)); }
  const std::string& waiter_id() const noexcept override { return waiter_id_; }

 private:
  bool rw() const noexcept { return opts_.mode != LockMode::mutex; }
  // A semaphore permit or a read-write lock: holders in a zset, a line of
  // its own, renewed by sem_extend.lua with the holder's member.
  bool counted() const noexcept { return opts_.permits > 0 || rw(); }
  std::string member() const { return opts_.permits > 0 ? permit_member(token_, slot_) : token_; }

  // A reader's or a permit's token carries 128 more random bits: over 64
  // bytes, longer than zset-max-listpack-value's default, so Redis keeps the
  // readers' or the holders' zset as a skiplist and finds each member of a
  // coalesced call by its name in O(1), instead of searching a listpack of
  // every holder for each (docs/rwlock.md, docs/semaphore.md).
  std::string new_token() const {
    std::string t = make_token(opts_.job_id);
    if (opts_.mode == LockMode::shared || opts_.permits > 0) {
      std::array<unsigned char, 16> more{};
      detail::random_bytes(more.data(), more.size());
      detail::append_hex(t, more.data(), more.size());
    }
    return t;
  }

  static std::uint64_t seed() {
    // Seeded once per thread: a random_device per acquire costs more than the acquire.
    thread_local std::mt19937_64 rng{std::random_device{}()};
    return rng();
  }

  std::chrono::milliseconds waiter_lease() const {
    return std::max<std::chrono::milliseconds>(std::chrono::milliseconds(2000), opts_.backoff_max * 5);
  }

  // Carries out the machine's actions in order. An action that starts I/O
  // comes last in its list, so a completion that runs inline (and feeds the
  // machine again) never interleaves with the rest of a list.
  void run(const Machine::Actions& actions) {
    for (const auto& a : actions) {
      switch (a.kind) {
        case Machine::Action::send_attempt: attempt(); break;
        case Machine::Action::arm_timer: arm(a.at); break;
        case Machine::Action::cancel_timer:
          ++timer_gen_;
          if (timer_) timer_->cancel();
          break;
        case Machine::Action::subscribe: subscribe(); break;
        case Machine::Action::unsubscribe:
          impl_->unwatch(channel_, this, waiter_lease() * 2);
          if (opts_.fair) impl_->granted_by_token.erase(token_);
          break;
        case Machine::Action::discard_grant:
          release_grant();
          // A fresh token, so a late release of this one cannot delete the
          // next grant (with several connections their order is not kept). A
          // fair waiter keeps its token: it names its place in the queue.
          if (!opts_.fair) token_ = new_token();
          break;
        case Machine::Action::leave_queue: leave_queue(); break;
        case Machine::Action::abandon: impl_->abandon(token_, waiter_lease() * 2); break;
        case Machine::Action::pass_on_grant: svc_->async_release(resource_, token_, nullptr, opts_.fair); break;
        case Machine::Action::complete: complete(a); break;
      }
    }
  }

  void arm(Machine::time_point at) {
    if (!timer_) timer_.emplace(svc_->client().get_executor());
    // Timers run on the host's steady clock; the machine's instants are the
    // service's clock's, so the wait is what is left by that clock.
    const auto left = at - clock_.now();
    timer_->expires_after(left.count() > 0 ? left : Machine::time_point::duration::zero());
    timer_->async_wait([self = shared_from_this(), gen = ++timer_gen_](boost::system::error_code ec) {
      // A handler already queued when the timer was cancelled or re-armed
      // still runs with success: the generation tells it apart.
      if (ec || gen != self->timer_gen_) return;
      self->run(self->m_.timer_fired(self->clock_.now()));
    });
  }

  // Hands back a grant this waiter will not use (unchecked, unconfirmed).
  void release_grant() {
    if (opts_.permits > 0) {
      impl_->semaphore_calls->release(svc_->keys(), resource_, permit_member(token_, slot_), opts_.permits,
                                      nullptr);
      return;
    }
    if (rw()) return impl_->semaphore_calls->release_rw(svc_->keys(), resource_, token_, opts_.mode, nullptr);
    svc_->async_release(resource_, token_, nullptr, opts_.fair);
  }

  void subscribe() {
    // Only a waiter that waits sleeps: the jitter is drawn now, and a try-once
    // acquire, the common case, never pays for it. Likewise a plain waiter's
    // channel is built only now.
    m_.seed(seed());
    if (opts_.fair) impl_->granted_by_token[token_] = this;
    else if (opts_.permits > 0) channel_ = svc_->keys().permit_channel(resource_);
    else if (rw()) channel_ = svc_->keys().rw_channel(resource_);
    else channel_ = svc_->keys().channel(resource_);
    const auto heard = impl_->watch(channel_, this, sent_at_, opts_.fair);
    run(m_.subscribed(clock_.now(), heard));
  }

  void leave_queue() {
    // A release may have handed us the lock just now: pass it on.
    std::vector<std::string> keys = {script_keys_[2], script_keys_[3], key_};
    svc_->client().async_eval(lock_leave_script(), std::move(keys), {entry_, token_},
                              [svc = svc_, resource = resource_, token = token_](std::error_code ec, redis::Reply r) {
                                if (!ec && r.is_integer() && r.integer == 1)
                                  svc->async_release(resource, token, nullptr, true);
                              });
  }

  // Every attempt passes the lock-state gate first (lock/quarantine.hpp):
  // usually a few comparisons, a check of the server after a reconnect or
  // every `recheck`, a refusal while the server is in quarantine.
  void attempt() {
    if (auto t = gate_->ready()) {
      ticket_ = std::move(t);
      return send();
    }
    gate_->admit([self = shared_from_this()](std::error_code ec, const std::string& detail,
                                             std::chrono::milliseconds retry_in, StateGate::TicketPtr t) {
      if (self->m_.done()) return;
      if (ec) {
        // Posted: a refusal from the gate's fast path arrives inside
        // async_acquire itself, and a caller's completion must never run
        // before its initiating call returns (a coroutine would be resumed
        // inside its own co_await).
        asio::post(self->svc_->client().get_executor(), [self, ec, detail, retry_in] {
          self->ec_ = ec;
          self->detail_ = detail;
          self->run(self->m_.refused(self->clock_.now(), retry_in));
        });
        return;
      }
      self->ticket_ = std::move(t);
      self->send();
    });
  }

  void failed(std::error_code ec, std::string detail) {
    ec_ = ec;
    detail_ = std::move(detail);
    run(m_.reply(clock_.now(), Machine::Reply::error));
  }

  // A grant from a server the gate did not check (the reply came after a
  // reconnect) may come from one that lost its state: handed back unused
  // (discard_grant) and asked for again through the gate.
  Machine::Reply granted() const {
    return gate_->current(*ticket_) ? Machine::Reply::granted : Machine::Reply::unchecked_grant;
  }

  redis::Confirm confirm() const { return to_confirm(confirmation_, svc_->gate()); }

  // A grant in a reply, with the confirmation pipelined behind it. A grant
  // the gate refuses (unchecked) is handed back by the machine whatever the
  // replicas said; a checked one counts only once enough replicas have it.
  void granted_reply(std::optional<std::int64_t> fence, const redis::Confirmation& c) {
    const auto verdict = granted();
    if (verdict == Machine::Reply::granted && confirmation_.replicas > 0) {
      if (!accept(c, confirm())) return;
      confirmed_ = true;
    }
    run(m_.reply(clock_.now(), verdict, fence));
  }

  // False when the grant was not confirmed and the class is fail-closed: the
  // grant is then released and the acquire fails (told to the machine here).
  bool accept(const redis::Confirmation& c, const redis::Confirm& wanted) {
    if (c.met(wanted)) return true;
    const std::string why = redis::describe(c, wanted);
    if (confirmation_.on_unconfirmed == Unconfirmed::warn) {
      warn_line(svc_->client(), fmt::format("grant of {} on {} kept although not confirmed: {} (lock class '{}', "
                                            "on_unconfirmed=warn: a failover may grant it again)",
                                            key_, svc_->client().address(), why, opts_.lock_class));
      return true;
    }
    release_grant();
    if (!opts_.fair) token_ = new_token();
    failed(make_error_code(errc::server_busy), fmt::format("grant not confirmed by replicas: {}; released", why));
    return false;
  }

  void busy() {
    metrics_->busy_total.inc();
    run(m_.reply(clock_.now(), Machine::Reply::busy));
  }

  // A semaphore permit or a reader / the writer of a read-write lock: their
  // scripts take the same arguments but the fourth and answer alike.
  void send_permit() {
    const bool may_wait = opts_.wait.count() > 0;
    auto on_reply = [self = shared_from_this(), may_wait](std::error_code ec, redis::Reply r, redis::Confirmation c) {
      if (ec) return self->failed(ec, std::move(r.str));
      if (!r.is_array() || r.elements.size() < 2 || !r.elements[0].is_integer())
        return self->failed(make_error_code(errc::protocol_error),
                            std::string(self->rw() ? "unexpected reply to the read-write lock's acquire script: "
                                                   : "unexpected reply to the semaphore acquire script: ") +
                                to_debug_string(r));
      const auto& e = r.elements;
      if (e[0].integer == -1) {
        self->gate_->invalidate();
        return self->run(self->m_.reply(self->clock_.now(), Machine::Reply::retry));
      }
      if (e[0].integer == 1 && e.size() >= 4) {
        std::optional<std::int64_t> fence;
        if (e[1].integer >= 0) fence = e[1].integer;
        self->slot_ = static_cast<int>(e[2].integer);
        self->granted_permits_ = static_cast<int>(e[3].integer);
        return self->granted_reply(fence, c);
      }
      // In the line from now (the script put us there): a release wakes
      // us by name when a permit is ours, so polling only refreshes the
      // place and notices a lease that ended without a release.
      if (may_wait) {
        self->arrival_ = "in line";
        self->m_.in_line();
      }
      self->busy();
    };
    // Compared in the script, as acquire.lua's grants are (send()): one
    // server only, the record being in another slot on a cluster.
    static const std::string none;
    const std::string& epoch = gate_->watches_clock() ? ticket_->epoch : none;
    // Coalesced with this turn's other attempts on the resource (SemaphoreCalls).
    if (rw()) {
      std::vector<std::string> item = {token_,
                                       std::to_string(opts_.ttl.count()),
                                       opts_.fence ? "1" : "0",
                                       may_wait ? "1" : "0",
                                       std::to_string(waiter_lease().count()),
                                       waiter_id_};
      return impl_->semaphore_calls->acquire_rw(script_keys_, opts_.mode, ticket_->evicted_for(key_), epoch,
                                                confirm(), std::move(item), std::move(on_reply));
    }
    const detail::SemaphoreCalls::PermitTerms terms{.ttl_ms = opts_.ttl.count(),
                                                    .fence = opts_.fence,
                                                    .wait = may_wait,
                                                    .waiter_lease_ms = waiter_lease().count()};
    impl_->semaphore_calls->acquire(script_keys_, opts_.permits, ticket_->evicted_for(key_), epoch, confirm(), terms,
                                    token_, waiter_id_ == token_ ? std::string() : waiter_id_, std::move(on_reply));
  }

  void send() {
    sent_at_ = clock_.now();
    m_.sent(sent_at_);
    if (counted()) return send_permit();
    auto self = shared_from_this();
    const bool may_wait = opts_.wait.count() > 0;
    if (script_keys_.empty() && ticket_->evicted_for(key_).empty()) {
      // The plain form other clients (ioredis, node-redlock, Laravel) use too.
      redis::Command cmd{"SET", key_, token_, "NX", "PX", std::to_string(opts_.ttl.count())};
      svc_->client().async_exec_confirmed(
          std::move(cmd), confirm(), [self](std::error_code ec, redis::Reply r, redis::Confirmation c) {
            if (ec) return self->failed(ec, std::move(r.str));
            if (r.is_ok()) return self->granted_reply(std::nullopt, c);
            self->busy();
          });
      return;
    }
    // A server that evicts keys: the grant goes through acquire.lua, which
    // refuses it if anything was evicted since the gate's check.
    use_script();
    std::vector<std::string> args = {token_,
                                     std::to_string(opts_.ttl.count()),
                                     opts_.fence ? "1" : "0",
                                     opts_.fair ? "1" : "0",
                                     may_wait ? "1" : "0",
                                     std::to_string(waiter_lease().count()),
                                     entry_,
                                     ticket_->script_evicted_for(key_),
                                     waiter_id_,
                                     arrival_};
    // The grant carries the server's clock: a grant that reveals a step is
    // beside a holder whose key the step expired, and is handed back.
    const bool clock = gate_->watches_clock();
    std::vector<std::string> keys = script_keys_;
    if (clock) {
      args.emplace_back("1");
      // The record's epoch the grant was admitted under: another client may
      // have written a quarantine since this client's check (a clock step it
      // found, a restart), and the grant is then refused in the script rather
      // than at this client's next check. One server only: on a cluster the
      // record is in another slot than the lock.
      if (!ticket_->epoch.empty()) {
        if (keys.size() < 5) keys.push_back(svc_->keys().waiters_key(resource_));
        keys.emplace_back(kLockStateKey);
        args.push_back(ticket_->epoch);
      }
    }
    const auto steady_sent = std::chrono::steady_clock::now();
    svc_->client().async_eval_confirmed(
        lock_acquire_script(), std::move(keys), std::move(args), confirm(),
        [self, clock, steady_sent](std::error_code ec, redis::Reply r, redis::Confirmation c) {
          if (ec) return self->failed(ec, std::move(r.str));
          if (!r.is_array() || r.elements.size() < 2 || !r.elements[0].is_integer())
            return self->failed(make_error_code(errc::protocol_error),
                                "unexpected reply to the acquire script: " + to_debug_string(r));
          if (r.elements[0].integer == -1) {
            // Keys were evicted or the record changed since the gate's check:
            // check again (that starts or finds the quarantine).
            self->gate_->invalidate();
            return self->run(self->m_.reply(self->clock_.now(), Machine::Reply::retry));
          }
          if (r.elements[0].integer == 1) {
            if (clock && r.elements.size() > 2 && r.elements[2].is_integer())
              self->gate_->clock_sample(r.elements[2].integer, steady_sent, std::chrono::steady_clock::now());
            std::optional<std::int64_t> fence;
            if (r.elements[1].integer >= 0) fence = r.elements[1].integer;
            return self->granted_reply(fence, c);
          }
          // In the line: the arrival it was given keeps its place if a
          // release wakes it and a newcomer wins the race.
          if (r.elements.size() > 2 && r.elements[2].is_string()) {
            self->arrival_ = r.elements[2].str;
            self->m_.in_line();
          }
          self->busy();
        });
  }

  // A grant that did not come with a confirmed reply (a fair handoff by
  // another client's release, a grant message) is confirmed from here: a
  // compare-and-pexpire of our own, then WAIT on the same connection. WAIT
  // covers only what its connection wrote, and the handoff was written by
  // the releaser's; the pexpire comes after it in the replication stream,
  // so replicas that acknowledged it have the handoff too.
  void confirm_then_complete(Machine::Action a) {
    // The machine is done: nothing it armed may fire into it meanwhile.
    ++timer_gen_;
    if (timer_) timer_->cancel();
    const std::string ttl = std::to_string(opts_.ttl.count());
    const auto wanted = confirm();
    const std::string held = member();
    svc_->client().async_eval_views_confirmed(
        counted() ? sem_extend_script() : lock_extend_script(), {key_}, {held, ttl}, wanted,
        [self = shared_from_this(), a, wanted](std::error_code ec, redis::Reply r, redis::Confirmation c) mutable {
          if (ec) {
            self->release_grant();
            self->ec_ = ec;
            self->detail_ = std::move(r.str);
            return self->complete_failed();
          }
          if (!r.is_integer() || r.integer != 1) {
            self->ec_ = make_error_code(errc::lease_lost);
            self->detail_ = "the lock handed to this waiter was gone before replicas could confirm it";
            return self->complete_failed();
          }
          if (!c.met(wanted)) {
            if (self->confirmation_.on_unconfirmed == Unconfirmed::fail_closed) {
              self->release_grant();
              self->ec_ = make_error_code(errc::server_busy);
              self->detail_ = fmt::format("grant not confirmed by replicas: {}; released", redis::describe(c, wanted));
              return self->complete_failed();
            }
            self->accept(c, wanted);  // warns
          }
          self->confirmed_ = true;
          self->complete(a);
        });
  }

  void leave_line() {
    if (opts_.permits > 0) {
      // Both the place and its liveness entry, or a release wakes a waiter
      // that is gone and the permit idles until the entry expires.
      svc_->client().async_exec(redis::Command{"ZREM", script_keys_[2], waiter_id_}, [](std::error_code, redis::Reply) {});
      svc_->client().async_exec(redis::Command{"ZREM", script_keys_[3], waiter_id_}, [](std::error_code, redis::Reply) {});
    } else if (rw()) {
      // Likewise, and a writer's entry among the writers, all in one
      // script: one left behind without the others would stop the line
      // (rw_line.lua), and separate commands can be cut short by an exit.
      svc_->client().async_eval(detail::rw_leave_script(), {script_keys_[3], script_keys_[4], script_keys_[5]},
                                {waiter_id_}, [](std::error_code, redis::Reply) {});
    } else {
      svc_->client().async_exec(redis::Command{"ZREM", script_keys_.back(), waiter_id_},
                                [](std::error_code, redis::Reply) {});
    }
    arrival_.clear();
  }

  void complete_failed() {
    if (timer_) timer_->cancel();
    if (!arrival_.empty()) leave_line();
    auto done = std::move(done_);
    metrics_->redis_errors_total.inc();
    done(redis::to_error(ec_, redis::Reply::error_reply(std::move(detail_)), svc_->client().address(),
                         "acquire of " + key_),
         std::nullopt);
  }

  void complete(const Machine::Action& a) {
    if (a.result == Machine::Result::granted && confirmation_.replicas > 0 && !confirmed_)
      return confirm_then_complete(a);
    if (timer_) timer_->cancel();
    // Gave up, failed or was cancelled in line: leave it, or the next release
    // wakes nobody and the next waiter waits out its own backoff.
    if (a.result != Machine::Result::granted && !arrival_.empty()) leave_line();
    auto done = std::move(done_);
    if (a.result == Machine::Result::failed) {
      metrics_->redis_errors_total.inc();
      return done(redis::to_error(ec_, redis::Reply::error_reply(std::move(detail_)), svc_->client().address(),
                                  "acquire of " + key_),
                  std::nullopt);
    }
    metrics_->wait_seconds.observe(clock_.now() - started_);
    // Counted with the wait histogram (whose count is the acquire calls), so
    // contended / calls is the fleet's contention rate.
    if (m_.saw_busy()) metrics_->contended_total.inc();
    // Busy for the whole wait (or cancelled: the machine handed back any grant).
    if (a.result != Machine::Result::granted) return done(Error(), std::nullopt);
    metrics_->acquisitions_total.inc();
    // The waiter is finished: its strings move into the Lock, no copies.
    std::string epoch = ticket_ ? ticket_->epoch_for(key_) : std::string();
    auto lock = svc_->make_lock(std::move(resource_), std::move(key_), std::move(token_), a.fence(), opts_, a.at,
                                std::move(epoch), granted_permits_, slot_);
    done(Error(), std::move(lock));
  }

  std::shared_ptr<LockService> svc_;
  const MonotonicClock& clock_;
  std::shared_ptr<StateGate> gate_ = std::static_pointer_cast<StateGate>(svc_->gate());
  StateGate::TicketPtr ticket_;  // the gate's check the attempt in flight went out under
  LockService::Impl* impl_ = nullptr;
  std::string resource_;
  LockOptions opts_;
  LockService::AcquireHandler done_;
  Machine m_;
  // Only a waiter that has to wait needs a timer: try-once acquires skip it.
  std::optional<asio::steady_timer> timer_;
  std::uint64_t timer_gen_ = 0;
  std::string key_, token_, channel_, entry_;
  std::string waiter_id_, arrival_;  // default-mode wait: its place in the line (acquire.lua)
  std::vector<std::string> script_keys_;
  MonotonicClock::time_point started_, sent_at_;
  observe::LockClassMetrics* metrics_ = nullptr;
  std::error_code ec_;  // the failure complete(failed) reports
  std::string detail_;
  ReplicaConfirmation confirmation_;
  bool confirmed_ = false;  // the grant delivered came with enough acknowledgements
  int slot_ = -1, granted_permits_ = 0;  // a permit's grant (sem_acquire.lua)
};

std::shared_ptr<LockWaiter> make_waiter(std::shared_ptr<LockService> svc, std::string resource, LockOptions opts,
                                        LockService::AcquireHandler done) {
  return std::make_shared<LockWaiter>(std::move(svc), std::move(resource), std::move(opts), std::move(done));
}

void start_waiter(const std::shared_ptr<LockWaiter>& w, LockService::Impl* impl) { w->start(impl); }

}  // namespace jobguard::detail
