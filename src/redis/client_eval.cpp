// Scripts (EVALSHA with its EVAL fallback, encoded straight from the
// caller's keys and arguments), writes followed by their confirmation (WAIT,
// WAITAOF), and commands in order on one connection.
#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <charconv>

#include "redis/client_impl.hpp"

namespace asio = boost::asio;

namespace jobguard::redis {

using detail::Clock;

namespace {
void append_bulk(std::string& out, std::string_view s) {
  char head[24];
  head[0] = '$';
  auto r = std::to_chars(head + 1, head + sizeof head - 2, s.size());
  *r.ptr++ = '\r';
  *r.ptr++ = '\n';
  out.append(head, static_cast<std::size_t>(r.ptr - head)).append(s).append("\r\n", 2);
}

// The part EVAL and EVALSHA share: numkeys, the keys, the arguments.
template <class Keys, class Args>
std::string eval_tail(const Keys& keys, const Args& args) {
  std::size_t size = 32;
  for (const auto& k : keys) size += k.size() + 16;
  for (const auto& a : args) size += a.size() + 16;
  std::string tail;
  tail.reserve(size);
  char nk[24];
  const auto nke = std::to_chars(nk, nk + sizeof nk, std::size(keys)).ptr;
  append_bulk(tail, std::string_view(nk, static_cast<std::size_t>(nke - nk)));
  for (const auto& k : keys) append_bulk(tail, k);
  for (const auto& a : args) append_bulk(tail, a);
  return tail;
}

// "*<argc>\r\n" + verb + body + tail: EVALSHA <sha> or EVAL <source>.
std::string eval_payload(std::size_t argc, std::string_view verb, std::string_view body, const std::string& tail) {
  std::string out;
  out.reserve(body.size() + tail.size() + 32);
  char buf[24];
  buf[0] = '*';
  auto r = std::to_chars(buf + 1, buf + sizeof buf - 2, argc);
  *r.ptr++ = '\r';
  *r.ptr++ = '\n';
  out.append(buf, static_cast<std::size_t>(r.ptr - buf));
  append_bulk(out, verb);
  append_bulk(out, body);
  out.append(tail);
  return out;
}

bool is_noscript(const Error& err, const Reply& r) {
  return err.code() == make_error_code(errc::script_error) && r.error_prefix() == "NOSCRIPT";
}

Confirmation parse_confirmation(const Error& err, const Reply& r, bool waitaof) {
  Confirmation c;
  if (err) {
    c.error = r.str;
    return c;
  }
  if (!waitaof && r.is_integer()) {
    c.replicas = static_cast<int>(r.integer);
    return c;
  }
  if (waitaof && r.is_array() && r.elements.size() == 2 && r.elements[0].is_integer() && r.elements[1].is_integer()) {
    c.local = static_cast<int>(r.elements[0].integer);
    c.replicas = static_cast<int>(r.elements[1].integer);
    return c;
  }
  c.error = "unexpected reply " + to_debug_string(r);
  return c;
}

// A confirmed call with no replicas asked for: the plain call.
Completion unconfirmed(ConfirmedCompletion done) {
  return [done = std::move(done)](const Error& err, Reply r) { done(err, std::move(r), Confirmation{}); };
}
}  // namespace

// The encoded tail is kept for the NOSCRIPT fallback: one string, instead of
// the callers' vectors or copies.
void Client::Impl::submit_eval(const Script& script, std::size_t nkeys_args, std::string tail, Completion done,
                               CallOptions call) {
  const std::size_t argc = 3 + nkeys_args;
  // Built before the call: the completion below takes `tail` by move, and
  // argument evaluation order is unspecified.
  std::string payload = eval_payload(argc, "EVALSHA", script.sha1(), tail);
  submit(
      std::move(payload),
      [impl = shared_from_this(), sp = &script, argc, tail = std::move(tail), done = std::move(done),
       call](const Error& err, Reply r) mutable {
        if (is_noscript(err, r)) {
          // The script cache was flushed (SCRIPT FLUSH, restart, failover):
          // EVAL runs it and loads it again for the next EVALSHA. The script is
          // referenced, not copied: scripts are long-lived (see the header).
          impl->submit(eval_payload(argc, "EVAL", sp->source(), tail), std::move(done), call);
          return;
        }
        done(err, std::move(r));
      },
      call);
}

std::string describe(const Confirm& c) {
  if (c.waitaof) return fmt::format("WAITAOF 1 {} {}", c.replicas, c.timeout.count());
  return fmt::format("WAIT {} {}", c.replicas, c.timeout.count());
}

std::string describe(const Confirmation& got, const Confirm& wanted) {
  if (got.replicas < 0)
    return fmt::format("the confirmation failed ({}): {}", describe(wanted), got.error.empty() ? "no reply" : got.error);
  if (wanted.waitaof && got.local < 1)
    return fmt::format("the primary did not fsync it to its AOF within {} ms ({}; {} of {} replicas did)",
                       wanted.timeout.count(), describe(wanted), got.replicas, wanted.replicas);
  return fmt::format("{} of {} replicas acknowledged within {} ms ({})", got.replicas, wanted.replicas,
                     wanted.timeout.count(), describe(wanted));
}

bool Client::Impl::resend_confirmed(const std::shared_ptr<Confirmed>& st, const Error& err, const Reply& r) {
  if (opts.cluster && err && r.is_error() && st->hops < kMaxRedirects && !closed.load()) {
    // Not run where it was sent: the pair goes again, together, to the
    // node that has the slot (after ASKING for an ASK).
    if (auto rd = detail::parse_redirect(r.str)) {
      ++st->hops;
      Connection& target = node(rd->host, rd->port);
      const bool ask = rd->kind == detail::Redirect::Kind::ask;
      if (!ask) {
        slot_owner[rd->slot] = &target;
        refresh_slots();
      }
      submit_confirmed(st, st->payload, &target, ask);
      return true;
    }
  }
  if (st->script && is_noscript(err, r)) {
    // As submit_eval: EVAL loads it; the confirmation follows the EVAL
    // (this pair's WAIT covered nothing of ours and is ignored).
    submit_confirmed(st, eval_payload(st->argc, "EVAL", st->script->source(), st->tail));
    return true;
  }
  return false;
}

void Client::Impl::submit_confirmed(const std::shared_ptr<Confirmed>& st, std::string payload, Connection* to,
                                    bool asking) {
  const auto gen = ++st->gen;
  const auto timeout = st->call.timeout.count() > 0 ? st->call.timeout : opts.command_timeout;
  const auto now = Clock::now();
  if (opts.cluster) st->payload = payload;
  std::vector<Request> rs(2);
  rs[0].payload = std::move(payload);
  rs[0].deadline = now + timeout;
  rs[0].done = [impl = shared_from_this(), st, gen](const Error& err, Reply r) {
    if (st->fired || gen != st->gen) return;
    if (impl->resend_confirmed(st, err, r)) return;
    if (err) {
      st->fired = true;
      Confirmation none;
      none.error = "the write failed";
      return st->done(err, std::move(r), std::move(none));
    }
    st->write = std::move(r);
    st->have_write = true;
  };
  const std::string n = std::to_string(st->confirm.replicas), t = std::to_string(st->confirm.timeout.count());
  rs[1].payload = st->confirm.waitaof ? Command{"WAITAOF", "1", n, t}.payload() : Command{"WAIT", n, t}.payload();
  // The server holds the reply for up to the confirmation's timeout.
  rs[1].deadline = now + timeout + st->confirm.timeout;
  rs[1].done = [st, gen](const Error& err, const Reply& r) {
    if (st->fired || gen != st->gen || !st->have_write) return;
    st->fired = true;
    st->done(Error(), std::move(st->write), parse_confirmation(err, r, st->confirm.waitaof));
  };
  if (asking) {
    Request a;
    a.payload = Command{"ASKING"}.payload();
    a.deadline = rs[0].deadline;
    a.done = [](const Error&, const Reply&) {};
    rs.insert(rs.begin(), std::move(a));
  }
  submit_together(std::move(rs), st->call, to);
}

void Client::async_exec_confirmed(Command cmd, Confirm confirm, ConfirmedCompletion done, CallOptions opts) {
  if (confirm.replicas <= 0) return async_exec(std::move(cmd), unconfirmed(std::move(done)), opts);
  auto st = std::make_shared<Impl::Confirmed>();
  st->confirm = confirm;
  st->done = std::move(done);
  st->call = opts;
  impl_->submit_confirmed(st, std::move(cmd).take_payload());
}

void Client::async_exec_in_order(std::vector<Command> cmds, InOrderCompletion done, CallOptions opts) {
  struct State {
    std::vector<Reply> replies;
    std::vector<Error> errors;
    std::size_t left = 0;
    InOrderCompletion done;
  };
  if (cmds.empty()) {
    asio::post(*impl_->ctx, [done = std::move(done)] { done(Error(), {}); });
    return;
  }
  auto st = std::make_shared<State>();
  st->replies.resize(cmds.size());
  st->errors.resize(cmds.size());
  st->left = cmds.size();
  st->done = std::move(done);
  const auto timeout = opts.timeout.count() > 0 ? opts.timeout : impl_->opts.command_timeout;
  const auto deadline = Clock::now() + timeout;
  std::vector<Impl::Request> rs(cmds.size());
  for (std::size_t i = 0; i < cmds.size(); ++i) {
    rs[i].payload = std::move(cmds[i]).take_payload();
    rs[i].deadline = deadline;
    // Every request of a connection completes once (its reply, its error or
    // its deadline), so the last one to complete answers for all.
    rs[i].done = [st, i](const Error& err, Reply r) {
      st->errors[i] = err;
      st->replies[i] = std::move(r);
      if (--st->left > 0) return;
      for (const auto& e : st->errors)
        if (e) return st->done(e, std::move(st->replies));
      st->done(Error(), std::move(st->replies));
    };
  }
  impl_->submit_together(std::move(rs), opts);
}

namespace {
template <class Keys, class Args>
void eval_confirmed(const std::shared_ptr<Client::Impl>& impl, const Script& script, const Keys& keys, const Args& args,
                    Confirm confirm, ConfirmedCompletion done, CallOptions opts) {
  auto st = std::make_shared<Client::Impl::Confirmed>();
  st->confirm = confirm;
  st->done = std::move(done);
  st->call = opts;
  st->script = &script;
  st->argc = 3 + std::size(keys) + std::size(args);
  st->tail = eval_tail(keys, args);
  std::string payload = eval_payload(st->argc, "EVALSHA", script.sha1(), st->tail);
  impl->submit_confirmed(st, std::move(payload));
}
}  // namespace

void Client::async_eval_confirmed(const Script& script, std::vector<std::string> keys, std::vector<std::string> args,
                                  Confirm confirm, ConfirmedCompletion done, CallOptions opts) {
  if (confirm.replicas <= 0)
    return async_eval(script, std::move(keys), std::move(args), unconfirmed(std::move(done)), opts);
  eval_confirmed(impl_, script, keys, args, confirm, std::move(done), opts);
}

void Client::async_eval_views_confirmed(const Script& script, std::initializer_list<std::string_view> keys,
                                        std::initializer_list<std::string_view> args, Confirm confirm,
                                        ConfirmedCompletion done, CallOptions opts) {
  if (confirm.replicas <= 0) return async_eval_views(script, keys, args, unconfirmed(std::move(done)), opts);
  eval_confirmed(impl_, script, keys, args, confirm, std::move(done), opts);
}

void Client::async_eval(const Script& script, std::vector<std::string> keys, std::vector<std::string> args,
                        Completion done, CallOptions opts) {
  impl_->submit_eval(script, keys.size() + args.size(), eval_tail(keys, args), std::move(done), opts);
}

void Client::async_eval_views(const Script& script, std::initializer_list<std::string_view> keys,
                              std::initializer_list<std::string_view> args, Completion done, CallOptions opts) {
  impl_->submit_eval(script, keys.size() + args.size(), eval_tail(keys, args), std::move(done), opts);
}

void Client::async_eval_views(const Script& script, std::span<const std::string_view> keys,
                              std::span<const std::string_view> args, Completion done, CallOptions opts) {
  impl_->submit_eval(script, keys.size() + args.size(), eval_tail(keys, args), std::move(done), opts);
}

}  // namespace jobguard::redis
