#include "jobguard/redis/client.hpp"

#include <fmt/format.h>

#include <charconv>
#include <openssl/ssl.h>

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
#include <random>
#include <thread>

#include "jobguard/error.hpp"
#include "jobguard/text.hpp"
#include "redis/multiplexer.hpp"
#include "redis/tls_context.hpp"

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace jobguard::redis {

namespace detail {
void throw_if_error(std::error_code ec, Reply& r) {
  if (ec) throw Error(ec, r.str);
}
}  // namespace detail

namespace {

using detail::Clock;
using detail::Multiplexer;

struct SharedStats {
  std::atomic<std::uint64_t> commands{0}, writes{0}, errors{0}, reconnects{0}, timeouts{0};
  std::atomic<int> connected{0};
};

// Every caller-visible completion passes here first (the multiplexer's hook,
// or directly for calls refused before reaching it).
void account(void* ctx, std::error_code& ec, const Reply& reply) {
  auto* st = static_cast<SharedStats*>(ctx);
  if (!ec && reply.is_error()) ec = detail::classify_error_reply(reply);
  st->commands.fetch_add(1, std::memory_order_relaxed);
  if (ec) st->errors.fetch_add(1, std::memory_order_relaxed);
  if (ec == errc::timeout) st->timeouts.fetch_add(1, std::memory_order_relaxed);
}

void refuse(SharedStats* st, Completion& done, std::error_code ec, const std::string& detail) {
  Reply r = Reply::error_reply(detail);
  account(st, ec, r);
  done(ec, std::move(r));
}

// One multiplexed connection. Lives on the event-loop thread only; every
// asynchronous operation holds a shared_ptr to it, so it outlives its handlers.
// It never refers back to the Client: the client may be gone while aborted
// handlers drain.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  enum class State { disconnected, connecting, handshaking, ready, closed };

  Connection(asio::io_context& ctx, const ConnectionOptions& opts, std::shared_ptr<asio::ssl::context> ssl,
             std::shared_ptr<SharedStats> stats)
      : ctx_(ctx),
        opts_(opts),
        ssl_(std::move(ssl)),
        stats_(std::move(stats)),
        resolver_(ctx),
        connect_timer_(ctx),
        reconnect_timer_(ctx),
        sweep_timer_(ctx),
        rng_(std::random_device{}()),
        where_(fmt::format("{}:{}", opts.host, opts.port)) {
    const auto timeout = opts_.command_timeout;
    sweep_tick_ = std::clamp<std::chrono::milliseconds>(timeout / 4, std::chrono::milliseconds(1),
                                                        std::chrono::milliseconds(10));
    mux_.set_hook(&account, stats_.get());
    // Without it one connection ping-pongs: the server idles while we run a
    // whole read's completions (64 resumed callers), then we idle while it
    // runs the batch they asked for. Sending every 16 completions' worth as
    // soon as it exists lets the two overlap: `jobguard bench --connections 1`
    // went from 79-108k to 141-180k lock ops/s on a 2-core machine (16:05 UTC
    // 2026-11-30; 4, 8 and 32 did about as well, none did worse over 2
    // connections). Order is kept: one write at a time, in submission order.
    mux_.set_flush(kFlushEvery, &Connection::flush_now, this);
  }

  static constexpr std::size_t kFlushEvery = 16;

  // From inside feed(), on the loop thread; the read handler holds us alive.
  static void flush_now(void* ctx) {
    auto* c = static_cast<Connection*>(ctx);
    if (c->state_ == State::ready && !c->mux_.write_in_progress()) c->do_write();
  }

  void start() { connect(); }

  std::size_t load() const noexcept { return mux_.pending(); }
  bool ready() const noexcept { return state_ == State::ready; }

  void submit(Multiplexer::Request r) {
    if (state_ == State::closed) return refuse(stats_.get(), r.done, make_error_code(errc::shutdown), "client is shutting down");
    // A misconfiguration (bad password, certificate rejected) will not fix
    // itself in the next few seconds: fail fast instead of at the deadline.
    if (state_ != State::ready && last_error_code_ && next_step_for(last_error_code_) == next_step::stop)
      return refuse(stats_.get(), r.done, last_error_code_, last_error_);
    mux_.enqueue(std::move(r));
    arm_sweep();
    schedule_write();
  }

  void close() {
    if (state_ == State::closed) return;
    if (state_ == State::ready) stats_->connected.fetch_sub(1);
    state_ = State::closed;
    boost::system::error_code ignored;
    resolver_.cancel();
    connect_timer_.cancel();
    reconnect_timer_.cancel();
    sweep_timer_.cancel();
    close_socket();
    mux_.fail_all(make_error_code(errc::shutdown), fmt::format("client closed; call to {} abandoned", where_));
  }

 private:
  // --- connecting -----------------------------------------------------------
  void connect() {
    if (state_ == State::closed) return;
    state_ = State::connecting;
    ++generation_;
    const auto gen = generation_;
    auto self = shared_from_this();
    connect_timer_.expires_after(opts_.connect_timeout);
    connect_timer_.async_wait([self, gen](boost::system::error_code ec) {
      if (ec || gen != self->generation_ || self->state_ == State::ready || self->state_ == State::closed) return;
      self->on_broken(make_error_code(errc::timeout),
                      fmt::format("connect to {} timed out after {} ms", self->where_,
                                  self->opts_.connect_timeout.count()));
    });
    resolver_.async_resolve(opts_.host, std::to_string(opts_.port),
                            [self, gen](boost::system::error_code ec, tcp::resolver::results_type results) {
                              if (gen != self->generation_ || self->state_ != State::connecting) return;
                              if (ec) {
                                self->on_broken(make_error_code(errc::not_connected),
                                                fmt::format("cannot resolve {}: {}", self->opts_.host, ec.message()));
                                return;
                              }
                              self->connect_to(results, gen);
                            });
  }

  void connect_to(const tcp::resolver::results_type& results, std::uint64_t gen) {
    auto self = shared_from_this();
    if (opts_.tls.enabled) {
      tls_ = std::make_shared<asio::ssl::stream<tcp::socket>>(ctx_, *ssl_);
      const std::string& sni = opts_.tls.server_name.empty() ? opts_.host : opts_.tls.server_name;
      // SSL_set_tlsext_host_name is a macro with a C cast; call what it expands to.
      SSL_ctrl(tls_->native_handle(), SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
               const_cast<char*>(sni.c_str()));
      if (opts_.tls.verify_peer) tls_->set_verify_callback(asio::ssl::host_name_verification(sni));
      asio::async_connect(tls_->lowest_layer(), results,
                          [self, gen, keep = tls_](boost::system::error_code ec, const tcp::endpoint&) {
                            if (gen != self->generation_ || self->state_ != State::connecting) return;
                            if (ec) return self->on_connect_error(ec);
                            self->tls_->lowest_layer().set_option(tcp::no_delay(true));
                            self->tls_->async_handshake(asio::ssl::stream_base::client,
                                                        [self, gen, keep](boost::system::error_code hec) {
                                                          if (gen != self->generation_ ||
                                                              self->state_ != State::connecting)
                                                            return;
                                                          if (hec) return self->on_tls_error(hec);
                                                          self->on_transport_up();
                                                        });
                          });
    } else {
      plain_ = std::make_shared<tcp::socket>(ctx_);
      asio::async_connect(*plain_, results, [self, gen, keep = plain_](boost::system::error_code ec,
                                                                      const tcp::endpoint&) {
        if (gen != self->generation_ || self->state_ != State::connecting) return;
        if (ec) return self->on_connect_error(ec);
        self->plain_->set_option(tcp::no_delay(true));
        self->on_transport_up();
      });
    }
  }

  void on_connect_error(boost::system::error_code ec) {
    on_broken(make_error_code(errc::not_connected), fmt::format("connect to {}: {}", where_, ec.message()));
  }

  void on_tls_error(boost::system::error_code ec) {
    // Certificate problems are configuration: fail calls fast (stop). Other
    // handshake failures (server restarting) are worth retrying.
    const bool verify = ec.category() == asio::error::get_ssl_category() &&
                        ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == SSL_R_CERTIFICATE_VERIFY_FAILED;
    on_broken(make_error_code(verify ? errc::tls_error : errc::not_connected),
              fmt::format("TLS handshake with {}: {}", where_, ec.message()));
  }

  void on_transport_up() {
    state_ = State::handshaking;
    mux_.reset_reader();
    start_read();
    auto self = shared_from_this();
    const auto gen = generation_;
    const auto deadline = Clock::now() + opts_.connect_timeout;
    std::vector<Command> hs;
    if (!opts_.password.empty()) {
      if (opts_.user.empty()) hs.push_back(Command{"AUTH", opts_.password});
      else hs.push_back(Command{"AUTH", opts_.user, opts_.password});
    }
    if (opts_.db != 0) hs.push_back(Command{"SELECT", std::to_string(opts_.db)});
    if (!opts_.client_name.empty()) hs.push_back(Command{"CLIENT", "SETNAME", opts_.client_name});
    if (hs.empty()) return on_ready();
    handshake_left_ = hs.size();
    for (auto& c : hs) {
      const std::string name = c.name() == "CLIENT" ? "CLIENT SETNAME" : c.name();
      Multiplexer::Request r;
      r.payload = c.payload();
      r.deadline = deadline;
      r.done = [self, gen, name](std::error_code ec, Reply reply) {
        if (gen != self->generation_ || self->state_ != State::handshaking) return;
        if (!ec && reply.is_error()) {
          ec = detail::classify_error_reply(reply);
          // AUTH against a server without a password is a configuration error too.
          if (name == "AUTH") ec = make_error_code(errc::auth_failed);
          const std::string who = self->opts_.user.empty() ? "" : fmt::format(" as user \"{}\"", escape_text(self->opts_.user, 64));
          const std::string msg =
              name == "AUTH" ? fmt::format("AUTH{} to {} rejected: {}", who, self->where_, reply.str)
                             : fmt::format("{} on {} failed: {}", name, self->where_, reply.str);
          self->last_error_code_ = ec;
          self->last_error_ = msg;
          // Nobody can succeed on this connection: fail the waiting calls now.
          self->mux_.fail_queued(ec, msg);
          self->on_broken(ec, msg);
          return;
        }
        if (ec) return;  // the connection broke; on_broken already ran
        if (--self->handshake_left_ == 0) self->on_ready();
      };
      mux_.enqueue_front(std::move(r));
    }
    arm_sweep();
    schedule_write();
  }

  void on_ready() {
    connect_timer_.cancel();
    state_ = State::ready;
    stats_->connected.fetch_add(1);
    if (ever_connected_) stats_->reconnects.fetch_add(1);
    ever_connected_ = true;
    attempt_ = 0;
    last_error_code_ = {};
    last_error_.clear();
    schedule_write();
  }

  // --- failure and reconnection ---------------------------------------------
  void on_broken(std::error_code ec, const std::string& why) {
    if (state_ == State::closed || state_ == State::disconnected) return;
    if (state_ == State::ready) stats_->connected.fetch_sub(1);
    const bool was_ready = state_ == State::ready;
    state_ = State::disconnected;
    ++generation_;
    connect_timer_.cancel();
    close_socket();
    if (!last_error_code_ || next_step_for(ec) == next_step::stop) {
      last_error_code_ = ec;
      last_error_ = why;
    } else if (next_step_for(last_error_code_) != next_step::stop) {
      last_error_code_ = ec;
      last_error_ = why;
    }
    // Unconditionally: even with nothing in flight (every reply already read)
    // the old write's completion may still be pending, and it will never run
    // for this generation; a stale `writing` flag would block the next
    // connection's handshake forever.
    mux_.fail_in_flight(make_error_code(errc::connection_lost),
                        fmt::format("{}; the call was in flight and may or may not have run", why));
    if (was_ready) {
      // Calls submitted to this connection but not yet written: they were
      // issued against a live connection, so they fail now rather than
      // silently waiting out their deadline on the next one.
      mux_.fail_queued(make_error_code(errc::connection_lost), fmt::format("{}; the call was not sent", why));
    } else if (next_step_for(last_error_code_) == next_step::stop) {
      // A rejected certificate or password will not fix itself before the
      // deadline: callers waiting for this connection learn it now.
      mux_.fail_queued(last_error_code_, last_error_);
    }
    schedule_reconnect();
  }

  void schedule_reconnect() {
    const auto cap = std::min<long long>(opts_.reconnect_max.count(),
                                         opts_.reconnect_min.count() << std::min(attempt_, 16));
    ++attempt_;
    std::uniform_int_distribution<long long> jitter(0, std::max<long long>(cap, 1));
    reconnect_timer_.expires_after(std::chrono::milliseconds(jitter(rng_)));
    auto self = shared_from_this();
    reconnect_timer_.async_wait([self](boost::system::error_code ec) {
      if (!ec && self->state_ == State::disconnected) self->connect();
    });
  }

  std::shared_ptr<void> stream() const {
    if (tls_) return tls_;
    return plain_;
  }

  void close_socket() {
    boost::system::error_code ignored;
    if (plain_) {
      plain_->close(ignored);
      plain_.reset();
    }
    if (tls_) {
      tls_->lowest_layer().close(ignored);
      tls_.reset();
    }
    reading_ = false;
  }

  // --- I/O ------------------------------------------------------------------
  // Writes are deferred to the end of the current loop iteration, so every
  // command submitted by handlers running now (say 64 coroutines resumed by
  // one read) leaves in a single write.
  void schedule_write() {
    if (write_scheduled_ || mux_.write_in_progress()) return;
    if (state_ != State::ready && state_ != State::handshaking) return;
    write_scheduled_ = true;
    asio::post(ctx_, [self = shared_from_this()] {
      self->write_scheduled_ = false;
      self->do_write();
    });
  }

  void do_write() {
    const bool internal_only = state_ == State::handshaking;
    if (state_ != State::ready && !internal_only) return;
    if (!mux_.wants_write(internal_only)) return;
    const std::string& buf = mux_.prepare_write(internal_only);
    stats_->writes.fetch_add(1, std::memory_order_relaxed);
    const auto gen = generation_;
    auto handler = [self = shared_from_this(), gen, keep = stream()](boost::system::error_code ec, std::size_t) {
      if (gen != self->generation_) return;
      if (ec) {
        self->on_broken(make_error_code(errc::connection_lost),
                        fmt::format("write to {} failed: {}", self->where_, ec.message()));
        return;
      }
      self->mux_.write_done();
      self->do_write();
    };
    if (tls_) asio::async_write(*tls_, asio::buffer(buf), std::move(handler));
    else asio::async_write(*plain_, asio::buffer(buf), std::move(handler));
  }

  void start_read() {
    if (reading_) return;
    reading_ = true;
    const auto gen = generation_;
    auto handler = [self = shared_from_this(), gen, keep = stream()](boost::system::error_code ec, std::size_t n) {
      if (gen != self->generation_) return;
      self->reading_ = false;
      if (ec) {
        const std::string why = ec == asio::error::eof ? fmt::format("connection to {} closed by the server", self->where_)
                                                       : fmt::format("read from {} failed: {}", self->where_, ec.message());
        self->on_broken(make_error_code(errc::connection_lost), why);
        return;
      }
      if (auto perr = self->mux_.feed(self->rbuf_.data(), n)) {
        self->on_broken(perr, fmt::format("protocol error from {}: unparseable or unsolicited reply", self->where_));
        return;
      }
      if (gen != self->generation_) return;  // a completion closed us
      self->start_read();
    };
    if (tls_) tls_->async_read_some(asio::buffer(rbuf_), std::move(handler));
    else plain_->async_read_some(asio::buffer(rbuf_), std::move(handler));
  }

  // --- deadlines --------------------------------------------------------------
  void arm_sweep() {
    if (sweep_armed_ || state_ == State::closed) return;
    sweep_armed_ = true;
    sweep_timer_.expires_after(sweep_tick_);
    sweep_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      self->sweep_armed_ = false;
      if (ec || self->state_ == State::closed) return;
      const bool up = self->state_ == State::ready;
      const auto code = up ? make_error_code(errc::timeout) : make_error_code(errc::not_connected);
      const std::string detail =
          up ? fmt::format("no reply from {} before the deadline", self->where_)
             : fmt::format("no connection to {} before the deadline{}", self->where_,
                           self->last_error_.empty() ? "" : " (last error: " + self->last_error_ + ")");
      // Counted per call in Client::Impl::submit, before its completion runs,
      // so a caller that saw its timeout also sees it in stats().
      self->mux_.expire(Clock::now(), code, detail);
      if (self->mux_.pending() > 0) self->arm_sweep();
    });
  }

  asio::io_context& ctx_;
  const ConnectionOptions opts_;  // a copy: connections never refer back to the client
  std::shared_ptr<asio::ssl::context> ssl_;
  std::shared_ptr<SharedStats> stats_;
  tcp::resolver resolver_;
  // Shared with every pending operation's handler: an ssl::stream's
  // composed operations touch its internals when they complete, even when
  // aborted, so a stream dropped by close_socket() must live until then.
  std::shared_ptr<tcp::socket> plain_;
  std::shared_ptr<asio::ssl::stream<tcp::socket>> tls_;
  asio::steady_timer connect_timer_, reconnect_timer_, sweep_timer_;
  Multiplexer mux_;
  std::array<char, 64 * 1024> rbuf_{};
  std::mt19937_64 rng_;
  std::string where_;
  std::chrono::milliseconds sweep_tick_;
  State state_ = State::disconnected;
  std::uint64_t generation_ = 0;  // bumps on every (re)connect: stale handlers ignore themselves
  std::size_t handshake_left_ = 0;
  int attempt_ = 0;
  bool reading_ = false, write_scheduled_ = false, sweep_armed_ = false, ever_connected_ = false;
  std::error_code last_error_code_;
  std::string last_error_;
};

}  // namespace

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

  void init() {
    if (opts.command_timeout.count() <= 0)
      throw Error(errc::invalid_argument, "command_timeout must be positive (every call has a deadline)");
    if (opts.connect_timeout.count() <= 0) throw Error(errc::invalid_argument, "connect_timeout must be positive");
    if (opts.connections < 1) throw Error(errc::invalid_argument, "connections must be at least 1");
    if (opts.tls.enabled) ssl = detail::make_tls_context(opts.tls);
    for (int i = 0; i < opts.connections; ++i)
      conns.push_back(std::make_shared<Connection>(*ctx, opts, ssl, stats));
    asio::post(*ctx, [conns = conns] {
      for (auto& c : conns) c->start();
    });
  }

  bool on_loop() const { return ctx->get_executor().running_in_this_thread(); }

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
    // The caller's completion goes in as is; the connection's multiplexer
    // classifies error replies and counts the call (account()) before it.
    r.done = std::move(done);
    if (closed.load()) return refuse(stats.get(), r.done, make_error_code(errc::shutdown), "client is shutting down");
    if (on_loop()) {
      pick().submit(std::move(r));
    } else {
      asio::post(*ctx, [this, keep = shared_from_this(), r = std::move(r)]() mutable {
        if (closed.load())
          return refuse(stats.get(), r.done, make_error_code(errc::shutdown), "client is shutting down");
        pick().submit(std::move(r));
      });
    }
  }

  void close_all() {
    for (auto& c : conns) c->close();
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

void Client::async_eval(const Script& script, std::vector<std::string> keys, std::vector<std::string> args,
                        Completion done, CallOptions opts) {
  impl_->submit_eval(script, keys.size() + args.size(), eval_tail(keys, args), std::move(done), opts);
}

void Client::async_eval_views(const Script& script, std::initializer_list<std::string_view> keys,
                              std::initializer_list<std::string_view> args, Completion done, CallOptions opts) {
  impl_->submit_eval(script, keys.size() + args.size(), eval_tail(keys, args), std::move(done), opts);
}

std::future<Reply> Client::exec_future(Command cmd, CallOptions opts) {
  auto p = std::make_shared<std::promise<Reply>>();
  auto f = p->get_future();
  async_exec(
      std::move(cmd),
      [p](std::error_code ec, Reply r) {
        if (ec) p->set_exception(std::make_exception_ptr(Error(ec, r.str)));
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
  async_eval(
      script, std::move(keys), std::move(args),
      [p](std::error_code ec, Reply r) {
        if (ec) p->set_exception(std::make_exception_ptr(Error(ec, r.str)));
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
  s.timeouts = impl_->stats->timeouts.load();
  s.connected = impl_->stats->connected.load();
  return s;
}

std::string Client::address() const { return fmt::format("{}:{}", impl_->opts.host, impl_->opts.port); }

}  // namespace jobguard::redis
