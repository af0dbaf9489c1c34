// Sans-IO request/reply matching for one Redis connection: bytes and time in,
// completions out. No sockets here, so it is tested by feeding it bytes (split
// at every boundary, error replies mid-pipeline, deadlines crossed by a fake
// clock).
//
// Threads: not thread-safe; owned and driven by one connection on the
// event-loop thread. Completions run inline from feed()/expire()/fail_*().
// A completion may call enqueue() on the same multiplexer (re-entrancy is
// handled by completing only after the request has left the queues).
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <system_error>

#include "jobguard/redis/client.hpp"
#include "jobguard/redis/reply.hpp"

struct redisReader;

namespace jobguard::redis::detail {

using Clock = std::chrono::steady_clock;

class Multiplexer {
 public:
  struct Request {
    std::string payload;       // encoded RESP
    Completion done;           // called exactly once
    Clock::time_point deadline;
    bool internal = false;     // handshake command: written before user requests
  };

  Multiplexer();
  ~Multiplexer();
  Multiplexer(const Multiplexer&) = delete;
  Multiplexer& operator=(const Multiplexer&) = delete;

  void enqueue(Request r);
  // Handshake commands (AUTH, SELECT, CLIENT SETNAME) go ahead of user requests.
  void enqueue_front(Request r);

  // True when requests are waiting to be written and no write is in flight.
  bool wants_write(bool internal_only = false) const noexcept;
  // Moves queued requests (only the internal ones at the front when
  // `internal_only`) to the in-flight list and returns the bytes to write. The
  // buffer stays valid until write_done().
  const std::string& prepare_write(bool internal_only = false);
  void write_done() noexcept;
  bool write_in_progress() const noexcept { return writing_; }
  std::size_t last_batch_size() const noexcept { return last_batch_; }

  // Feeds bytes read from the socket; completes each request whose reply is
  // now whole, in order. A protocol error (or a reply with no request waiting
  // for it) returns an error; the caller must then drop the connection.
  std::error_code feed(const char* data, std::size_t n);

  // The connection broke: every in-flight request fails with `ec` / `detail`.
  // Queued (never written) requests are kept for the next connection.
  void fail_in_flight(std::error_code ec, const std::string& detail);
  // Fails everything: in-flight and queued.
  void fail_all(std::error_code ec, const std::string& detail);
  // Fails only queued requests (e.g. AUTH is misconfigured: no point waiting).
  void fail_queued(std::error_code ec, const std::string& detail);

  // Completes with `ec` (timeout, or not_connected while there is no
  // connection) every request whose deadline is <= now. An
  // in-flight one stays in order, with its completion detached, so the reply
  // that arrives later is matched to it and discarded. Returns how many expired.
  std::size_t expire(Clock::time_point now, std::error_code ec, const std::string& detail);
  // The earliest deadline among pending requests (a lower bound; may be stale
  // in the early direction, never late). time_point::max() when none.
  Clock::time_point next_deadline() const noexcept { return min_deadline_; }

  std::size_t queued() const noexcept { return queued_.size(); }
  std::size_t in_flight() const noexcept { return in_flight_.size(); }
  std::size_t pending() const noexcept { return queued_.size() + in_flight_.size(); }

  // Drops parser state (after a reconnect: a half-read reply is garbage).
  void reset_reader();

  // Runs before every non-internal completion, on the same thread, and may
  // rewrite the error code (the client classifies error replies and counts
  // calls here). A plain function pointer: wrapping every caller's
  // completion in another std::function cost an allocation per command.
  using Hook = void (*)(void* ctx, std::error_code& ec, const Reply& reply);
  void set_hook(Hook hook, void* ctx) noexcept {
    hook_ = hook;
    hook_ctx_ = ctx;
  }

  // Called by feed() after every `every` completions, so the I/O layer can
  // send what those completions asked for while the rest of the read is
  // still being handled. 0 = never.
  using Flush = void (*)(void* ctx);
  void set_flush(std::size_t every, Flush fn, void* ctx) noexcept {
    flush_every_ = every;
    flush_ = fn;
    flush_ctx_ = ctx;
  }

 private:
  struct InFlight {
    Completion done;  // empty once expired
    Clock::time_point deadline;
    bool internal = false;
  };
  void finish(Completion& done, bool internal, std::error_code ec, Reply r) {
    if (hook_ && !internal) hook_(hook_ctx_, ec, r);
    done(ec, std::move(r));
  }
  Hook hook_ = nullptr;
  void* hook_ctx_ = nullptr;
  std::size_t flush_every_ = 0;
  Flush flush_ = nullptr;
  void* flush_ctx_ = nullptr;

  std::deque<Request> queued_;
  std::deque<InFlight> in_flight_;
  std::string write_buf_;
  bool writing_ = false;
  std::size_t last_batch_ = 0;
  Clock::time_point min_deadline_ = Clock::time_point::max();
  struct ReaderDeleter {
    void operator()(redisReader* r) const noexcept;
  };
  std::unique_ptr<redisReader, ReaderDeleter> reader_;
};

// Classifies an error reply: WRONGPASS/NOAUTH -> auth_failed, LOADING/BUSY/
// TRYAGAIN/MASTERDOWN/CLUSTERDOWN -> server_busy, NOSCRIPT/script errors ->
// script_error, anything else -> server_error.
std::error_code classify_error_reply(const Reply& r);

}  // namespace jobguard::redis::detail
