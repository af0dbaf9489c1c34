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
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/reply.hpp"

struct redisReader;

namespace jobguard::redis::detail {

using Clock = std::chrono::steady_clock;

// What one reply may declare (ConnectionOptions' max_reply_* fields).
struct ReplyLimits {
  std::size_t max_elements = std::size_t{1} << 20;
  std::size_t max_bulk = std::size_t{64} << 20;
  int max_depth = 7;
};

// Checks RESP framing on the raw bytes before they reach the hiredis reader,
// which would otherwise size an array by its declared count and buffer a
// bulk string whole before looking at it: `*2000000000` aborted the process,
// `*20000000` stalled the loop for seconds, `$<gigabytes>` buffered without
// bound. Keeps only the open arrays' remaining counts and
// a few bytes of the header line being read, so its memory is bounded too.
// Not thread-safe; one per connection.
class ReplyLimiter {
 public:
  explicit ReplyLimiter(ReplyLimits limits = {}) : limits_(limits) {}
  // Scans `n` more bytes. Returns how many are acceptable: `n`, or the
  // offset of the header that broke a limit, in which case why() says which.
  std::size_t scan(const char* data, std::size_t n);
  const std::string& why() const noexcept { return why_; }
  bool failed() const noexcept { return !why_.empty(); }
  void reset() noexcept;

 private:
  bool on_header(char type, std::string_view number);
  void item_done() noexcept;
  bool fail(std::string why);

  ReplyLimits limits_;
  std::vector<long long> open_;   // remaining elements of each open array
  std::size_t declared_ = 0;      // elements declared so far by the current reply
  std::size_t bulk_left_ = 0;     // payload bytes (+ CRLF) still to skip
  bool in_header_ = false;
  char type_ = 0;
  std::string number_;            // digits of the header line (bounded)
  std::size_t line_len_ = 0;      // bytes of the current header line so far
  std::string why_;
};

class Multiplexer {
 public:
  struct Request {
    std::string payload;       // encoded RESP
    Completion done;           // called exactly once
    Clock::time_point deadline;
    bool internal = false;     // handshake command: written before user requests
    // Written, never matched to a reply: a subscribed connection's SUNSUBSCRIBE,
    // whose confirmation looks exactly like the server's own unsubscribe-on-
    // slot-migration push, so the push handler takes both (the subscriber
    // counts its own). `done` runs only if it fails before it is written.
    bool no_reply = false;
    std::uint32_t weight = 1;  // CallOptions::weight
  };

  explicit Multiplexer(ReplyLimits limits = {});
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
  // for it, or one over a ReplyLimits limit) returns errc::protocol_error and
  // error_detail() says what was wrong; the caller must then drop the
  // connection. Replies before the offending one are still completed.
  std::error_code feed(const char* data, std::size_t n);
  const std::string& error_detail() const noexcept { return error_detail_; }
  // Replies read since construction (the connection notices a live link).
  std::uint64_t replies() const noexcept { return replies_; }

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

  // Run before every non-internal completion, on the same thread: `hook`
  // may rewrite the error code (the connection classifies error replies and
  // counts calls here); `describe` builds the Error a failed call gets (the
  // connection names its server). Plain function pointers: wrapping every
  // caller's completion in another std::function cost an allocation per
  // command.
  using Hook = void (*)(void* ctx, std::error_code& ec, const Reply& reply);
  using Describe = Error (*)(void* ctx, std::error_code ec, const Reply& reply);
  void set_hook(Hook hook, Describe describe, void* ctx) noexcept {
    hook_ = hook;
    describe_ = describe;
    hook_ctx_ = ctx;
  }

  // On a subscribed connection the server also sends replies nobody asked
  // for (pub/sub messages). `hook` sees every reply first and returns true
  // for one it consumed; the rest are matched to requests in order.
  using Push = bool (*)(void* ctx, Reply& reply);
  void set_push(Push hook, void* ctx) noexcept {
    push_ = hook;
    push_ctx_ = ctx;
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
    std::uint32_t weight = 1;
  };
  // Success passes one shared empty Error: constructing and destroying one
  // per completion shows in the reply loop (redis_codec_bench, BM_Feed*).
  static const Error& no_error() noexcept {
    static const Error none;
    return none;
  }
  void finish(Completion& done, bool internal, std::error_code ec, Reply r) {
    const bool hooked = hook_ && !internal;
    if (hooked) hook_(hook_ctx_, ec, r);
    // Without the hook an error reply is no failure: the handshake reads it.
    if (!ec) return done(no_error(), std::move(r));
    const Error err = hooked && describe_ ? describe_(hook_ctx_, ec, r) : Error(ec, r.str, error_source::redis);
    done(err, std::move(r));
  }
  Hook hook_ = nullptr;
  Describe describe_ = nullptr;
  void* hook_ctx_ = nullptr;
  Push push_ = nullptr;
  void* push_ctx_ = nullptr;
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
  ReplyLimiter limiter_;
  std::string error_detail_;
  std::uint64_t replies_ = 0;
};

// Classifies an error reply: WRONGPASS/NOAUTH -> auth_failed, NOPERM ->
// permission_denied, LOADING/
// BUSY/TRYAGAIN/MASTERDOWN/CLUSTERDOWN/READONLY/OOM -> server_busy, NOSCRIPT/script errors ->
// script_error, anything else -> server_error.
std::error_code classify_error_reply(const Reply& r);

}  // namespace jobguard::redis::detail
