// The Redis client: one event loop multiplexes every caller's commands over a
// few connections. Commands submitted while a write is in flight leave
// together in the next write (automatic pipelining), and what the completions
// of a large read submit leaves every 16 completions rather than after the
// whole read, so the server works while we finish it. Replies are matched in
// order. Every call has a deadline; when a connection breaks, every call in
// flight on it fails at once with errc::connection_lost and the client
// reconnects with backoff; calls made while disconnected wait for a connection
// until their deadline.
//
// Threads: every public member is safe to call from any thread. Completions
// run on the event-loop thread and must not block. The client either owns its
// event loop (one thread it starts) or runs on a caller's io_context, which
// must then be run by exactly one thread.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <system_error>
#include <vector>

#include "jobguard/error.hpp"
#include "jobguard/redis/command.hpp"
#include "jobguard/redis/options.hpp"
#include "jobguard/redis/reply.hpp"
#include "jobguard/redis/script.hpp"

namespace jobguard::redis {

// Every completion of the client has this shape: the outcome first, as an
// Error (empty on success), then what the call returns. On failure `err`
// says what went wrong and where, source redis: its code, the server's
// host:port and the server's own words (or what failed on our side). It is
// built once, where the reply is read, and only for a failure: on success it
// is an empty Error, which allocates nothing. An -ERR reply from the server
// is a failure too (server_error, server_busy, script_error, auth_failed,
// permission_denied): callers never have to inspect reply types for errors.
// `reply` is then an error reply whose text is the server's own, untouched
// (so error_prefix() works); to_error() below adds a context ("acquire of
// K") for the layers above. A reply over a ConnectionOptions limit fails
// with protocol_error naming the limit. A handler that needs only the code
// may take a std::error_code instead (Error converts to it).
using Completion = std::function<void(const Error& err, Reply reply)>;
// Client::async_exec_in_order's: `err` is the first failed command's (empty
// when all succeeded); `replies` holds every command's reply, in order (a
// failed one's is its error reply, or empty when it never got one).
using InOrderCompletion = std::function<void(const Error& err, std::vector<Reply> replies)>;

struct CallOptions {
  // Zero = the client's command_timeout.
  std::chrono::milliseconds timeout{0};
  // Fail at once with Client::down_error() when the client is known to be
  // down, instead of waiting for a reconnect until the deadline. Default off:
  // a call made during a short reconnect usually succeeds when it waits.
  // LockService::acquire uses it for a try-once acquire (wait = 0).
  bool fail_if_down = false;
  // On a Redis Cluster: run on this node ("host:port", as primaries() names
  // it) instead of the one that serves the command's key. For the commands
  // that are per node — SCAN, INFO, DBSIZE — which see only the node they
  // run on. A redirect is not followed: it is the caller's answer. Ignored
  // without cluster=yes (there is one node). Read during the call only (the
  // view need not outlive it): a view, not a string, so CallOptions stays
  // trivially destructible — g++ 12 destroys a temporary with a destructor
  // inside a co_await expression twice.
  std::string_view node{};
  // How many callers' calls this one carries (a batch of them in one script
  // call). A connection writes what has queued after every 16 calls' worth
  // of replies it reads (src/redis/connection.hpp, kFlushEvery), counted by
  // weight: a batch's reply resumes that many callers, whose next calls
  // should reach the server while this client works through the rest of the
  // read.
  std::uint32_t weight = 1;
};
static_assert(std::is_trivially_destructible_v<CallOptions>, "CallOptions is passed as a temporary inside co_await");

// Replica confirmation of a write: `WAIT replicas timeout` (or `WAITAOF 1
// replicas timeout`) pipelined right after it on the same connection, so it
// covers that write (and whatever the connection wrote before it). What it
// does and does not guarantee: docs/lock-safety.md, "Replica-confirmed grants".
struct Confirm {
  int replicas = 0;                        // acknowledgements wanted; 0 = none asked
  std::chrono::milliseconds timeout{500};  // how long the server waits for them
  bool waitaof = false;                    // WAITAOF (Redis 7.2+): fsynced, locally and on the replicas
};

// What the confirmation found.
struct Confirmation {
  int replicas = -1;   // replicas that acknowledged; -1 when the confirmation itself failed
  int local = -1;      // WAITAOF: 1 when the primary fsynced it; -1 for WAIT
  std::string error;   // why it failed (the server's reply, a timeout), else empty
  bool met(const Confirm& c) const noexcept {
    return c.replicas <= 0 || (replicas >= c.replicas && (!c.waitaof || local >= 1));
  }
};
// "WAIT 1 500" / "WAITAOF 1 1 500", for messages.
std::string describe(const Confirm& c);
// One line: "0 of 1 replicas acknowledged within 500 ms (WAIT 1 500)".
std::string describe(const Confirmation& got, const Confirm& wanted);

// `err` and `reply` are the write's, as for Completion; `conf` is meaningful
// only when the write succeeded.
using ConfirmedCompletion = std::function<void(const Error& err, Reply reply, Confirmation conf)>;

// One primary of a Redis Cluster and the slot ranges it serves (first, last).
struct PrimaryShard {
  std::string address{};  // "host:port", as CallOptions::node takes it
  std::vector<std::pair<std::uint16_t, std::uint16_t>> slots{};
  bool serves(std::uint16_t slot) const noexcept {
    for (const auto& [first, last] : slots)
      if (slot >= first && slot <= last) return true;
    return false;
  }
};
// The cluster slot of `key` (CRC16 of its hash tag, else of the whole key).
std::uint16_t key_slot(std::string_view key) noexcept;

struct ClientStats {
  std::uint64_t commands = 0;      // completed, successfully or not
  std::uint64_t writes = 0;        // socket writes: commands / writes = pipelining
  std::uint64_t errors = 0;        // failed calls (any errc)
  std::uint64_t reconnects = 0;    // successful connects after the first
  // Every successful connect, the first of each connection included: on a
  // Redis Cluster a connection to a node met for the first time (a promoted
  // replica, a new primary) is a server not seen before, as a reconnect is.
  std::uint64_t connects = 0;
  std::uint64_t timeouts = 0;
  std::uint64_t recycled = 0;      // connections replaced after repeated timeouts
  int connected = 0;               // connections ready now
};

class Client {
 public:
  // Owns its event loop: starts one thread that runs it.
  explicit Client(ConnectionOptions options);
  // Runs on `ctx`, which the caller runs from exactly one thread.
  Client(boost::asio::io_context& ctx, ConnectionOptions options);
  ~Client();  // fails every pending call with errc::shutdown, joins the loop
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ConnectionOptions& options() const noexcept;
  boost::asio::any_io_executor get_executor() const noexcept;
  // The event loop the client runs on (its own or the caller's).
  boost::asio::io_context& context() const noexcept;
  // True on the event-loop thread (where blocking calls would deadlock).
  bool running_in_loop_thread() const noexcept;
  // On the event-loop thread: sends the calls made so far in this turn of the
  // loop now, instead of with the rest of the turn's calls at its end, so the
  // server works on them while the caller goes on (the lock layer does it
  // with a full batch of coalesced attempts). Elsewhere it does nothing:
  // calls made off the loop thread reach it later anyway.
  void flush_writes();

