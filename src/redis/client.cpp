#include "jobguard/redis/client.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cstdio>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <optional>
#include <unordered_map>
#include <random>
#include <thread>

#include "jobguard/error.hpp"
#include "redis/cluster.hpp"
#include "redis/connection.hpp"
#include "redis/multiplexer.hpp"
#include "redis/tls_context.hpp"

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace jobguard::redis {

Error to_error(std::error_code ec, const Reply& reply, std::string_view address, std::string_view context) {
  // Transport failures already name the server; an error reply does not.
  const bool named = reply.str.find(address) != std::string::npos;
  std::string text;
  if (!context.empty()) text = named ? fmt::format("{}: ", context) : fmt::format("{} on {}: ", context, address);
  else if (!named) text = fmt::format("{}: ", address);
  text += reply.str;
  return Error(ec, text, error_source::redis);
}

namespace detail {
void throw_if_error(const Client& c, std::error_code ec, Reply& r) {
  if (ec) throw to_error(ec, r, c.address());
}
}  // namespace detail

using detail::Clock;
using detail::Connection;
using detail::refuse;
using detail::SharedStats;

// Shared with the handlers it posts: on a caller's io_context they may run
// after the Client is gone, and must find `closed` set, not freed memory.
namespace detail {
std::shared_ptr<asio::ssl::context> make_tls_context(const TlsOptions& tls) {
  auto ssl = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
  ssl->set_options(asio::ssl::context::no_sslv2 | asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                   asio::ssl::context::no_tlsv1_1);
  boost::system::error_code ec;
  if (tls.ca_file.empty()) ssl->set_default_verify_paths(ec);
  else ssl->load_verify_file(tls.ca_file, ec);
  if (ec) throw Error(errc::tls_error, fmt::format("cannot load CA file \"{}\": {}", tls.ca_file, ec.message()));
  if (!tls.cert_file.empty()) {
    ssl->use_certificate_chain_file(tls.cert_file, ec);
    if (ec) throw Error(errc::tls_error, fmt::format("cannot load certificate \"{}\": {}", tls.cert_file, ec.message()));
    ssl->use_private_key_file(tls.key_file.empty() ? tls.cert_file : tls.key_file, asio::ssl::context::pem, ec);
    if (ec) throw Error(errc::tls_error, fmt::format("cannot load private key \"{}\": {}", tls.key_file, ec.message()));
  }
  ssl->set_verify_mode(tls.verify_peer ? asio::ssl::verify_peer : asio::ssl::verify_none);
  return ssl;
}
}  // namespace detail

struct Client::Impl : std::enable_shared_from_this<Client::Impl> {
  ConnectionOptions opts;
  std::unique_ptr<asio::io_context> own_ctx;
  asio::io_context* ctx = nullptr;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::thread thread;
  std::shared_ptr<asio::ssl::context> ssl;
  std::shared_ptr<SharedStats> stats = std::make_shared<SharedStats>();
  std::vector<std::shared_ptr<Connection>> conns;
  std::size_t rr = 0;
  std::atomic<bool> closed{false};
  std::string address;  // "host:port", for messages

  void init() {
    address = fmt::format("{}:{}", opts.host, opts.port);
    if (opts.command_timeout.count() <= 0)
      throw Error(errc::invalid_argument, "command_timeout must be positive (every call has a deadline)");
    if (opts.connect_timeout.count() <= 0) throw Error(errc::invalid_argument, "connect_timeout must be positive");
    if (opts.connections < 1) throw Error(errc::invalid_argument, "connections must be at least 1");
    if (opts.max_reply_elements == 0) throw Error(errc::invalid_argument, "max_reply_elements must be positive");
    if (opts.max_bulk_bytes == 0) throw Error(errc::invalid_argument, "max_bulk_bytes must be positive");
    if (opts.max_reply_depth < 1 || opts.max_reply_depth > 7)
      throw Error(errc::invalid_argument,
                  fmt::format("max_reply_depth {} is outside 1..7 (the hiredis reader nests at most 7 deep)",
                              opts.max_reply_depth));
    if (opts.recycle_after_timeouts < 0) throw Error(errc::invalid_argument, "recycle_after_timeouts must be >= 0");
    if (opts.subscriber_ping_interval.count() < 0)
      throw Error(errc::invalid_argument, "subscriber_ping_interval must be >= 0");
    if (opts.tls.enabled || opts.sentinel.tls) ssl = detail::make_tls_context(opts.tls);
    for (int i = 0; i < opts.connections; ++i)
      conns.push_back(std::make_shared<Connection>(*ctx, opts, ssl, stats));
    if (opts.cluster) {
      slot_owner.assign(detail::kClusterSlots, nullptr);
      nodes.emplace(address, conns.front());
    }
    asio::post(*ctx, [self = shared_from_this(), conns = conns] {
      for (auto& c : conns) c->start();
      if (self->opts.cluster) self->refresh_slots();
    });
  }

  bool on_loop() const { return ctx->get_executor().running_in_this_thread(); }

  // Behind Sentinel the server moves: the primary the first connection last
  // dialled. Any thread.
  std::string current_address() const {
    if (opts.sentinel.sentinels.empty()) return address;
    return conns.front()->address();
  }

  // Loop thread only.
  Connection& pick() {
    if (conns.size() == 1) return *conns.front();
    Connection* best = nullptr;
    for (std::size_t i = 0; i < conns.size(); ++i) {
      auto& c = conns[(rr + i) % conns.size()];
      if (!best || (c->ready() && !best->ready()) || (c->ready() == best->ready() && c->load() < best->load()))
        best = c.get();
    }
    ++rr;
    return *best;
  }

  void submit_eval(const Script& script, std::size_t nkeys_args, std::string tail, Completion done,
                   CallOptions call);

  void submit(std::string payload, Completion done, CallOptions o) {
    const auto timeout = o.timeout.count() > 0 ? o.timeout : opts.command_timeout;
    detail::Multiplexer::Request r;
    r.payload = std::move(payload);
    r.deadline = Clock::now() + timeout;
    r.weight = o.weight < 1 ? 1 : o.weight;
    // The caller's completion goes in as is; the connection's multiplexer
    // classifies error replies and counts the call (account()) before it.
    r.done = std::move(done);
    if (closed.load()) return refuse(stats.get(), r.done, make_error_code(errc::shutdown), "client is shutting down");
    if (o.fail_if_down) {
      if (Error e = down_error(); e) {
        // Posted: a completion never runs inside the call that started it
        // (an awaiting coroutine would be resumed inside its own co_await).
        asio::post(*ctx, [keep = shared_from_this(), r = std::move(r), e]() mutable {
          refuse(keep->stats.get(), r.done, e.code(), std::string(e.detail()));
        });
        return;
      }
    }
    if (opts.cluster && !o.node.empty()) {
      const auto colon = o.node.rfind(':');
      std::uint16_t port = 0;
      const char* end = o.node.data() + o.node.size();
      if (colon == std::string::npos || colon == 0 ||
          std::from_chars(o.node.data() + colon + 1, end, port).ptr != end || port == 0)
        return refuse(stats.get(), r.done, make_error_code(errc::invalid_argument),
                      fmt::format("CallOptions::node \"{}\" is not host:port", o.node));
      auto to_node = [this, host = std::string(o.node.substr(0, colon)), port](detail::Multiplexer::Request& req) {
        node(host, port).submit(std::move(req));
      };
      if (on_loop()) return to_node(r);
      asio::post(*ctx, [this, keep = shared_from_this(), r = std::move(r), to_node]() mutable {
        if (closed.load())
          return refuse(stats.get(), r.done, make_error_code(errc::shutdown), "client is shutting down");
        to_node(r);
      });
      return;
    }
    if (on_loop()) {
      route(std::move(r));
    } else {
      asio::post(*ctx, [this, keep = shared_from_this(), r = std::move(r)]() mutable {
        if (closed.load())
          return refuse(stats.get(), r.done, make_error_code(errc::shutdown), "client is shutting down");
        route(std::move(r));
      });
    }
  }

  // --- Redis Cluster (opts.cluster) -------------------------------------------
  // Loop thread only. Node connections by "host:port" (the seed
  // connections among them), and each slot's primary as last learned
  // (CLUSTER SLOTS, MOVED); null = not known yet: the seed.
  std::unordered_map<std::string, std::shared_ptr<Connection>> nodes;
  std::vector<Connection*> slot_owner;
  bool refreshing = false;
  detail::SlotMapSource slot_source;  // CLUSTER SHARDS, else SLOTS
  static constexpr int kMaxRedirects = 5;

  Connection& node(const std::string& host, std::uint16_t port) {
    const std::string where = fmt::format("{}:{}", host, port);
    auto it = nodes.find(where);
    if (it != nodes.end()) return *it->second;
    ConnectionOptions no = opts;
    no.host = host;
    no.port = port;
    auto c = std::make_shared<Connection>(*ctx, no, ssl, stats);
    nodes.emplace(where, c);
    if (!closed.load()) c->start();
    return *c;
  }

  Connection& pick_for(std::string_view payload) {
    if (!opts.cluster) return pick();
    const auto key = detail::routing_key(payload);
    if (!key) return pick();
    Connection* c = slot_owner[detail::key_slot(*key)];
    return c ? *c : pick();
  }

  // Asks the seed for the slot map. One at a time; a MOVED asks again.
  void refresh_slots() {
    if (refreshing || closed.load()) return;
    refreshing = true;
    detail::Multiplexer::Request r;
    r.payload = Command(slot_source.command()).payload();
    r.deadline = Clock::now() + opts.command_timeout;
    r.done = [self = shared_from_this()](std::error_code ec, Reply reply) {
      self->refreshing = false;
      if (self->closed.load()) return;
      const auto map = self->slot_source.parse(ec, reply, self->opts.host, self->opts.tls.enabled);
      // A server before 7.0: the same again with CLUSTER SLOTS. A failed
      // call is not retried here: the next MOVED asks again.
      if (map.empty() && self->slot_source.retry_with_slots()) return self->refresh_slots();
      for (const auto& range : map) {
        Connection* c = &self->node(range.host, range.port);
        for (unsigned s = range.first; s <= range.last; ++s) self->slot_owner[s] = c;
      }
    };
    pick().submit(std::move(r));
  }

  // Client::async_primaries on the loop thread. A source per ask (the
  // client's own is refresh_slots'): SHARDS, and SLOTS where it is refused.
  void ask_primaries(std::shared_ptr<detail::SlotMapSource> source, Client::PrimariesCompletion done) {
    if (!opts.cluster) {
      std::vector<PrimaryShard> one{PrimaryShard{current_address(), {{0, detail::kClusterSlots - 1}}}};
      return done({}, {}, std::move(one));
    }
    if (closed.load()) return done(make_error_code(errc::shutdown), "client is shutting down", {});
    detail::Multiplexer::Request r;
    r.payload = Command(source->command()).payload();
    r.deadline = Clock::now() + opts.command_timeout;
    r.done = [self = shared_from_this(), source, done = std::move(done)](std::error_code ec, Reply reply) mutable {
      const auto map = source->parse(ec, reply, self->opts.host, self->opts.tls.enabled);
      if (map.empty() && source->retry_with_slots()) return self->ask_primaries(source, std::move(done));
      if (map.empty()) {
        const std::string what = fmt::format("{} on {}", fmt::join(source->command(), " "), self->current_address());
        if (ec) return done(ec, fmt::format("{}: {}", what, reply.is_error() ? reply.str : ec.message()), {});
        return done(make_error_code(errc::protocol_error),
                    fmt::format("{}: no slot map in the reply {}", what, to_debug_string(reply)), {});
      }
      std::vector<PrimaryShard> out;
      for (const auto& range : map) {
        const std::string at = fmt::format("{}:{}", range.host, range.port);
        auto it = std::find_if(out.begin(), out.end(), [&](const PrimaryShard& p) { return p.address == at; });
        if (it == out.end()) it = out.insert(out.end(), PrimaryShard{at, {}});
        it->slots.emplace_back(range.first, range.last);
      }
      std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
      done({}, {}, std::move(out));
    };
    pick().submit(std::move(r));
  }

  // Sends `r` to the node owning its key; MOVED and ASK are followed (at
  // most kMaxRedirects times, inside the call's deadline), TRYAGAIN and
  // CLUSTERDOWN retried with backoff until the deadline. A redirect means
  // the command did not run where it was sent, so it is safe to resend.
  void route(detail::Multiplexer::Request r, int hops = 0, Connection* to = nullptr) {
    if (!opts.cluster) return pick().submit(std::move(r));
    Connection& c = to ? *to : pick_for(r.payload);
    auto payload = std::make_shared<const std::string>(r.payload);
    r.done = [self = shared_from_this(), payload, deadline = r.deadline, done = std::move(r.done), hops](
                 std::error_code ec, Reply reply) mutable {
      if (ec && reply.is_error() && hops < kMaxRedirects && !self->closed.load()) {
        // Built only when resent: `done` stays ours until then.
        auto resend = [&] {
          detail::Multiplexer::Request again;
          again.payload = *payload;
          again.deadline = deadline;
          again.done = std::move(done);
          return again;
        };
        if (auto rd = detail::parse_redirect(reply.str)) {
          auto again = resend();
          Connection& target = self->node(rd->host, rd->port);
          if (rd->kind == detail::Redirect::Kind::moved) {
            self->slot_owner[rd->slot] = &target;
            self->refresh_slots();
            return self->route(std::move(again), hops + 1, &target);
          }
          // ASK: this one command, on the importing node, after ASKING.
          detail::Multiplexer::Request asking;
          asking.payload = Command{"ASKING"}.payload();
          asking.deadline = deadline;
          asking.done = [](std::error_code, Reply) {};
          target.submit(std::move(asking));
          return self->route(std::move(again), hops + 1, &target);
        }
        const auto prefix = reply.error_prefix();
        if (prefix == "TRYAGAIN" || prefix == "CLUSTERDOWN") {
          const auto backoff = std::chrono::milliseconds(10 << std::min(hops, 4));
          if (Clock::now() + backoff < deadline) {
            auto again = resend();
            auto timer = std::make_shared<asio::steady_timer>(*self->ctx, backoff);
            timer->async_wait([self, timer, again = std::move(again), hops](boost::system::error_code tec) mutable {
              if (tec || self->closed.load()) {
                return refuse(self->stats.get(), again.done, make_error_code(errc::shutdown), "client is shutting down");
              }
              self->route(std::move(again), hops + 1);
            });
            return;
          }
        }
      }
      done(ec, std::move(reply));
    };
    c.submit(std::move(r));
  }

  // Requests that must leave on one connection, back to back, in this order
  // (a write and the WAIT that confirms it: WAIT covers only what its own
  // connection wrote). Nothing can come between them: they are enqueued
  // together on the loop thread.
  void submit_together(std::vector<detail::Multiplexer::Request> rs, CallOptions o, Connection* to = nullptr) {
    auto refuse_all = [this](std::vector<detail::Multiplexer::Request>& v, std::error_code ec, const std::string& why) {
      for (auto& r : v) refuse(stats.get(), r.done, ec, why);
    };
    if (closed.load()) return refuse_all(rs, make_error_code(errc::shutdown), "client is shutting down");
    if (o.fail_if_down) {
      if (Error e = down_error(); e) {
        asio::post(*ctx, [keep = shared_from_this(), rs = std::move(rs), e, refuse_all]() mutable {
          refuse_all(rs, e.code(), std::string(e.detail()));
        });
        return;
      }
    }
    auto go = [this, to](std::vector<detail::Multiplexer::Request>& v) {
      Connection& c = to ? *to : pick_for(v.front().payload);
      for (auto& r : v) c.submit(std::move(r));
    };
    if (on_loop()) return go(rs);
    asio::post(*ctx, [this, keep = shared_from_this(), rs = std::move(rs), go, refuse_all]() mutable {
      if (closed.load()) return refuse_all(rs, make_error_code(errc::shutdown), "client is shutting down");
      go(rs);
    });
  }

  // A write followed by its confirmation (Client::async_*_confirmed).
  struct Confirmed {
    Confirm confirm;
    ConfirmedCompletion done;
    CallOptions call;
    bool fired = false, have_write = false;
    std::uint64_t gen = 0;   // a NOSCRIPT retry's (or a redirect's) pair replaces the first
    int hops = 0;            // Cluster redirects followed
    std::string payload;     // the write, for a redirect (Cluster only)
    Reply write;
    // For the EVAL fallback of an EVALSHA (null for a plain command).
    const Script* script = nullptr;
    std::size_t argc = 0;
    std::string tail;
  };
  void submit_confirmed(const std::shared_ptr<Confirmed>& st, std::string payload, Connection* to = nullptr,
                        bool asking = false);

  void close_all() {
    for (auto& c : conns) c->close();
    for (auto& [where, c] : nodes) c->close();
  }

  // Any thread: conns is fixed from init() until the destructor.
  Error down_error() const {
    for (const auto& c : conns)
      if (!c->known_down()) return Error();
    const std::string why = conns.front()->down_reason();
    return Error(errc::not_connected,
                 fmt::format("no connection to {}{}; the call fails at once instead of waiting for a reconnect",
                             current_address(), why.empty() ? "" : " (last error: " + why + ")"),
                 error_source::redis);
  }
};

Client::Client(ConnectionOptions options) : impl_(std::make_shared<Impl>()) {
  impl_->opts = std::move(options);
  impl_->own_ctx = std::make_unique<asio::io_context>(1);
  impl_->ctx = impl_->own_ctx.get();
  impl_->work.emplace(impl_->ctx->get_executor());
  impl_->init();
  impl_->thread = std::thread([ctx = impl_->ctx] { ctx->run(); });
}

Client::Client(asio::io_context& ctx, ConnectionOptions options) : impl_(std::make_shared<Impl>()) {
  impl_->opts = std::move(options);
  impl_->ctx = &ctx;
  impl_->init();
}

Client::~Client() {
  impl_->closed.store(true);
  if (impl_->own_ctx) {
    asio::post(*impl_->ctx, [impl = impl_.get()] {
      impl->close_all();
      impl->work.reset();
      impl->ctx->stop();
    });
    impl_->thread.join();
    // Handlers still queued hold connections; dropping them with the context
    // runs no completion (they were all failed by close_all()).
    impl_->conns.clear();
    impl_->nodes.clear();
    impl_->own_ctx.reset();
  } else if (impl_->on_loop()) {
    impl_->close_all();
  } else {
    std::promise<void> done;
    asio::post(*impl_->ctx, [impl = impl_.get(), &done] {
      impl->close_all();
      done.set_value();
    });
    // If the caller's loop is not running, pending calls are dropped with it;
    // bound the wait so a destructor never hangs.
    done.get_future().wait_for(std::chrono::seconds(5));
  }
}

const ConnectionOptions& Client::options() const noexcept { return impl_->opts; }
asio::any_io_executor Client::get_executor() const noexcept { return impl_->ctx->get_executor(); }
asio::io_context& Client::context() const noexcept { return *impl_->ctx; }
bool Client::running_in_loop_thread() const noexcept { return impl_->on_loop(); }

void Client::async_exec(Command cmd, Completion done, CallOptions opts) {
  impl_->submit(std::move(cmd).take_payload(), std::move(done), opts);
}

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
}  // namespace

