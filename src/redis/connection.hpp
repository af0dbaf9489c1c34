// One Redis connection and its whole lifecycle: resolve, connect (TCP or
// TLS), TCP keepalive, the handshake (AUTH, SELECT, CLIENT SETNAME), the
// reply reader with its limits, deadlines, recycling after repeated
// timeouts, and reconnection with backoff. The Client multiplexes callers
// over a few of these; the Subscriber runs one in push mode (pub/sub
// messages are handed to it instead of matched to requests). One transport,
// one error classification for both.
//
// Threads: event-loop thread only. Every asynchronous operation holds a
// shared_ptr to the connection, so it outlives its handlers; it never refers
// back to its owner, which may be gone while aborted handlers drain.
// Private to src/redis.
#pragma once

#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <optional>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/text.hpp"
#include "redis/multiplexer.hpp"

namespace jobguard::redis::detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// Counters shared by a client's connections (ClientStats); the subscriber's
// connection has its own.
struct SharedStats {
  std::atomic<std::uint64_t> commands{0}, writes{0}, errors{0}, reconnects{0}, connects{0}, timeouts{0}, recycled{0};
  std::atomic<int> connected{0};
};

// Every caller-visible completion passes here first (the multiplexer's hook,
// or directly for calls refused before reaching it).
inline void account(void* ctx, std::error_code& ec, const Reply& reply) {
  auto* st = static_cast<SharedStats*>(ctx);
  if (!ec && reply.is_error()) ec = detail::classify_error_reply(reply);
  st->commands.fetch_add(1, std::memory_order_relaxed);
  if (ec) st->errors.fetch_add(1, std::memory_order_relaxed);
  if (ec == errc::timeout) st->timeouts.fetch_add(1, std::memory_order_relaxed);
}

