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
// Private to src/redis. The implementation is in connection.cpp (transport,
// handshake, I/O, deadlines) and connection_sentinel.cpp (finding the
// primary through Sentinel).
#pragma once

#include <array>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"
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

// Completes a call refused before it reached a connection's multiplexer
// (shutting down, known down, a bad CallOptions::node): counted as a failed
// call, and its Error names `address` as every other failure does.
void refuse(SharedStats* st, Completion& done, std::error_code ec, const std::string& detail,
            std::string_view address);

// One multiplexed connection. Lives on the event-loop thread only; every
// asynchronous operation holds a shared_ptr to it, so it outlives its handlers.
// It never refers back to the Client: the client may be gone while aborted
// handlers drain.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  enum class State { disconnected, connecting, handshaking, ready, closed };

  Connection(asio::io_context& ctx, const ConnectionOptions& opts, std::shared_ptr<asio::ssl::context> ssl,
             std::shared_ptr<SharedStats> stats);

  // Without it one connection ping-pongs: the server idles while we run a
  // whole read's completions (64 resumed callers), then we idle while it
  // runs the batch they asked for. Sending every 16 completions' worth as
  // soon as it exists lets the two overlap (4, 8 and 32 do about as well:
  // docs/bench.md has the figures). Order is kept: one write at a time, in
  // submission order.
  static constexpr std::size_t kFlushEvery = 16;

  void start() { connect(); }

  // --- hooks for the Subscriber; set before start() ---------------------------
  // Runs each time the connection is ready (handshake done).
  void set_on_ready(std::function<void()> fn) { on_ready_ = std::move(fn); }
  // Sees every reply first; returns true for one it consumed (a pub/sub
  // message), which is then not matched to a request.
  void set_push_handler(std::function<bool(Reply&)> fn);
  // Runs when connecting fails for a reason a retry will not fix (AUTH
  // rejected, certificate refused): the owner reports it to its user.
  void set_on_fatal(std::function<void(const Error&)> fn) { on_fatal_ = std::move(fn); }
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

  void submit(Multiplexer::Request r);
  void close();
  // Loop thread: writes what is queued now instead of at the end of this
  // turn of the loop (schedule_write), unless a write is under way or the
  // connection is not ready (then it goes when it can, as it would anyway).
  void write_now();

 private:
  // The multiplexer's hooks: plain functions with this connection as context.
  static void account(void* ctx, std::error_code& ec, const Reply& reply);
  static Error describe(void* ctx, std::error_code ec, const Reply& reply);
  static bool push_now(void* ctx, Reply& r);
  static void flush_now(void* ctx);

  // --- connecting (connection.cpp) ---------------------------------------------
  void connect();
  void connect_host(const std::string& host, std::uint16_t port, std::uint64_t gen);
  void connect_to(const tcp::resolver::results_type& results, std::uint64_t gen);
  void set_keepalive(asio::basic_socket<tcp>& sock);
  void warn(const std::string& line);
  void on_connect_error(boost::system::error_code ec);
  void on_tls_error(boost::system::error_code ec);
  void on_transport_up();
  void on_handshake_reply(const std::string& name, std::error_code ec, const Reply& reply);
  void on_ready();
  // --- failure and reconnection ------------------------------------------------
  void on_broken(std::error_code ec, const std::string& why);
  void schedule_reconnect();
  std::shared_ptr<void> stream() const;
  void close_socket();
  // --- I/O -----------------------------------------------------------------------
  void schedule_write();
  void do_write();
  void start_read();
  void on_read(std::uint64_t gen, boost::system::error_code ec, std::size_t n);
  // --- deadlines -----------------------------------------------------------------
  void arm_sweep();
  void sweep();

  // --- Sentinel (connection_sentinel.cpp) ----------------------------------------
  using Found = std::function<void(const std::optional<SentinelOptions::Address>&, const std::string& why)>;
  // Asks sentinels_[i] (then the next) for the primary; the answering one
  // is asked first next time, and the sentinels it knows of are added.
  void ask_sentinel(std::size_t i, std::string errors, Found found_cb);
  std::shared_ptr<Connection> sentinel_probe(const SentinelOptions::Address& addr);
  // While ready behind Sentinel: asks every sentinel_check whether the
  // primary moved.
  void arm_sentinel_check();
  void learn_sentinels(const Reply& r);

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
  std::function<void(const Error&)> on_fatal_;
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
