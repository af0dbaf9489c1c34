// The client's lifecycle, submitting calls to its connections, routing them
// on a Redis Cluster, and the blocking facade. Scripts, confirmed writes and
// commands in order: client_eval.cpp.
#include "jobguard/redis/client.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <charconv>
#include <chrono>
#include <future>
#include <thread>

#include <pthread.h>

#include "jobguard/error.hpp"
#include "redis/client_impl.hpp"
#include "redis/tls_context.hpp"

namespace asio = boost::asio;

namespace jobguard::redis {

using detail::Clock;

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

namespace {
// The loop of a client's own thread. With busy_poll, it goes on polling
// (epoll with a zero timeout) for that long after the last handler ran
// before it blocks: a reply that lands within the window is read at once
// instead of after the wake-up of a sleeping thread, which on a virtual
// machine costs tens of microseconds on each side of every round trip
// (docs/bench.md, "Semaphore"). A client with nothing in flight blocks once
// the window passes: an idle one pays a window of polling per wake-up.
void run_loop(asio::io_context& ctx, std::chrono::microseconds busy_poll) {
  if (busy_poll.count() == 0) {
    ctx.run();
    return;
  }
  using clock = std::chrono::steady_clock;
  while (!ctx.stopped()) {
    if (ctx.poll() > 0) continue;
    bool ran = false;
    for (const auto until = clock::now() + busy_poll; !ran && !ctx.stopped() && clock::now() < until;)
      ran = ctx.poll() > 0;
    // run_one() returns at once when the context was stopped or ran out of
    // work: the loop ends as run() would.
    if (!ran && !ctx.stopped()) ctx.run_one();
  }
}

void check_options(const ConnectionOptions& opts) {
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
  if (opts.busy_poll.count() < 0 || opts.busy_poll > kMaxBusyPoll)
    throw Error(errc::invalid_argument, fmt::format("busy_poll {}us is outside 0..{}us", opts.busy_poll.count(),
                                                    kMaxBusyPoll.count()));
  if (opts.subscriber_ping_interval.count() < 0)
    throw Error(errc::invalid_argument, "subscriber_ping_interval must be >= 0");
}
}  // namespace

void Client::Impl::init() {
  address = fmt::format("{}:{}", opts.host, opts.port);
  check_options(opts);
  if (opts.tls.enabled || opts.sentinel.tls) ssl = detail::make_tls_context(opts.tls);
  for (int i = 0; i < opts.connections; ++i) conns.push_back(std::make_shared<Connection>(*ctx, opts, ssl, stats));
  if (opts.cluster) {
    slot_owner.assign(detail::kClusterSlots, nullptr);
    nodes.emplace(address, conns.front());
  }
  asio::post(*ctx, [self = shared_from_this(), conns = conns] {
    for (auto& c : conns) c->start();
    if (self->opts.cluster) self->refresh_slots();
  });
}

std::string Client::Impl::current_address() const {
  if (opts.sentinel.sentinels.empty()) return address;
  return conns.front()->address();
}

Client::Impl::Connection& Client::Impl::pick() {
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

void Client::Impl::submit(std::string payload, Completion done, CallOptions o) {
  const auto timeout = o.timeout.count() > 0 ? o.timeout : opts.command_timeout;
  Request r;
  r.payload = std::move(payload);
  r.deadline = detail::Clock::now() + timeout;
  r.weight = o.weight < 1 ? 1 : o.weight;
  // The caller's completion goes in as is; the connection's multiplexer
  // classifies error replies, counts the call and builds its Error before it.
  r.done = std::move(done);
  if (closed.load()) return refuse_shutdown(r.done);
  if (o.fail_if_down) {
    if (Error e = down_error(); e) {
      // Posted: a completion never runs inside the call that started it
      // (an awaiting coroutine would be resumed inside its own co_await).
      asio::post(*ctx, [keep = shared_from_this(), r = std::move(r), e]() mutable {
        keep->refuse(r.done, e.code(), std::string(e.detail()));
      });
      return;
    }
  }
  if (opts.cluster && !o.node.empty()) return submit_to_node(std::move(r), o.node);
  if (on_loop()) return route(std::move(r));
  asio::post(*ctx, [keep = shared_from_this(), r = std::move(r)]() mutable {
    if (keep->closed.load()) return keep->refuse_shutdown(r.done);
    keep->route(std::move(r));
  });
}

void Client::Impl::submit_together(std::vector<Request> rs, CallOptions o, Connection* to) {
  auto refuse_all = [](Impl& self, std::vector<Request>& v, std::error_code ec, const std::string& why) {
    for (auto& r : v) self.refuse(r.done, ec, why);
  };
  if (closed.load()) return refuse_all(*this, rs, make_error_code(errc::shutdown), "client is shutting down");
  if (o.fail_if_down) {
    if (Error e = down_error(); e) {
      asio::post(*ctx, [keep = shared_from_this(), rs = std::move(rs), e, refuse_all]() mutable {
        refuse_all(*keep, rs, e.code(), std::string(e.detail()));
      });
      return;
    }
  }
  auto go = [this, to](std::vector<Request>& v) {
    Connection& c = to ? *to : pick_for(v.front().payload);
    for (auto& r : v) c.submit(std::move(r));
  };
  if (on_loop()) return go(rs);
  asio::post(*ctx, [this, keep = shared_from_this(), rs = std::move(rs), go, refuse_all]() mutable {
    if (closed.load()) return refuse_all(*this, rs, make_error_code(errc::shutdown), "client is shutting down");
    go(rs);
  });
}

void Client::Impl::close_all() {
  for (auto& c : conns) c->close();
  for (auto& [where, c] : nodes) c->close();
}

Error Client::Impl::down_error() const {
  for (const auto& c : conns)
    if (!c->known_down()) return Error();
  const std::string why = conns.front()->down_reason();
  return Error(errc::not_connected,
               fmt::format("no connection to {}{}; the call fails at once instead of waiting for a reconnect",
                           current_address(), why.empty() ? "" : " (last error: " + why + ")"),
               error_source::redis);
}

Client::Client(ConnectionOptions options) : impl_(std::make_shared<Impl>()) {
  impl_->opts = std::move(options);
  impl_->own_ctx = std::make_unique<asio::io_context>(1);
  impl_->ctx = impl_->own_ctx.get();
  impl_->work.emplace(impl_->ctx->get_executor());
  impl_->init();
  impl_->thread = std::thread([ctx = impl_->ctx, spin = impl_->opts.busy_poll] { run_loop(*ctx, spin); });
  // Named so `top -H` and /proc tell a spinning loop (busy_poll) from the rest.
  ::pthread_setname_np(impl_->thread.native_handle(), "jobguard-io");
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

void Client::flush_writes() {
  if (!impl_->on_loop() || impl_->closed.load()) return;
  for (auto& c : impl_->conns) c->write_now();
  for (auto& [where, c] : impl_->nodes) c->write_now();
}

void Client::async_exec(Command cmd, Completion done, CallOptions opts) {
  impl_->submit(std::move(cmd).take_payload(), std::move(done), opts);
}

std::future<Reply> Client::exec_future(Command cmd, CallOptions opts) {
  auto p = std::make_shared<std::promise<Reply>>();
  auto f = p->get_future();
  std::string name = cmd.name();
  async_exec(
      std::move(cmd),
      [p, address = impl_->current_address(), name = std::move(name)](const Error& err, Reply r) {
        if (err) p->set_exception(std::make_exception_ptr(to_error(err.code(), r, address, name)));
        else p->set_value(std::move(r));
      },
      opts);
  return f;
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
      [p, address = impl_->current_address(), context = std::move(context)](const Error& err, Reply r) {
        if (err) p->set_exception(std::make_exception_ptr(to_error(err.code(), r, address, context)));
        else p->set_value(std::move(r));
      },
      opts);
  return f.get();
}

bool Client::wait_connected(std::chrono::milliseconds timeout) {
  const auto until = detail::Clock::now() + timeout;
  while (impl_->stats->connected.load() == 0) {
    if (detail::Clock::now() >= until) return false;
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

// --- Redis Cluster (opts.cluster): a connection per node, each call routed to
// its key's primary, redirects followed, the slot map kept from CLUSTER SHARDS
// (SLOTS before 7.0), and the primaries a per-node command must visit.

Client::Impl::Connection& Client::Impl::node(const std::string& host, std::uint16_t port) {
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

void Client::Impl::submit_to_node(Request r, std::string_view where) {
  const auto colon = where.rfind(':');
  std::uint16_t port = 0;
  const char* end = where.data() + where.size();
  if (colon == std::string_view::npos || colon == 0 || std::from_chars(where.data() + colon + 1, end, port).ptr != end ||
      port == 0)
    return refuse(r.done, make_error_code(errc::invalid_argument),
                  fmt::format("CallOptions::node \"{}\" is not host:port", where));
  // Copied: the view is the caller's, valid during the call only.
  auto to_node = [host = std::string(where.substr(0, colon)), port](Impl& self, Request& req) {
    self.node(host, port).submit(std::move(req));
  };
  if (on_loop()) return to_node(*this, r);
  asio::post(*ctx, [keep = shared_from_this(), r = std::move(r), to_node]() mutable {
    if (keep->closed.load()) return keep->refuse_shutdown(r.done);
    to_node(*keep, r);
  });
}

Client::Impl::Connection& Client::Impl::pick_for(std::string_view payload) {
  if (!opts.cluster) return pick();
  const auto key = detail::routing_key(payload);
  if (!key) return pick();
  Connection* c = slot_owner[detail::key_slot(*key)];
  return c ? *c : pick();
}

void Client::Impl::refresh_slots() {
  if (refreshing || closed.load()) return;
  refreshing = true;
  Request r;
  r.payload = Command(slot_source.command()).payload();
  r.deadline = Clock::now() + opts.command_timeout;
  r.done = [self = shared_from_this()](const Error& err, const Reply& reply) {
    self->refreshing = false;
    if (self->closed.load()) return;
    const auto map = self->slot_source.parse(err.code(), reply, self->opts.host, self->opts.tls.enabled);
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

namespace {
// The primaries of a slot map, each with its ranges, sorted by address.
std::vector<PrimaryShard> primaries_of(const std::vector<detail::SlotRange>& map) {
  std::vector<PrimaryShard> out;
  for (const auto& range : map) {
    const std::string at = fmt::format("{}:{}", range.host, range.port);
    auto it = std::find_if(out.begin(), out.end(), [&](const PrimaryShard& p) { return p.address == at; });
    if (it == out.end()) it = out.insert(out.end(), PrimaryShard{at, {}});
    it->slots.emplace_back(range.first, range.last);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
  return out;
}
}  // namespace

void Client::Impl::ask_primaries(std::shared_ptr<detail::SlotMapSource> source, Client::PrimariesCompletion done) {
  if (!opts.cluster) {
    std::vector<PrimaryShard> one{PrimaryShard{current_address(), {{0, detail::kClusterSlots - 1}}}};
    return done(Error(), std::move(one));
  }
  if (closed.load()) return done(Error(errc::shutdown, "client is shutting down", error_source::redis), {});
  Request r;
  r.payload = Command(source->command()).payload();
  r.deadline = Clock::now() + opts.command_timeout;
  r.done = [self = shared_from_this(), source, done = std::move(done)](const Error& err, const Reply& reply) mutable {
    const auto map = source->parse(err.code(), reply, self->opts.host, self->opts.tls.enabled);
    if (map.empty() && source->retry_with_slots()) return self->ask_primaries(source, std::move(done));
    if (!map.empty()) return done(Error(), primaries_of(map));
    const std::string what = fmt::format("{} on {}", fmt::join(source->command(), " "), self->current_address());
    if (err)
      return done(Error(err.code(), fmt::format("{}: {}", what, reply.is_error() ? reply.str : err.code().message()),
                        error_source::redis),
                  {});
    done(Error(errc::protocol_error, fmt::format("{}: no slot map in the reply {}", what, to_debug_string(reply)),
               error_source::redis),
         {});
  };
  pick().submit(std::move(r));
}

void Client::Impl::route(Request r, int hops, Connection* to) {
  if (!opts.cluster) return pick().submit(std::move(r));
  Connection& c = to ? *to : pick_for(r.payload);
  auto payload = std::make_shared<const std::string>(r.payload);
  r.done = [self = shared_from_this(), payload, deadline = r.deadline, done = std::move(r.done), hops](
               const Error& err, Reply reply) mutable {
    if (err && reply.is_error() && hops < kMaxRedirects && !self->closed.load() &&
        self->reroute(payload, deadline, done, hops, reply))
      return;
    done(err, std::move(reply));
  };
  c.submit(std::move(r));
}

bool Client::Impl::reroute(const std::shared_ptr<const std::string>& payload, Clock::time_point deadline,
                           Completion& done, int hops, const Reply& reply) {
  // Built only when resent: `done` stays the caller's until then.
  auto resend = [&] {
    Request again;
    again.payload = *payload;
    again.deadline = deadline;
    again.done = std::move(done);
    return again;
  };
  if (auto rd = detail::parse_redirect(reply.str)) {
    auto again = resend();
    Connection& target = node(rd->host, rd->port);
    if (rd->kind == detail::Redirect::Kind::moved) {
      slot_owner[rd->slot] = &target;
      refresh_slots();
      route(std::move(again), hops + 1, &target);
      return true;
    }
    // ASK: this one command, on the importing node, after ASKING.
    Request asking;
    asking.payload = Command{"ASKING"}.payload();
    asking.deadline = deadline;
    asking.done = [](const Error&, const Reply&) {};
    target.submit(std::move(asking));
    route(std::move(again), hops + 1, &target);
    return true;
  }
  const auto prefix = reply.error_prefix();
  if (prefix != "TRYAGAIN" && prefix != "CLUSTERDOWN") return false;
  const auto backoff = std::chrono::milliseconds(10 << std::min(hops, 4));
  if (Clock::now() + backoff >= deadline) return false;
  auto timer = std::make_shared<asio::steady_timer>(*ctx, backoff);
  timer->async_wait([self = shared_from_this(), timer, again = resend(), hops](boost::system::error_code tec) mutable {
    if (tec || self->closed.load()) return self->refuse_shutdown(again.done);
    self->route(std::move(again), hops + 1);
  });
  return true;
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
  async_primaries([&p](const Error& err, std::vector<PrimaryShard> s) {
    if (err) p.set_exception(std::make_exception_ptr(err));
    else p.set_value(std::move(s));
  });
  std::vector<std::string> out;
  for (auto& shard : f.get()) out.push_back(std::move(shard.address));
  return out;
}

}  // namespace jobguard::redis