inline void refuse(SharedStats* st, Completion& done, std::error_code ec, const std::string& detail) {
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
    mux_.set_hook(&account, stats_.get());
    // Without it one connection ping-pongs: the server idles while we run a
    // whole read's completions (64 resumed callers), then we idle while it
    // runs the batch they asked for. Sending every 16 completions' worth as
    // soon as it exists lets the two overlap (one connection's lock pairs a
    // second rise by half or more; 4, 8 and 32 do about as well: see
    // docs/bench.md). Order is kept: one write at a time, in submission order.
    mux_.set_flush(kFlushEvery, &Connection::flush_now, this);
  }

  static constexpr std::size_t kFlushEvery = 16;

  static bool push_now(void* ctx, Reply& r) { return static_cast<Connection*>(ctx)->on_push_(r); }

  // From inside feed(), on the loop thread; the read handler holds us alive.
  static void flush_now(void* ctx) {
    auto* c = static_cast<Connection*>(ctx);
    if (c->state_ == State::ready && !c->mux_.write_in_progress()) c->do_write();
  }

  void start() { connect(); }

  // --- hooks for the Subscriber; set before start() ---------------------------
  // Runs each time the connection is ready (handshake done).
  void set_on_ready(std::function<void()> fn) { on_ready_ = std::move(fn); }
  // Sees every reply first; returns true for one it consumed (a pub/sub
  // message), which is then not matched to a request.
  void set_push_handler(std::function<bool(Reply&)> fn) {
    on_push_ = std::move(fn);
    mux_.set_push(&Connection::push_now, this);
  }
  // Runs when connecting fails for a reason a retry will not fix (AUTH
  // rejected, certificate refused): the owner reports it to its user.
  void set_on_fatal(std::function<void(std::error_code, const std::string&)> fn) { on_fatal_ = std::move(fn); }
  const std::string& where() const noexcept { return where_; }
  // Any thread: the server this connection talks to ("host:port"), or for a
  // Sentinel deployment the last primary a sentinel named (before the first
  // answer, "the primary of 'NAME' (sentinels ...)").
  std::string address() const {
    std::lock_guard g(down_mu_);
    return address_;
  }
  // A one-shot connection (a sentinel query): a failed connect fails the
  // queued calls at once and is not retried. Before start().
  void set_probe() noexcept { probe_ = true; }

  std::size_t load() const noexcept { return mux_.pending(); }
  bool ready() const noexcept { return state_ == State::ready; }
  // Any thread: an attempt to (re)connect failed and the connection has not
  // been ready since (Client::down_error). False while the first connect is
  // still in progress, and between a break and the first reconnect attempt.
  bool known_down() const noexcept { return down_.load(std::memory_order_acquire); }
  // Any thread: the failure that made it known down.
  std::string down_reason() const {
    std::lock_guard g(down_mu_);
    return down_why_;
  }

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
    ++generation_;  // a read handler that called us (a push handler) stops there
    boost::system::error_code ignored;
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

 private:
  // --- connecting -----------------------------------------------------------
  void connect() {
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

  // While ready behind Sentinel: ask every sentinel_check whether the
  // primary moved. A forced or automatic failover leaves the old primary
  // accepting writes until the sentinels demote it (seconds later), so the
  // connection cannot wait for the server to close it.
  void arm_sentinel_check() {
    if (sentinels_.empty() || opts_.sentinel.check_interval.count() <= 0) return;
    const auto gen = generation_;
    sentinel_timer_.expires_after(opts_.sentinel.check_interval);
    sentinel_timer_.async_wait([self = shared_from_this(), gen](boost::system::error_code ec) {
      if (ec || gen != self->generation_ || self->state_ != State::ready) return;
      self->ask_sentinel(0, {}, [self, gen](const std::optional<SentinelOptions::Address>& a, const std::string&) {
        if (gen != self->generation_ || self->state_ != State::ready) return;
        // No answer says nothing about the primary: keep it, ask again later.
        if (a && (a->host != self->target_host_ || a->port != self->target_port_)) {
          const std::string why = fmt::format("the sentinels name {}:{} as the primary of '{}' now, not {}; "
                                              "reconnecting there",
                                              a->host, a->port, self->opts_.sentinel.master_name, self->where_);
          self->warn(why);
          return self->on_broken(make_error_code(errc::connection_lost), why);
        }
        self->arm_sentinel_check();
      });
    });
  }

  // Asks sentinels_[i] (then the next) for the primary; the answering one
  // is asked first next time, and the sentinels it knows of are added.
  using Found = std::function<void(const std::optional<SentinelOptions::Address>&, const std::string& why)>;
  void ask_sentinel(std::size_t i, std::string errors, Found found_cb) {
    if (state_ == State::closed) return;
    const std::string& name = opts_.sentinel.master_name;
    if (i >= sentinels_.size())
      return found_cb(std::nullopt, fmt::format("no sentinel named the primary of '{}' ({})", name, errors));
    const SentinelOptions::Address addr = sentinels_[i];
    ConnectionOptions so;
    so.host = addr.host;
    so.port = addr.port;
    so.password = opts_.sentinel.password;
    so.connect_timeout = opts_.connect_timeout;
    so.command_timeout = opts_.connect_timeout;
    so.keepalive = false;
    so.recycle_after_timeouts = 0;
    so.on_warning = opts_.on_warning;
    // The client made ssl_ for either side that wants TLS (make_tls_context
    // holds the CA, client certificate and verify mode, not a host name).
    if (opts_.sentinel.tls) {
      so.tls = opts_.tls;
      so.tls.enabled = true;
    }
    auto probe = std::make_shared<Connection>(ctx_, so, opts_.sentinel.tls ? ssl_ : nullptr,
                                              std::make_shared<SharedStats>());
    probe->set_probe();
    probe->start();
    std::erase_if(probes_, [](const std::weak_ptr<Connection>& w) { return w.expired(); });
    probes_.push_back(probe);
    auto self = shared_from_this();
    auto found = std::make_shared<std::optional<SentinelOptions::Address>>();
    auto drop = [this, probe] { asio::post(ctx_, [probe] { probe->close(); }); };
    const auto deadline = Clock::now() + opts_.connect_timeout;
    Multiplexer::Request master;
    master.payload = Command{"SENTINEL", "get-master-addr-by-name", name}.payload();
    master.deadline = deadline;
    master.done = [self, i, addr, errors, found, drop, name, found_cb](std::error_code ec, Reply r) {
      if (!ec && r.is_array() && r.elements.size() == 2 && r.elements[1].is_string()) {
        unsigned port = 0;
        const auto& ps = r.elements[1].str;
        const auto [end, perr] = std::from_chars(ps.data(), ps.data() + ps.size(), port);
        if (perr == std::errc() && end == ps.data() + ps.size() && port > 0 && port < 65536) {
          *found = SentinelOptions::Address{r.elements[0].str, static_cast<std::uint16_t>(port)};
          return;  // connected when the list of sentinels is in
        }
      }
      drop();
      const std::string why = ec ? r.str
                              : (r.is_nil() || (r.is_array() && r.elements.empty()))
                                  ? fmt::format("does not monitor a master named '{}'", name)
                                  : "unexpected reply " + to_debug_string(r);
      self->ask_sentinel(i + 1,
                         errors + (errors.empty() ? "" : "; ") + fmt::format("{}:{}: {}", addr.host, addr.port, why),
                         found_cb);
    };
    Multiplexer::Request others;
    others.payload = Command{"SENTINEL", "sentinels", name}.payload();
    others.deadline = deadline;
    others.done = [self, i, found, drop, found_cb](std::error_code ec, Reply r) {
      if (!found->has_value()) return;  // the first question failed; the next sentinel is being asked
      drop();
      if (!ec && r.is_array()) self->learn_sentinels(r);
      if (i != 0 && i < self->sentinels_.size()) std::swap(self->sentinels_[0], self->sentinels_[i]);
      found_cb(*found, {});
    };
    probe->submit(std::move(master));
    probe->submit(std::move(others));
  }

  // `SENTINEL sentinels NAME`: one flat field/value array per other sentinel.
  void learn_sentinels(const Reply& r) {
    for (const auto& e : r.elements) {
      if (!e.is_array()) continue;
      std::string ip;
      unsigned port = 0;
      for (std::size_t k = 0; k + 1 < e.elements.size(); k += 2) {
        const auto& f = e.elements[k].str;
        const auto& v = e.elements[k + 1].str;
        if (f == "ip") ip = v;
        else if (f == "port") std::from_chars(v.data(), v.data() + v.size(), port);
      }
      if (ip.empty() || port == 0 || port > 65535) continue;
      SentinelOptions::Address a{ip, static_cast<std::uint16_t>(port)};
      // A bounded list: a misbehaving sentinel cannot make us keep thousands.
      if (std::find(sentinels_.begin(), sentinels_.end(), a) == sentinels_.end() && sentinels_.size() < 64)
        sentinels_.push_back(std::move(a));
    }
  }

  void connect_host(const std::string& host, std::uint16_t port, std::uint64_t gen) {
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
      self->on_broken(make_error_code(errc::timeout),
                      fmt::format("connect to {} timed out after {} ms", self->where_,
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

  void connect_to(const tcp::resolver::results_type& results, std::uint64_t gen) {
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
  void set_keepalive(asio::basic_socket<tcp>& sock) {
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

  void warn(const std::string& line) {
    if (opts_.on_warning) opts_.on_warning(line);
    else std::fprintf(stderr, "jobguard: warning: %s\n", line.c_str());
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
    // A sentinel's answer may be stale (a failover in progress, an old
    // primary back as a replica): nothing is written before the server
    // itself says it is the primary.
    if (!sentinels_.empty()) hs.push_back(Command{"ROLE"});
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
        if (name == "ROLE") {
          const bool primary = reply.is_array() && !reply.elements.empty() && reply.elements[0].str == "master";
          if (!primary) {
            const std::string role =
                reply.is_array() && !reply.elements.empty() ? reply.elements[0].str : to_debug_string(reply);
            const std::string msg = fmt::format("{} is a {} (ROLE), not the primary of '{}': not used; asking the "
                                                "sentinels again",
                                                self->where_, role, self->opts_.sentinel.master_name);
            self->last_error_code_ = make_error_code(errc::not_connected);
            self->last_error_ = msg;
            self->on_broken(make_error_code(errc::not_connected), msg);
            return;
          }
        }
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
    if (on_fatal_ && next_step_for(ec) == next_step::stop) on_fatal_(ec, why);
    if (probe_) {
      // One answer or none: the caller asks the next sentinel.
      mux_.fail_queued(make_error_code(errc::not_connected), why);
      return;
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
    // A plain socket is written at once, without blocking: on loopback or a
    // LAN the kernel takes the whole batch, and the write is over here. An
    // async_write would take the same bytes now but hold the connection as
    // writing until its handler has had a turn of the loop, so the commands
    // callers submit meanwhile wait for that turn, which costs guarded jobs a
    // second at high concurrency (see docs/bench.md). What the kernel does
    // not take now (a full socket buffer), and any error, goes the async way:
    // its handler reports a broken connection as before, from the loop, never
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
        if (gen != self->generation_) return;
        const std::string why = fmt::format("protocol error from {}: {}; connection dropped", self->where_,
                                            self->mux_.error_detail());
        self->warn(why);
        // Calls in flight on this connection fail with the protocol error
        // itself (not connection_lost): the server sent something we refuse.
        self->mux_.fail_in_flight(perr, why);
        self->mux_.fail_queued(perr, why);
        // Recorded as a lost connection, not as a stop: the next connection
        // may well be fine, and calls made meanwhile should wait for it.
        self->on_broken(make_error_code(errc::connection_lost), why);
        return;
      }
      if (gen != self->generation_) return;  // a completion closed us
      if (self->mux_.replies() != self->replies_seen_) {
        self->replies_seen_ = self->mux_.replies();
        self->consecutive_timeouts_ = 0;
      }
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
      const std::size_t expired = self->mux_.expire(Clock::now(), code, detail);
      // Calls whose deadlines pass in the same sweep (a pipelined burst
      // against a server stalled for a moment) count once: a stalled server
      // answers them all later on this connection, a frozen link never does.
      if (up && expired > 0 && self->opts_.recycle_after_timeouts > 0 &&
          ++self->consecutive_timeouts_ >= static_cast<std::size_t>(self->opts_.recycle_after_timeouts)) {
        // A frozen link (a dead NAT entry, a peer that stopped reading) may
        // take TCP many minutes to notice; a fresh connection usually works.
        const std::string why =
            fmt::format("{} timeouts in a row on {} with no reply in between; connection recycled",
                        self->consecutive_timeouts_, self->where_);
        self->consecutive_timeouts_ = 0;
        self->stats_->recycled.fetch_add(1, std::memory_order_relaxed);
        self->warn(why);
        self->on_broken(make_error_code(errc::connection_lost), why);
      }
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
  asio::steady_timer connect_timer_, reconnect_timer_, sweep_timer_, sentinel_timer_;
  Multiplexer mux_;
  std::array<char, 64 * 1024> rbuf_{};
  std::mt19937_64 rng_;
  std::string where_;
  std::vector<SentinelOptions::Address> sentinels_;  // empty: not behind Sentinel
  std::string target_host_;                          // what connect_host() dials
  std::uint16_t target_port_ = 0;
  bool probe_ = false;
  // The sentinel probes asked (ask_sentinel), to close with us.
  std::vector<std::weak_ptr<Connection>> probes_;
  std::chrono::milliseconds sweep_tick_;
  State state_ = State::disconnected;
  std::uint64_t generation_ = 0;  // bumps on every (re)connect: stale handlers ignore themselves
  std::size_t handshake_left_ = 0;
  int attempt_ = 0;
  bool reading_ = false, write_scheduled_ = false, sweep_armed_ = false, ever_connected_ = false;
  std::error_code last_error_code_;
  std::string last_error_;
  std::function<void()> on_ready_;
  std::function<bool(Reply&)> on_push_;
  std::function<void(std::error_code, const std::string&)> on_fatal_;
  std::uint64_t replies_seen_ = 0;
  std::size_t consecutive_timeouts_ = 0;  // since the last reply on this connection
  // Mirrors of the state for other threads (known_down, down_reason): the
  // rest of this class is loop-thread only.
  std::atomic<bool> down_{false};
  mutable std::mutex down_mu_;
  std::string down_why_;
  std::string address_;  // address(); guarded by down_mu_
};


}  // namespace jobguard::redis::detail
