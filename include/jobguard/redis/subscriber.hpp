// Pub/sub on a dedicated connection (a subscribed connection can run nothing
// else). Used by lock waiters to hear about releases. Subscriptions are
// reference-counted per channel and restored after a reconnect; because a
// message published while we were disconnected is lost for good, `on_reconnect`
// lets listeners treat a reconnect as a possible missed wake-up.
//
// Threads: every member may be called from any thread; handlers run on the
// event loop of the Client given at construction and must not block.
#pragma once

#include <functional>
#include <memory>
#include <string>

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
  void set_on_reconnect(std::function<void()> fn);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace jobguard::redis
