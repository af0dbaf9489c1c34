#include "redis/connection.hpp"

#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cstdio>

#include "jobguard/text.hpp"

namespace jobguard::redis::detail {

void refuse(SharedStats* st, Completion& done, std::error_code ec, const std::string& detail,
            std::string_view address) {
  Reply r = Reply::error_reply(detail);
  st->commands.fetch_add(1, std::memory_order_relaxed);
  st->errors.fetch_add(1, std::memory_order_relaxed);
  if (ec == errc::timeout) st->timeouts.fetch_add(1, std::memory_order_relaxed);
  const Error err = to_error(ec, r, address);
  done(err, std::move(r));
}

// Every caller-visible completion passes here first: the one place an error
// reply becomes an errc, and the call is counted.
void Connection::account(void* ctx, std::error_code& ec, const Reply& reply) {
  SharedStats* st = static_cast<Connection*>(ctx)->stats_.get();
  if (!ec && reply.is_error()) ec = classify_error_reply(reply);
  st->commands.fetch_add(1, std::memory_order_relaxed);
  if (!ec) return;
  st->errors.fetch_add(1, std::memory_order_relaxed);
  if (ec == errc::timeout) st->timeouts.fetch_add(1, std::memory_order_relaxed);
}

// The Error a failed call's completion gets, built once here (failures only).
Error Connection::describe(void* ctx, std::error_code ec, const Reply& reply) {
  return to_error(ec, reply, static_cast<Connection*>(ctx)->where_);
}

bool Connection::push_now(void* ctx, Reply& r) { return static_cast<Connection*>(ctx)->on_push_(r); }

// From inside feed(), on the loop thread; the read handler holds us alive.
void Connection::flush_now(void* ctx) { static_cast<Connection*>(ctx)->write_now(); }

Connection::Connection(asio::io_context& ctx, const ConnectionOptions& opts, std::shared_ptr<asio::ssl::context> ssl,
                       std::shared_ptr<SharedStats> stats)
    : ctx_(ctx),
      opts_(opts),
      ssl_(std::move(ssl)),
      stats_(std::move(stats)),
      resolver_(ctx),
      connect_timer_(ctx),
      reconnect_timer_(ctx),
      sweep_timer_(ctx),
      sentinel_timer_(ctx),
      mux_(detail::ReplyLimits{opts.max_reply_elements, opts.max_bulk_bytes, opts.max_reply_depth}),
      rng_(std::random_device{}()),
      where_(fmt::format("{}:{}", opts.host, opts.port)),
      sentinels_(opts.sentinel.sentinels) {
  if (!sentinels_.empty()) {
    std::string list;
    for (const auto& a : sentinels_) list += fmt::format("{}{}:{}", list.empty() ? "" : ",", a.host, a.port);
    where_ = fmt::format("the primary of '{}' (sentinels {})", opts.sentinel.master_name, list);
  }
  address_ = where_;
  const auto timeout = opts_.command_timeout;
  sweep_tick_ = std::clamp<std::chrono::milliseconds>(timeout / 4, std::chrono::milliseconds(1),
                                                      std::chrono::milliseconds(10));
  mux_.set_hook(&Connection::account, &Connection::describe, this);
  mux_.set_flush(kFlushEvery, &Connection::flush_now, this);
}

void Connection::set_push_handler(std::function<bool(Reply&)> fn) {
  on_push_ = std::move(fn);
  mux_.set_push(&Connection::push_now, this);
}

void Connection::submit(Multiplexer::Request r) {
  if (state_ == State::closed)
    return refuse(stats_.get(), r.done, make_error_code(errc::shutdown), "client is shutting down", where_);
  // A misconfiguration (bad password, certificate rejected) will not fix
  // itself in the next few seconds: fail fast instead of at the deadline.
  if (state_ != State::ready && last_error_code_ && next_step_for(last_error_code_) == next_step::stop)
    return refuse(stats_.get(), r.done, last_error_code_, last_error_, where_);
  mux_.enqueue(std::move(r));
  arm_sweep();
  schedule_write();
}

void Connection::write_now() {
  if (state_ == State::ready && !mux_.write_in_progress()) do_write();
}

void Connection::close() {
  if (state_ == State::closed) return;
  if (state_ == State::ready) stats_->connected.fetch_sub(1);
  state_ = State::closed;
  ++generation_;  // a read handler that called us (a push handler) stops there
  resolver_.cancel();
  connect_timer_.cancel();
  reconnect_timer_.cancel();
  sweep_timer_.cancel();
  sentinel_timer_.cancel();
  close_socket();
  mux_.fail_all(make_error_code(errc::shutdown), fmt::format("client closed; call to {} abandoned", where_));
  // A probe's questions hold the probe (their `drop` closes it), so a probe
  // whose questions are still queued when the loop stops would keep itself
  // alive for good: closed here, its questions fail, and it is freed.
  // (ask_sentinel does nothing more once we are closed.)
  auto probes = std::move(probes_);
  for (auto& w : probes)
    if (auto p = w.lock()) p->close();
}

// --- connecting ---------------------------------------------------------------

void Connection::connect() {
  if (state_ == State::closed) return;
  state_ = State::connecting;
  ++generation_;
  const auto gen = generation_;
  // Sentinel: the primary is asked for on every (re)connect, so a failover
  // (or the error that made us reconnect) moves us to the new primary.
  if (!sentinels_.empty()) {
    auto self = shared_from_this();
    return ask_sentinel(0, {}, [self, gen](const std::optional<SentinelOptions::Address>& a, const std::string& why) {
      if (gen != self->generation_ || self->state_ != State::connecting) return;
      if (!a) return self->on_broken(make_error_code(errc::not_connected), why);
      self->connect_host(a->host, a->port, gen);
    });
  }
  connect_host(opts_.host, opts_.port, gen);
}

void Connection::connect_host(const std::string& host, std::uint16_t port, std::uint64_t gen) {
  target_host_ = host;
  target_port_ = port;
  where_ = fmt::format("{}:{}", host, port);
  {
    std::lock_guard g(down_mu_);
    address_ = where_;
  }
  auto self = shared_from_this();
  connect_timer_.expires_after(opts_.connect_timeout);
  connect_timer_.async_wait([self, gen](boost::system::error_code ec) {
    if (ec || gen != self->generation_ || self->state_ == State::ready || self->state_ == State::closed) return;
    self->on_broken(make_error_code(errc::timeout), fmt::format("connect to {} timed out after {} ms", self->where_,
                                                                self->opts_.connect_timeout.count()));
  });
  resolver_.async_resolve(target_host_, std::to_string(target_port_),
                          [self, gen](boost::system::error_code ec, tcp::resolver::results_type results) {
                            if (gen != self->generation_ || self->state_ != State::connecting) return;
                            if (ec) {
                              self->on_broken(make_error_code(errc::not_connected),
                                              fmt::format("cannot resolve {}: {}", self->target_host_, ec.message()));
                              return;
                            }
                            self->connect_to(results, gen);
                          });
}

void Connection::connect_to(const tcp::resolver::results_type& results, std::uint64_t gen) {
  auto self = shared_from_this();
  if (opts_.tls.enabled) {
    tls_ = std::make_shared<asio::ssl::stream<tcp::socket>>(ctx_, *ssl_);
    const std::string& sni = opts_.tls.server_name.empty() ? target_host_ : opts_.tls.server_name;
    // SSL_set_tlsext_host_name is a macro with a C cast; call what it expands to.
    SSL_ctrl(tls_->native_handle(), SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
             const_cast<char*>(sni.c_str()));
    if (opts_.tls.verify_peer) tls_->set_verify_callback(asio::ssl::host_name_verification(sni));
    asio::async_connect(tls_->lowest_layer(), results,
                        [self, gen, keep = tls_](boost::system::error_code ec, const tcp::endpoint&) {
                          if (gen != self->generation_ || self->state_ != State::connecting) return;
                          if (ec) return self->on_connect_error(ec);
                          self->tls_->lowest_layer().set_option(tcp::no_delay(true));
                          self->set_keepalive(self->tls_->lowest_layer());
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
      // do_write's immediate writes must never block the loop.
      boost::system::error_code nb;
      self->plain_->non_blocking(true, nb);
      if (nb) return self->on_connect_error(nb);
      self->set_keepalive(*self->plain_);
      self->on_transport_up();
    });
  }
}

// Best effort: a kernel without the per-socket knobs keeps its defaults.
void Connection::set_keepalive(asio::basic_socket<tcp>& sock) {
  if (!opts_.keepalive) return;
  boost::system::error_code ignored;
  sock.set_option(asio::socket_base::keep_alive(true), ignored);
  const int fd = sock.native_handle();
  auto setopt = [fd](int name, long long v) {
    if (v <= 0) return;
    const int iv = static_cast<int>(std::min<long long>(v, 32767));
    ::setsockopt(fd, IPPROTO_TCP, name, &iv, sizeof iv);
  };
  setopt(TCP_KEEPIDLE, opts_.keepalive_idle.count());
  setopt(TCP_KEEPINTVL, opts_.keepalive_interval.count());
  setopt(TCP_KEEPCNT, opts_.keepalive_probes);
}

void Connection::warn(const std::string& line) {
  if (opts_.on_warning) opts_.on_warning(line);
  else std::fprintf(stderr, "jobguard: warning: %s\n", line.c_str());
}

void Connection::on_connect_error(boost::system::error_code ec) {
  on_broken(make_error_code(errc::not_connected), fmt::format("connect to {}: {}", where_, ec.message()));
}

void Connection::on_tls_error(boost::system::error_code ec) {
  // Certificate problems are configuration: fail calls fast (stop). Other
  // handshake failures (server restarting) are worth retrying.
  const bool verify = ec.category() == asio::error::get_ssl_category() &&
                      ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == SSL_R_CERTIFICATE_VERIFY_FAILED;
  on_broken(make_error_code(verify ? errc::tls_error : errc::not_connected),
            fmt::format("TLS handshake with {}: {}", where_, ec.message()));
}

void Connection::on_transport_up() {
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
  // A sentinel's answer may be stale (a failover in progress, an old
  // primary back as a replica): nothing is written before the server
  // itself says it is the primary.
  if (!sentinels_.empty()) hs.push_back(Command{"ROLE"});
  if (hs.empty()) return on_ready();
  handshake_left_ = hs.size();
  for (auto& c : hs) {
    Multiplexer::Request r;
    r.payload = c.payload();
    r.deadline = deadline;
    r.done = [self, gen, name = std::string(c.name() == "CLIENT" ? "CLIENT SETNAME" : c.name())](
                 std::error_code ec, const Reply& reply) {
      if (gen != self->generation_ || self->state_ != State::handshaking) return;
      self->on_handshake_reply(name, ec, reply);
    };
    mux_.enqueue_front(std::move(r));
  }
  arm_sweep();
  schedule_write();
}

void Connection::on_handshake_reply(const std::string& name, std::error_code ec, const Reply& reply) {
  if (!ec && reply.is_error()) {
    ec = detail::classify_error_reply(reply);
    // AUTH against a server without a password is a configuration error too.
    if (name == "AUTH") ec = make_error_code(errc::auth_failed);
    const std::string who = opts_.user.empty() ? "" : fmt::format(" as user \"{}\"", escape_text(opts_.user, 64));
    const std::string msg = name == "AUTH" ? fmt::format("AUTH{} to {} rejected: {}", who, where_, reply.str)
                                           : fmt::format("{} on {} failed: {}", name, where_, reply.str);
    last_error_code_ = ec;
    last_error_ = msg;
    // Nobody can succeed on this connection: fail the waiting calls now.
    mux_.fail_queued(ec, msg);
    on_broken(ec, msg);
    return;
  }
  if (ec) return;  // the connection broke; on_broken already ran
  if (name == "ROLE") {
    const bool primary = reply.is_array() && !reply.elements.empty() && reply.elements[0].str == "master";
    if (!primary) {
      const std::string role =
          reply.is_array() && !reply.elements.empty() ? reply.elements[0].str : to_debug_string(reply);
      const std::string msg = fmt::format("{} is a {} (ROLE), not the primary of '{}': not used; asking the "
                                          "sentinels again",
                                          where_, role, opts_.sentinel.master_name);
      last_error_code_ = make_error_code(errc::not_connected);
      last_error_ = msg;
      on_broken(make_error_code(errc::not_connected), msg);
      return;
    }
  }
  if (--handshake_left_ == 0) on_ready();
}

void Connection::on_ready() {
  connect_timer_.cancel();
  state_ = State::ready;
  stats_->connected.fetch_add(1);
  if (ever_connected_) stats_->reconnects.fetch_add(1);
  stats_->connects.fetch_add(1);
  ever_connected_ = true;
  attempt_ = 0;
  last_error_code_ = {};
  last_error_.clear();
  down_.store(false, std::memory_order_release);
  arm_sentinel_check();
  schedule_write();
  if (on_ready_) on_ready_();
}

// --- failure and reconnection -------------------------------------------------

void Connection::on_broken(std::error_code ec, const std::string& why) {
  if (state_ == State::closed || state_ == State::disconnected) return;
  if (state_ == State::ready) stats_->connected.fetch_sub(1);
  const bool was_ready = state_ == State::ready;
  state_ = State::disconnected;
  ++generation_;
  connect_timer_.cancel();
  close_socket();
  // A stop (a rejected password) is kept over a later transient failure: it
  // is what the user must fix.
  if (!last_error_code_ || next_step_for(ec) == next_step::stop || next_step_for(last_error_code_) != next_step::stop) {
    last_error_code_ = ec;
    last_error_ = why;
  }
  // Known down once an attempt to connect failed, not at the break itself:
  // a server that closed an idle connection is usually back within the
  // first reconnect (0-25 ms), and try-once calls should not fail for that.
  if (!was_ready) {
    {
      std::lock_guard g(down_mu_);
      down_why_ = last_error_;
    }
    down_.store(true, std::memory_order_release);
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
  if (on_fatal_ && next_step_for(ec) == next_step::stop) on_fatal_(Error(ec, why, error_source::redis));
  if (probe_) {
    // One answer or none: the caller asks the next sentinel.
    mux_.fail_queued(make_error_code(errc::not_connected), why);
    return;
  }
  schedule_reconnect();
}

void Connection::schedule_reconnect() {
  const auto cap =
      std::min<long long>(opts_.reconnect_max.count(), opts_.reconnect_min.count() << std::min(attempt_, 16));
  ++attempt_;
  std::uniform_int_distribution<long long> jitter(0, std::max<long long>(cap, 1));
  reconnect_timer_.expires_after(std::chrono::milliseconds(jitter(rng_)));
  auto self = shared_from_this();
  reconnect_timer_.async_wait([self](boost::system::error_code ec) {
    if (!ec && self->state_ == State::disconnected) self->connect();
  });
}

std::shared_ptr<void> Connection::stream() const {
  if (tls_) return tls_;
  return plain_;
}

void Connection::close_socket() {
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

// --- I/O ------------------------------------------------------------------------

// Writes are deferred to the end of the current loop iteration, so every
// command submitted by handlers running now (say 64 coroutines resumed by
// one read) leaves in a single write.
void Connection::schedule_write() {
  if (write_scheduled_ || mux_.write_in_progress()) return;
  if (state_ != State::ready && state_ != State::handshaking) return;
  write_scheduled_ = true;
  asio::post(ctx_, [self = shared_from_this()] {
    self->write_scheduled_ = false;
    self->do_write();
  });
}

void Connection::do_write() {
  const bool internal_only = state_ == State::handshaking;
  if (state_ != State::ready && !internal_only) return;
  if (!mux_.wants_write(internal_only)) return;
  const std::string& buf = mux_.prepare_write(internal_only);
  stats_->writes.fetch_add(1, std::memory_order_relaxed);
  // A plain socket is written at once, without blocking: on loopback or a
  // LAN the kernel takes the whole batch, and the write is over here. An
  // async_write would take the same bytes now but hold the connection as
  // writing until its handler has had a turn of the loop, so the commands
  // callers submit meanwhile wait for that turn, which costs guarded jobs a
  // second at high concurrency (docs/bench.md). What the kernel does not
  // take now (a full socket buffer), and any error, goes the async way: its
  // handler reports a broken connection as before, from the loop, never
  // from inside the call that submitted or from a read's completions.
  std::size_t sent = 0;
  if (plain_ && plain_->non_blocking()) {
    boost::system::error_code wec;
    sent = plain_->write_some(asio::buffer(buf), wec);
    if (sent == buf.size()) {
      mux_.write_done();
      return;
    }
  }
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
  else asio::async_write(*plain_, asio::buffer(buf.data() + sent, buf.size() - sent), std::move(handler));
}

void Connection::start_read() {
  if (reading_) return;
  reading_ = true;
  auto handler = [self = shared_from_this(), gen = generation_, keep = stream()](boost::system::error_code ec,
                                                                                  std::size_t n) {
    self->on_read(gen, ec, n);
  };
  if (tls_) tls_->async_read_some(asio::buffer(rbuf_), std::move(handler));
  else plain_->async_read_some(asio::buffer(rbuf_), std::move(handler));
}

void Connection::on_read(std::uint64_t gen, boost::system::error_code ec, std::size_t n) {
  if (gen != generation_) return;
  reading_ = false;
  if (ec) {
    const std::string why = ec == asio::error::eof ? fmt::format("connection to {} closed by the server", where_)
                                                   : fmt::format("read from {} failed: {}", where_, ec.message());
    on_broken(make_error_code(errc::connection_lost), why);
    return;
  }
  if (auto perr = mux_.feed(rbuf_.data(), n)) {
    if (gen != generation_) return;
    const std::string why =
        fmt::format("protocol error from {}: {}; connection dropped", where_, mux_.error_detail());
    warn(why);
    // Calls in flight on this connection fail with the protocol error
    // itself (not connection_lost): the server sent something we refuse.
    mux_.fail_in_flight(perr, why);
    mux_.fail_queued(perr, why);
    // Recorded as a lost connection, not as a stop: the next connection
    // may well be fine, and calls made meanwhile should wait for it.
    on_broken(make_error_code(errc::connection_lost), why);
    return;
  }
  if (gen != generation_) return;  // a completion closed us
  if (mux_.replies() != replies_seen_) {
    replies_seen_ = mux_.replies();
    consecutive_timeouts_ = 0;
  }
  start_read();
}

// --- deadlines --------------------------------------------------------------------

void Connection::arm_sweep() {
  if (sweep_armed_ || state_ == State::closed) return;
  sweep_armed_ = true;
  sweep_timer_.expires_after(sweep_tick_);
  sweep_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    self->sweep_armed_ = false;
    if (ec || self->state_ == State::closed) return;
    self->sweep();
    if (self->mux_.pending() > 0) self->arm_sweep();
  });
}

void Connection::sweep() {
  const bool up = state_ == State::ready;
  const auto code = up ? make_error_code(errc::timeout) : make_error_code(errc::not_connected);
  const std::string detail =
      up ? fmt::format("no reply from {} before the deadline", where_)
         : fmt::format("no connection to {} before the deadline{}", where_,
                       last_error_.empty() ? "" : " (last error: " + last_error_ + ")");
  // Counted per call by account(), before its completion runs, so a caller
  // that saw its timeout also sees it in stats().
  const std::size_t expired = mux_.expire(Clock::now(), code, detail);
  // Calls whose deadlines pass in the same sweep (a pipelined burst
  // against a server stalled for a moment) count once: a stalled server
  // answers them all later on this connection, a frozen link never does.
  if (up && expired > 0 && opts_.recycle_after_timeouts > 0 &&
      ++consecutive_timeouts_ >= static_cast<std::size_t>(opts_.recycle_after_timeouts)) {
    // A frozen link (a dead NAT entry, a peer that stopped reading) may
    // take TCP many minutes to notice; a fresh connection usually works.
    const std::string why = fmt::format("{} timeouts in a row on {} with no reply in between; connection recycled",
                                        consecutive_timeouts_, where_);
    consecutive_timeouts_ = 0;
    // Logged before it is counted: a caller that sees the count finds the
    // warning too.
    warn(why);
    stats_->recycled.fetch_add(1, std::memory_order_release);
    on_broken(make_error_code(errc::connection_lost), why);
  }
}

}  // namespace jobguard::redis::detail