  // --- asynchronous interface (the one the lock layer uses) -----------------
  void async_exec(Command cmd, Completion done, CallOptions opts = {});
  // EVALSHA with transparent NOSCRIPT fallback to EVAL. `script` must stay
  // alive until `done` runs (scripts are long-lived values: keep them static).
  void async_eval(const Script& script, std::vector<std::string> keys,
                  std::vector<std::string> args, Completion done, CallOptions opts = {});
  // The same for keys and arguments the caller holds as views (the lock's
  // release and extend): encoded straight into the request, no vectors.
  void async_eval_views(const Script& script, std::initializer_list<std::string_view> keys,
                        std::initializer_list<std::string_view> args, Completion done, CallOptions opts = {});
  // Any number of views (a batch of renewals).
  void async_eval_views(const Script& script, std::span<const std::string_view> keys,
                        std::span<const std::string_view> args, Completion done, CallOptions opts = {});

  // The same, each followed on the same connection by the confirmation
  // (Confirm): `done` runs once both replies are in, or at once when the
  // write failed. The confirmation's deadline is the call's plus
  // confirm.timeout. A NOSCRIPT fallback to EVAL sends the confirmation again
  // after the EVAL. With confirm.replicas == 0 nothing extra is sent.
  void async_exec_confirmed(Command cmd, Confirm confirm, ConfirmedCompletion done, CallOptions opts = {});
  void async_eval_confirmed(const Script& script, std::vector<std::string> keys, std::vector<std::string> args,
                            Confirm confirm, ConfirmedCompletion done, CallOptions opts = {});
  void async_eval_views_confirmed(const Script& script, std::initializer_list<std::string_view> keys,
                                  std::initializer_list<std::string_view> args, Confirm confirm,
                                  ConfirmedCompletion done, CallOptions opts = {});

