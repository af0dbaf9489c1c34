#include "jobguard/redis/subscriber.hpp"

#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdio>
#include <map>
#include <unordered_map>

#include "redis/connection.hpp"
#include "redis/tls_context.hpp"

namespace asio = boost::asio;

namespace jobguard::redis {

// Loop thread only, except construction.
struct Subscriber::Impl : std::enable_shared_from_this<Impl> {
  asio::io_context& ctx;
  ConnectionOptions opts;
  std::string address;
  std::shared_ptr<asio::ssl::context> ssl;
  std::shared_ptr<detail::Connection> conn;  // made on the first subscribe
  asio::steady_timer ping_timer;
  bool closed = false, ever_up = false, ping_in_flight = false;
  struct Sub {
    std::string channel;
    Handler handler;
  };
  std::unordered_map<Id, Sub> subs;
  std::unordered_map<std::string, int> refcount;
  std::multimap<std::string, std::function<void()>> ready_waiters;  // channel -> on_ready
  std::unordered_map<std::string, bool> confirmed;
  std::function<void()> on_reconnect;
  std::function<void(const Error&)> on_error;
  std::string last_reported;  // the refusal reported last; cleared by a success

  explicit Impl(Client& c)
      : ctx(c.context()),
        opts(c.options()),
        address(fmt::format("{}:{}", opts.host, opts.port)),
        ping_timer(c.context()) {
    // A context of its own, built from the same options as the client's, so
    // the server is verified the same way (the client validated the files).
    if (opts.tls.enabled) ssl = detail::make_tls_context(opts.tls);
    // The subscriber's connection is not one of the client's: naming it apart
    // lets `CLIENT LIST` tell them apart.
    if (!opts.client_name.empty()) opts.client_name += "-sub";
  }

  void start() {
    conn = std::make_shared<detail::Connection>(ctx, opts, ssl, std::make_shared<detail::SharedStats>());
    std::weak_ptr<Impl> weak = weak_from_this();
    conn->set_on_ready([weak] {
      if (auto self = weak.lock()) self->on_up();
    });
    conn->set_push_handler([weak](Reply& r) {
      auto self = weak.lock();
      return self && self->on_push(r);
    });
    conn->set_on_fatal([weak](std::error_code ec, const std::string& why) {
      if (auto self = weak.lock()) self->report(Error(ec, why, error_source::redis));
    });
    conn->start();
    arm_ping();
  }

  // The heartbeat (ConnectionOptions::subscriber_ping_interval): one PING at
  // a time, so timeouts in a row are PINGs in a row. Its reply (["pong", ""]
  // when subscribed) is matched to it in order like any reply; a timeout is
  // counted by the connection, which replaces itself after
  // recycle_after_timeouts of them, and on_up() then resubscribes.
  void arm_ping() {
    if (closed || opts.subscriber_ping_interval.count() == 0) return;
    ping_timer.expires_after(opts.subscriber_ping_interval);
    std::weak_ptr<Impl> weak = weak_from_this();
    ping_timer.async_wait([weak](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->closed) return;
      if (!self->ping_in_flight && self->conn->ready()) {
        self->ping_in_flight = true;
        self->send(Command{"PING"}, [weak](std::error_code, Reply) {
          if (auto s = weak.lock()) s->ping_in_flight = false;
        });
      }
      self->arm_ping();
    });
  }

  void report(const Error& e) {
    if (closed || e.what() == last_reported) return;
    last_reported = e.what();
    if (on_error) return on_error(e);
    const std::string line = fmt::format("pub/sub: {}", e.what());
    if (opts.on_warning) opts.on_warning(line);
    else std::fprintf(stderr, "jobguard: warning: %s\n", line.c_str());
  }

  // Every connect, first or not: the old connection's subscriptions died with it.
  void on_up() {
    if (closed) return;
    for (auto& [ch, n] : refcount) {
      if (n <= 0) continue;
      confirmed[ch] = false;
      send_subscribe(ch);
    }
    const bool was_up = ever_up;
    ever_up = true;
    if (was_up && on_reconnect) on_reconnect();
  }

  void send(const Command& c, Completion done) {
    detail::Multiplexer::Request r;
    r.payload = c.payload();
    r.deadline = detail::Clock::now() + opts.command_timeout;
    r.done = std::move(done);
    conn->submit(std::move(r));
  }

