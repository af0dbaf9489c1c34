// Client::Impl, shared by the client's files: client.cpp (lifecycle,
// submitting, routing on a Redis Cluster, the slot map, primaries, the
// blocking facade) and client_eval.cpp (EVALSHA with its EVAL fallback,
// confirmed writes, commands in order).
//
// Threads: as Client (client.hpp). Members marked "loop thread" are touched
// on the event loop only.
// Private to src/redis.
#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/context.hpp>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "jobguard/redis/client.hpp"
#include "redis/cluster.hpp"
#include "redis/connection.hpp"
#include "redis/multiplexer.hpp"

namespace jobguard::redis {

struct Client::Impl : std::enable_shared_from_this<Client::Impl> {
  using Request = detail::Multiplexer::Request;
  using Connection = detail::Connection;

  ConnectionOptions opts;
  std::unique_ptr<boost::asio::io_context> own_ctx;
  boost::asio::io_context* ctx = nullptr;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::thread thread;
  std::shared_ptr<boost::asio::ssl::context> ssl;
  // Shared with the handlers it posts: on a caller's io_context they may run
  // after the Client is gone, and must find `closed` set, not freed memory.
  std::shared_ptr<detail::SharedStats> stats = std::make_shared<detail::SharedStats>();
  std::vector<std::shared_ptr<Connection>> conns;
  std::size_t rr = 0;
  std::atomic<bool> closed{false};
  std::string address;  // "host:port", for messages

  // --- client.cpp ----------------------------------------------------------------
  void init();
  bool on_loop() const { return ctx->get_executor().running_in_this_thread(); }
  // Behind Sentinel the server moves: the primary the first connection last
  // dialled. Any thread.
  std::string current_address() const;
  // Loop thread: the least loaded ready connection.
  Connection& pick();
  void refuse(Completion& done, std::error_code ec, const std::string& why) {
    detail::refuse(stats.get(), done, ec, why, current_address());
  }
  void refuse_shutdown(Completion& done) { refuse(done, make_error_code(errc::shutdown), "client is shutting down"); }
  void submit(std::string payload, Completion done, CallOptions o);
  // Requests that must leave on one connection, back to back, in this order
  // (a write and the WAIT that confirms it: WAIT covers only what its own
  // connection wrote). Nothing can come between them: they are enqueued
  // together on the loop thread.
  void submit_together(std::vector<Request> rs, CallOptions o, Connection* to = nullptr);
  void close_all();
  // Any thread: conns is fixed from init() until the destructor.
  Error down_error() const;

  // --- Redis Cluster (opts.cluster), in client.cpp ----------------------------------
  // Loop thread only. Node connections by "host:port" (the seed
  // connections among them), and each slot's primary as last learned
  // (CLUSTER SLOTS, MOVED); null = not known yet: the seed.
  std::unordered_map<std::string, std::shared_ptr<Connection>> nodes;
  std::vector<Connection*> slot_owner;
  bool refreshing = false;
  detail::SlotMapSource slot_source;  // CLUSTER SHARDS, else SLOTS
  static constexpr int kMaxRedirects = 5;

  Connection& node(const std::string& host, std::uint16_t port);
  // CallOptions::node: "host:port", parsed; a refusal completes `r`.
  void submit_to_node(Request r, std::string_view where);
  Connection& pick_for(std::string_view payload);
  // Asks the seed for the slot map. One at a time; a MOVED asks again.
  void refresh_slots();
  // Client::async_primaries on the loop thread. A source per ask (the
  // client's own is refresh_slots'): SHARDS, and SLOTS where it is refused.
  void ask_primaries(std::shared_ptr<detail::SlotMapSource> source, Client::PrimariesCompletion done);
  // Sends `r` to the node owning its key; MOVED and ASK are followed (at
  // most kMaxRedirects times, inside the call's deadline), TRYAGAIN and
  // CLUSTERDOWN retried with backoff until the deadline. A redirect means
  // the command did not run where it was sent, so it is safe to resend.
  void route(Request r, int hops = 0, Connection* to = nullptr);
  // A redirect or a retryable refusal of a routed call; false when `reply`
  // is neither (the caller completes the call).
  bool reroute(const std::shared_ptr<const std::string>& payload, detail::Clock::time_point deadline, Completion& done,
               int hops, const Reply& reply);

  // --- client_eval.cpp -----------------------------------------------------------------
  // EVALSHA, and on NOSCRIPT the same call as EVAL. `tail` is the encoded
  // numkeys, keys and arguments, kept for that fallback.
  void submit_eval(const Script& script, std::size_t nkeys_args, std::string tail, Completion done,
                   CallOptions call);
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
  // The write's completion in a confirmed pair: a redirect or NOSCRIPT sends
  // the pair again; true when it did.
  bool resend_confirmed(const std::shared_ptr<Confirmed>& st, const Error& err, const Reply& r);
};

}  // namespace jobguard::redis