  // Several commands written back to back on one connection, so the server
  // runs them in this order (a later one sees what an earlier one did). Not
  // a transaction: other clients' commands may run between them, and a
  // failure may leave any prefix of them run. `done` runs once every one has
  // its reply or has failed. On a Redis Cluster they all go to the node that
  // serves the first one's key, and a redirect is not followed (it is that
  // command's error reply): for commands whose keys share a hash tag.
  void async_exec_in_order(std::vector<Command> cmds, InOrderCompletion done, CallOptions opts = {});

  // Asio completion-token form: `co_await async_exec(client, cmd, use_awaitable)`
  // returns the Reply or throws the call's jobguard::Error: the one place a
  // Redis failure becomes an exception on the asynchronous side.
  // (Defined below as free functions so any token works.)

  // --- blocking facade -------------------------------------------------------
  // Throw jobguard::Error on failure (never from the event-loop thread: that
  // would deadlock, and the call throws errc::invalid_argument instead).
  Reply exec(Command cmd, CallOptions opts = {});
  Reply eval(const Script& script, std::vector<std::string> keys, std::vector<std::string> args,
             CallOptions opts = {});
  std::future<Reply> exec_future(Command cmd, CallOptions opts = {});

  // Blocks until one connection is ready or the timeout passes; false on timeout.
  bool wait_connected(std::chrono::milliseconds timeout);

  // When the client is known to be down — on every connection an attempt to
  // connect (or reconnect after a break) failed, and none has been ready
  // since — the error a call would meet at its deadline: errc::not_connected,
  // source redis, naming the server and the last failure. No error while
  // connected, while making the first connection, or between a break and the
  // first reconnect attempt (0-25 ms later). Safe from any thread; a few
  // atomic loads when up.
  Error down_error() const;

  ClientStats stats() const;

  // The primaries a per-node command must visit to see the whole keyspace:
  // on a Redis Cluster each primary serving slots ("host:port", sorted), from
  // a fresh CLUSTER SHARDS (CLUSTER SLOTS before 7.0); else address() alone.
  // Throws jobguard::Error (as exec does), and never on the loop thread.
  std::vector<std::string> primaries();
  // primaries() with the slots each serves, asked for on the event loop: a
  // fresh CLUSTER SHARDS (SLOTS before 7.0). Without cluster=yes, address()
  // serving every slot. `done` runs on the loop, never inside this call.
  using PrimariesCompletion = std::function<void(const Error& err, std::vector<PrimaryShard> shards)>;
  void async_primaries(PrimariesCompletion done);

  // For the CLI/doctor: "127.0.0.1:6379".
  std::string address() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// The Error for a failed call, source redis: its code, the text (for an
// error reply, the server's own words), the server's `address` and `context`
// (what was asked: "SET", "acquire of jobguard:lock:{k}"). Allocates: call
// it on the error path only.
Error to_error(std::error_code ec, const Reply& reply, std::string_view address, std::string_view context = {});

namespace detail {
// to_error(ec, r, c.address()) thrown when `ec` is set.
void throw_if_error(const Client& c, std::error_code ec, Reply& r);
}

template <class Token>
auto async_exec(Client& c, Command cmd, Token&& token, CallOptions opts = {}) {
  return boost::asio::async_initiate<Token, void(std::exception_ptr, Reply)>(
      [&c, opts](auto handler, Command command) {
        using Handler = decltype(handler);
        using Executor = boost::asio::associated_executor_t<Handler, boost::asio::any_io_executor>;
        // The work guard: the call is outstanding work of the waiter's
        // executor until the hand-over below returns, so a caller's
        // io_context::run() on another thread than the client's loop cannot
        // return, and the io_context be destroyed, while this thread is still
        // inside dispatch() waking it (as <jobguard/async.hpp>'s Completer).
        struct Op {
          Op(Handler handler, const boost::asio::any_io_executor& fallback)
              : h(std::move(handler)), ex(boost::asio::get_associated_executor(h, fallback)), work(ex) {}
          Handler h;
          Executor ex;
          boost::asio::executor_work_guard<Executor> work;
        };
        auto op = std::make_shared<Op>(std::move(handler), c.get_executor());
        c.async_exec(
            std::move(command),
            [op](const Error& err, Reply r) {
              std::exception_ptr ep;
              if (err) ep = std::make_exception_ptr(err);
              // Resume the waiter on its own executor (inline when that is
              // the event loop, as in `jobguard bench`).
              boost::asio::dispatch(op->ex, [op, ep, r = std::move(r)]() mutable { std::move(op->h)(ep, std::move(r)); });
              op->work.reset();
            },
            opts);
      },
      token, std::move(cmd));
}

}  // namespace jobguard::redis