  void send_subscribe(const std::string& channel) {
    std::weak_ptr<Impl> weak = weak_from_this();
    send(Command{"SUBSCRIBE", channel}, [weak, channel](std::error_code ec, Reply r) {
      auto self = weak.lock();
      if (!self || self->closed) return;
      if (ec) {
        // A refusal by the server (NOPERM from an ACL without this channel)
        // is reported; a broken connection is not: the reconnect resubscribes.
        if (r.is_error())
          self->report(to_error(ec, r, self->address, fmt::format("SUBSCRIBE {} refused", channel)));
        return;
      }
      self->last_reported.clear();
      self->on_confirmed(channel);
    });
  }

  // Pub/sub messages (not replies to our commands); the SUBSCRIBE and
  // UNSUBSCRIBE confirmations go to their requests in order.
  bool on_push(Reply& r) {
    if (!r.is_array() || r.elements.size() < 3 || !r.elements[0].is_string() || r.elements[0].str != "message")
      return false;
    const std::string& channel = r.elements[1].str;
    const std::string& msg = r.elements[2].str;
    // Copy handlers first: one may unsubscribe while we iterate.
    std::vector<Handler> hs;
    for (auto& [id, s] : subs)
      if (s.channel == channel) hs.push_back(s.handler);
    for (auto& h : hs) h(channel, msg);
    return true;
  }

  void on_confirmed(const std::string& channel) {
    auto rc = refcount.find(channel);
    if (rc == refcount.end() || rc->second <= 0) return;  // unsubscribed meanwhile
    confirmed[channel] = true;
    auto [b, e] = ready_waiters.equal_range(channel);
    std::vector<std::function<void()>> fs;
    for (auto it = b; it != e; ++it) fs.push_back(std::move(it->second));
    ready_waiters.erase(b, e);
    for (auto& f : fs) f();
  }

  void do_subscribe(Id id, const std::string& channel, Handler h, std::function<void()> on_ready) {
    if (closed) return;
    if (!conn) start();
    subs.emplace(id, Sub{channel, std::move(h)});
    if (refcount[channel]++ == 0) {
      confirmed[channel] = false;
      if (on_ready) ready_waiters.emplace(channel, std::move(on_ready));
      // While disconnected, on_up() subscribes everything at once.
      if (conn->ready()) send_subscribe(channel);
    } else if (on_ready) {
      if (confirmed[channel]) on_ready();
      else ready_waiters.emplace(channel, std::move(on_ready));
    }
  }

  void do_unsubscribe(Id id) {
    auto it = subs.find(id);
    if (it == subs.end()) return;
    const std::string ch = it->second.channel;
    subs.erase(it);
    if (--refcount[ch] == 0) {
      refcount.erase(ch);
      confirmed.erase(ch);
      ready_waiters.erase(ch);
      if (conn && conn->ready()) send(Command{"UNSUBSCRIBE", ch}, [](std::error_code, Reply) {});
    }
  }

  void close() {
    closed = true;
    ping_timer.cancel();
    if (conn) conn->close();
    subs.clear();
    ready_waiters.clear();
  }
};

Subscriber::Subscriber(Client& client) : impl_(std::make_shared<Impl>(client)) {}

Subscriber::~Subscriber() {
  auto impl = impl_;
  asio::post(impl->ctx, [impl] { impl->close(); });
}

Subscriber::Id Subscriber::subscribe(const std::string& channel, Handler handler, std::function<void()> on_ready) {
  // Ids are handed out before the loop sees the request, so the caller can
  // unsubscribe right away.
  static std::atomic<Id> ids{1};
  const Id id = ids.fetch_add(1);
  asio::post(impl_->ctx, [impl = impl_, id, channel, handler = std::move(handler), on_ready = std::move(on_ready)]() mutable {
    impl->do_subscribe(id, channel, std::move(handler), std::move(on_ready));
  });
  return id;
}

void Subscriber::unsubscribe(Id id) {
  asio::post(impl_->ctx, [impl = impl_, id] { impl->do_unsubscribe(id); });
}

void Subscriber::set_on_reconnect(std::function<void()> fn) {
  asio::post(impl_->ctx, [impl = impl_, fn = std::move(fn)]() mutable { impl->on_reconnect = std::move(fn); });
}

void Subscriber::set_on_error(std::function<void(const Error&)> fn) {
  asio::post(impl_->ctx, [impl = impl_, fn = std::move(fn)]() mutable { impl->on_error = std::move(fn); });
}

}  // namespace jobguard::redis