// EVALSHA, and on NOSCRIPT the same call as EVAL. The encoded tail is kept
// for that fallback: one string, instead of the callers' vectors or copies.
void Client::Impl::submit_eval(const Script& script, std::size_t nkeys_args, std::string tail, Completion done,
                               CallOptions call) {
  const std::size_t argc = 3 + nkeys_args;
  // Built before the call: the completion below takes `tail` by move, and
  // argument evaluation order is unspecified.
  std::string payload = eval_payload(argc, "EVALSHA", script.sha1(), tail);
  submit(
      std::move(payload),
      [impl = shared_from_this(), sp = &script, argc, tail = std::move(tail), done = std::move(done),
       call](std::error_code ec, Reply r) mutable {
        if (ec == make_error_code(errc::script_error) && r.error_prefix() == "NOSCRIPT") {
          // The script cache was flushed (SCRIPT FLUSH, restart, failover):
          // EVAL runs it and loads it again for the next EVALSHA. The script is
          // referenced, not copied: scripts are long-lived (see the header).
          impl->submit(eval_payload(argc, "EVAL", sp->source(), tail), std::move(done), call);
          return;
        }
        done(ec, std::move(r));
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

namespace {
Confirmation parse_confirmation(std::error_code ec, const Reply& r, bool waitaof) {
  Confirmation c;
  if (ec) {
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
}  // namespace

void Client::Impl::submit_confirmed(const std::shared_ptr<Confirmed>& st, std::string payload, Connection* to,
                                    bool asking) {
  const auto gen = ++st->gen;
  const auto timeout = st->call.timeout.count() > 0 ? st->call.timeout : opts.command_timeout;
  const auto now = Clock::now();
  if (opts.cluster) st->payload = payload;
  std::vector<detail::Multiplexer::Request> rs(2);
  rs[0].payload = std::move(payload);
  rs[0].deadline = now + timeout;
  rs[0].done = [impl = shared_from_this(), st, gen](std::error_code ec, Reply r) {
    if (st->fired || gen != st->gen) return;
    if (impl->opts.cluster && ec && r.is_error() && st->hops < kMaxRedirects && !impl->closed.load()) {
      // Not run where it was sent: the pair goes again, together, to the
      // node that has the slot (after ASKING for an ASK).
      if (auto rd = detail::parse_redirect(r.str)) {
        ++st->hops;
        Connection& target = impl->node(rd->host, rd->port);
        const bool ask = rd->kind == detail::Redirect::Kind::ask;
        if (!ask) {
          impl->slot_owner[rd->slot] = &target;
          impl->refresh_slots();
        }
        impl->submit_confirmed(st, st->payload, &target, ask);
        return;
      }
    }
    if (st->script && ec == make_error_code(errc::script_error) && r.error_prefix() == "NOSCRIPT") {
      // As submit_eval: EVAL loads it; the confirmation follows the EVAL
      // (this pair's WAIT covered nothing of ours and is ignored).
      impl->submit_confirmed(st, eval_payload(st->argc, "EVAL", st->script->source(), st->tail));
      return;
    }
    if (ec) {
      st->fired = true;
      Confirmation none;
      none.error = "the write failed";
      return st->done(ec, std::move(r), std::move(none));
    }
    st->write = std::move(r);
    st->have_write = true;
  };
  const std::string n = std::to_string(st->confirm.replicas), t = std::to_string(st->confirm.timeout.count());
  rs[1].payload = st->confirm.waitaof ? Command{"WAITAOF", "1", n, t}.payload() : Command{"WAIT", n, t}.payload();
  // The server holds the reply for up to the confirmation's timeout.
  rs[1].deadline = now + timeout + st->confirm.timeout;
  rs[1].done = [st, gen](std::error_code ec, Reply r) {
    if (st->fired || gen != st->gen || !st->have_write) return;
    st->fired = true;
    st->done({}, std::move(st->write), parse_confirmation(ec, r, st->confirm.waitaof));
  };
  if (asking) {
    detail::Multiplexer::Request a;
    a.payload = Command{"ASKING"}.payload();
    a.deadline = rs[0].deadline;
    a.done = [](std::error_code, Reply) {};
    rs.insert(rs.begin(), std::move(a));
  }
  submit_together(std::move(rs), st->call, to);
}

void Client::async_exec_confirmed(Command cmd, Confirm confirm, ConfirmedCompletion done, CallOptions opts) {
  if (confirm.replicas <= 0) {
    return async_exec(
        std::move(cmd), [done = std::move(done)](std::error_code ec, Reply r) { done(ec, std::move(r), Confirmation{}); },
        opts);
  }
  auto st = std::make_shared<Impl::Confirmed>();
  st->confirm = confirm;
  st->done = std::move(done);
  st->call = opts;
  impl_->submit_confirmed(st, std::move(cmd).take_payload());
}

void Client::async_exec_in_order(std::vector<Command> cmds, InOrderCompletion done, CallOptions opts) {
  struct State {
    std::vector<Reply> replies;
    std::vector<std::error_code> ecs;
    std::size_t left = 0;
    InOrderCompletion done;
  };
  if (cmds.empty()) {
    asio::post(*impl_->ctx, [done = std::move(done)] { done({}, {}); });
    return;
  }
  auto st = std::make_shared<State>();
  st->replies.resize(cmds.size());
  st->ecs.resize(cmds.size());
  st->left = cmds.size();
  st->done = std::move(done);
  const auto timeout = opts.timeout.count() > 0 ? opts.timeout : impl_->opts.command_timeout;
  const auto deadline = Clock::now() + timeout;
  std::vector<detail::Multiplexer::Request> rs(cmds.size());
  for (std::size_t i = 0; i < cmds.size(); ++i) {
    rs[i].payload = std::move(cmds[i]).take_payload();
    rs[i].deadline = deadline;
    // Every request of a connection completes once (its reply, its error or
    // its deadline), so the last one to complete answers for all.
    rs[i].done = [st, i](std::error_code ec, Reply r) {
      st->ecs[i] = ec;
      st->replies[i] = std::move(r);
      if (--st->left > 0) return;
      std::error_code first;
      for (const auto& e : st->ecs)
        if (e) {
          first = e;
          break;
        }
      st->done(first, std::move(st->replies));
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
  if (confirm.replicas <= 0) {
    return async_eval(
        script, std::move(keys), std::move(args),
        [done = std::move(done)](std::error_code ec, Reply r) { done(ec, std::move(r), Confirmation{}); }, opts);
  }
  eval_confirmed(impl_, script, keys, args, confirm, std::move(done), opts);
}

void Client::async_eval_views_confirmed(const Script& script, std::initializer_list<std::string_view> keys,
                                        std::initializer_list<std::string_view> args, Confirm confirm,
                                        ConfirmedCompletion done, CallOptions opts) {
  if (confirm.replicas <= 0) {
    return async_eval_views(
        script, keys, args,
        [done = std::move(done)](std::error_code ec, Reply r) { done(ec, std::move(r), Confirmation{}); }, opts);
  }
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

std::future<Reply> Client::exec_future(Command cmd, CallOptions opts) {
  auto p = std::make_shared<std::promise<Reply>>();
  auto f = p->get_future();
  std::string name = cmd.name();
  async_exec(
      std::move(cmd),
      [p, address = impl_->current_address(), name = std::move(name)](std::error_code ec, Reply r) {
        if (ec) p->set_exception(std::make_exception_ptr(to_error(ec, r, address, name)));
        else p->set_value(std::move(r));
      },
      opts);
  return f;
}

void Client::async_primaries(PrimariesCompletion done) {
  asio::post(*impl_->ctx, [impl = impl_, done = std::move(done)]() mutable {
    impl->ask_primaries(std::make_shared<detail::SlotMapSource>(), std::move(done));
  });
}

std::vector<std::string> Client::primaries() {
  if (!impl_->opts.cluster) return {address()};
  if (impl_->on_loop())
    throw Error(errc::invalid_argument, "blocking Client::primaries called on the event-loop thread (would deadlock)");
  std::promise<std::vector<PrimaryShard>> p;
  auto f = p.get_future();
  async_primaries([&p, address = address()](std::error_code ec, const std::string& why, std::vector<PrimaryShard> s) {
    if (ec) p.set_exception(std::make_exception_ptr(Error(ec, why, error_source::redis)));
    else p.set_value(std::move(s));
  });
  std::vector<std::string> out;
  for (auto& shard : f.get()) out.push_back(std::move(shard.address));
  return out;
}

Reply Client::exec(Command cmd, CallOptions opts) {
  if (impl_->on_loop())
    throw Error(errc::invalid_argument, "blocking Client::exec called on the event-loop thread (would deadlock)");
  return exec_future(std::move(cmd), opts).get();
}

Reply Client::eval(const Script& script, std::vector<std::string> keys, std::vector<std::string> args,
                   CallOptions opts) {
  if (impl_->on_loop())
    throw Error(errc::invalid_argument, "blocking Client::eval called on the event-loop thread (would deadlock)");
  auto p = std::make_shared<std::promise<Reply>>();
  auto f = p->get_future();
  std::string context = keys.empty() ? "script" : "script on key " + keys.front();
  async_eval(
      script, std::move(keys), std::move(args),
      [p, address = impl_->current_address(), context = std::move(context)](std::error_code ec, Reply r) {
        if (ec) p->set_exception(std::make_exception_ptr(to_error(ec, r, address, context)));
        else p->set_value(std::move(r));
      },
      opts);
  return f.get();
}

bool Client::wait_connected(std::chrono::milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  while (impl_->stats->connected.load() == 0) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

ClientStats Client::stats() const {
  ClientStats s;
  s.commands = impl_->stats->commands.load();
  s.writes = impl_->stats->writes.load();
  s.errors = impl_->stats->errors.load();
  s.reconnects = impl_->stats->reconnects.load();
  s.connects = impl_->stats->connects.load();
  s.timeouts = impl_->stats->timeouts.load();
  s.recycled = impl_->stats->recycled.load();
  s.connected = impl_->stats->connected.load();
  return s;
}

std::string Client::address() const { return impl_->current_address(); }

Error Client::down_error() const { return impl_->down_error(); }

}  // namespace jobguard::redis
