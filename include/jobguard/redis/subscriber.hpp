// Pub/sub on a dedicated connection (a subscribed connection can run nothing
// else); on a Redis Cluster, sharded pub/sub (SSUBSCRIBE) on one connection
// per node, each channel on the primary of its slot (docs/redis-client.md). Used by lock waiters to hear about releases. Subscriptions are
// reference-counted per channel and restored after a reconnect; because a
// message published while we were disconnected is lost for good, `on_reconnect`
// lets listeners treat a reconnect as a possible missed wake-up.
//
// The connection is the client's own kind (src/redis/connection.hpp): the same
// connect, TLS, keepalive, handshake (AUTH, SELECT, CLIENT SETNAME), reply
// reader and limits, error classification and reconnect backoff. What the
// server refuses is reported through `on_error`, never dropped: a rejected
// AUTH (WRONGPASS) or a SUBSCRIBE the ACL forbids (NOPERM) means nobody hears
// releases and waiters are down to polling, which their user must learn.
//
// Threads: every member may be called from any thread; handlers run on the
// event loop of the Client given at construction and must not block.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::redis {

class Subscriber {
 public:
  using Handler = std::function<void(const std::string& channel, const std::string& message)>;
  using Id = std::uint64_t;

  // Shares `client`'s event loop and connection options; does not use its
  // connections. `client` must outlive the subscriber.
  explicit Subscriber(Client& client);
  ~Subscriber();
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  // `on_ready` (optional) runs once the server has confirmed the subscription
  // (or at once if the channel was already subscribed); it is how a waiter
  // closes the subscribe-then-check race.
  Id subscribe(const std::string& channel, Handler handler, std::function<void()> on_ready = {});
  void unsubscribe(Id id);
  // Called on the loop after every reconnect (not the first connect).
  // Standalone and Sentinel only: on a cluster each node's connection comes
  // and goes on its own, and set_on_resubscribed says which channel is back.
  void set_on_reconnect(std::function<void()> fn);
  // Cluster (ConnectionOptions::cluster): called on the loop with a channel
  // whose subscription was lost (its node's connection broke, the server
  // unsubscribed it when its slot moved, a failover moved it to another node)
  // and is confirmed again. Messages published in between are gone.
  void set_on_resubscribed(std::function<void(const std::string& channel)> fn);
  // Called on the loop with an Error (source redis, the server's words, its
  // host:port, the channel) when the server refuses the connection's AUTH or
  // a SUBSCRIBE; once per distinct refusal until the next successful one.
  // Unset: the line goes to the client's ConnectionOptions::on_warning.
  void set_on_error(std::function<void(const Error&)> fn);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace jobguard::redis
