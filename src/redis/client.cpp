// The client's lifecycle, submitting calls to its connections, and the
// blocking facade. Cluster routing: client_cluster.cpp; scripts, confirmed
// writes and commands in order: client_eval.cpp.
#include "jobguard/redis/client.hpp"

#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <thread>

#include "jobguard/error.hpp"
#include "redis/client_impl.hpp"
#include "redis/tls_context.hpp"

namespace asio = boost::asio;

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

}  // namespace jobguard::redis
