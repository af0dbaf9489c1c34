#include "jobguard/redis/subscriber.hpp"

#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdio>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "redis/cluster.hpp"
#include "redis/connection.hpp"
#include "redis/tls_context.hpp"

namespace asio = boost::asio;

namespace jobguard::redis {

// Loop thread only, except construction.
struct Subscriber::Impl : std::enable_shared_from_this<Impl> {
  asio::io_context& ctx;
  Client* client;  // outlives us (the constructor's contract); used only while !closed
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
  std::function<void(const std::string&)> on_resubscribed;
  std::string last_reported;  // the refusal reported last; cleared by a success

  // --- Redis Cluster (opts.cluster): sharded pub/sub -------------------------
  // Classic pub/sub on a cluster is broadcast over the cluster bus to every
  // node, and a fair handoff's PUBLISH counts only the receivers on the node
  // that ran the script. A shard channel lives in a slot like a key: SPUBLISH
  // reaches the subscribers on that slot's shard only, and counts those on
  // the node that ran it. So each channel is SSUBSCRIBEd on its slot's
  // primary, one connection per node, and follows its slot when it moves.
  struct Node {
    std::shared_ptr<detail::Connection> conn;
    std::string address;
    bool ping_in_flight = false;
    // No channel was placed on it at the last heartbeat either: closed at
    // this one (a node left behind by a failover or a slot's move, or whose
    // waiters are all gone, is not dialled and pinged forever).
    bool idle_seen = false;
    // SUNSUBSCRIBEs we sent on this connection whose confirmation is due:
    // the confirmation and the server's own unsubscribe when a slot leaves the
    // node are the same ["sunsubscribe", channel, n] push; these counts tell
    // them apart. Reset when the connection is (re)made.
    std::unordered_map<std::string, int> own_sunsub;
  };
  std::unordered_map<std::string, std::shared_ptr<Node>> nodes;  // by "host:port"
  std::unordered_map<std::string, std::string> placed;           // channel -> node its SSUBSCRIBE went to
  std::unordered_set<std::string> ever_confirmed;                // channels confirmed since they were asked for
  std::vector<detail::SlotRange> ranges;                         // the slot map, sorted by first slot
  std::unordered_map<std::uint16_t, std::string> moved;          // MOVED since the map was asked for
  bool have_map = false, map_in_flight = false, map_again = false;
  detail::SlotMapSource slot_source;  // CLUSTER SHARDS, else SLOTS
  asio::steady_timer retry_timer;
  bool retry_armed = false;
  int retry_round = 0;

  explicit Impl(Client& c)
      : ctx(c.context()),
        client(&c),
        opts(c.options()),
        address(fmt::format("{}:{}", opts.host, opts.port)),
        ping_timer(c.context()),
        retry_timer(c.context()) {
    // A context of its own, built from the same options as the client's, so
    // the server is verified the same way (the client validated the files).
    if (opts.tls.enabled || opts.sentinel.tls) ssl = detail::make_tls_context(opts.tls);
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
    conn->set_on_fatal([weak](const Error& e) {
      if (auto self = weak.lock()) self->report(e);
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
      if (self->opts.cluster) {
        self->ping_nodes();
      } else if (!self->ping_in_flight && self->conn->ready()) {
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
    if (!opts.cluster && !conn) start();
    if (opts.cluster && !ping_armed) {
      ping_armed = true;
      arm_ping();
    }
    subs.emplace(id, Sub{channel, std::move(h)});
    if (refcount[channel]++ == 0) {
      confirmed[channel] = false;
      if (on_ready) ready_waiters.emplace(channel, std::move(on_ready));
      if (opts.cluster) {
        place(channel);
      } else if (conn->ready()) {
        // While disconnected, on_up() subscribes everything at once.
        send_subscribe(channel);
      }
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
      if (opts.cluster) {
        ever_confirmed.erase(ch);
        auto p = placed.find(ch);
        if (p == placed.end()) return;
        auto n = nodes.find(p->second);
        placed.erase(p);
        if (n != nodes.end()) send_sunsubscribe(*n->second, ch);
        return;
      }
      if (conn && conn->ready()) send(Command{"UNSUBSCRIBE", ch}, [](std::error_code, Reply) {});
    }
  }

  // --- cluster --------------------------------------------------------------
  bool ping_armed = false;

  bool wanted(const std::string& ch) const {
    auto it = refcount.find(ch);
    return it != refcount.end() && it->second > 0;
  }

  // "host:port" of the primary the map (or a later MOVED) names for `slot`;
  // the seed when the map has no owner for it.
  std::string owner_of(std::uint16_t slot) const {
    if (auto m = moved.find(slot); m != moved.end()) return m->second;
    auto it = std::upper_bound(ranges.begin(), ranges.end(), slot,
                               [](std::uint16_t s, const detail::SlotRange& r) { return s < r.first; });
    if (it != ranges.begin()) {
      --it;
      if (slot <= it->last) return fmt::format("{}:{}", it->host, it->port);
    }
    return address;
  }

  Node& node(const std::string& where) {
    if (auto it = nodes.find(where); it != nodes.end()) return *it->second;
    auto n = std::make_shared<Node>();
    n->address = where;
    ConnectionOptions no = opts;
    const auto colon = where.rfind(':');
    no.host = where.substr(0, colon);
    no.port = static_cast<std::uint16_t>(std::stoul(where.substr(colon + 1)));
    n->conn = std::make_shared<detail::Connection>(ctx, no, ssl, std::make_shared<detail::SharedStats>());
    std::weak_ptr<Impl> weak = weak_from_this();
    std::weak_ptr<Node> wn = n;
    n->conn->set_on_ready([weak, wn] {
      auto self = weak.lock();
      auto nn = wn.lock();
      if (self && nn) self->node_up(*nn);
    });
    n->conn->set_push_handler([weak, wn](Reply& r) {
      auto self = weak.lock();
      auto nn = wn.lock();
      return self && nn && self->node_push(*nn, r);
    });
    n->conn->set_on_fatal([weak](const Error& e) {
      if (auto self = weak.lock()) self->report(e);
    });
    nodes.emplace(where, n);
    n->conn->start();
    return *n;
  }

  // Sends the channel's SSUBSCRIBE to its slot's primary (when the map is
  // in; else once it arrives).
  void place(const std::string& ch) {
    if (!have_map) return ask_map();
    const std::string where = owner_of(detail::key_slot(ch));
    placed[ch] = where;
    Node& n = node(where);
    if (n.conn->ready()) send_ssubscribe(n, ch);  // else node_up() sends it
  }

  // Every (re)connect of a node: its subscriptions died with the old connection.
  void node_up(Node& n) {
    if (closed) return;
    n.own_sunsub.clear();
    n.ping_in_flight = false;
    for (auto& [ch, where] : placed) {
      if (where != n.address || !wanted(ch)) continue;
      confirmed[ch] = false;
      send_ssubscribe(n, ch);
    }
  }

  void send_on(Node& n, const Command& c, Completion done, bool no_reply = false) {
    detail::Multiplexer::Request r;
    r.payload = c.payload();
    r.deadline = detail::Clock::now() + opts.command_timeout;
    r.done = std::move(done);
    r.no_reply = no_reply;
    n.conn->submit(std::move(r));
  }

  void send_sunsubscribe(Node& n, const std::string& ch) {
    // Only on a live connection: one that breaks before writing it fails it
    // (nothing to count), and a new one has no subscriptions to drop.
    if (!n.conn->ready()) return;
    ++n.own_sunsub[ch];
    send_on(n, Command{"SUNSUBSCRIBE", ch}, [](std::error_code, Reply) {}, true);
  }

  void send_ssubscribe(Node& n, const std::string& ch) {
    std::weak_ptr<Impl> weak = weak_from_this();
    const std::string where = n.address;
    send_on(n, Command{"SSUBSCRIBE", ch}, [weak, ch, where](std::error_code ec, Reply r) {
      auto self = weak.lock();
      if (!self || self->closed) return;
      // Stale: the channel was dropped, or has moved to another node since.
      auto p = self->placed.find(ch);
      if (!self->wanted(ch) || p == self->placed.end() || p->second != where) return;
      if (!ec) {
        self->last_reported.clear();
        self->retry_round = 0;
        const bool again = !self->ever_confirmed.insert(ch).second;
        self->on_confirmed(ch);
        if (again && self->on_resubscribed) self->on_resubscribed(ch);
        return;
      }
      if (r.is_error()) {
        if (auto rd = detail::parse_redirect(r.str); rd && rd->kind == detail::Redirect::Kind::moved) {
          // The slot has another primary: go there now, and ask for the map,
          // which has more slots wrong.
          self->moved[rd->slot] = fmt::format("{}:{}", rd->host, rd->port);
          self->ask_map();
          return self->place(ch);
        }
        if (ec == errc::permission_denied || ec == errc::auth_failed) {
          // NOPERM (an ACL without this channel) will not fix itself.
          return self->report(to_error(ec, r, where, fmt::format("SSUBSCRIBE {} refused", ch)));
        }
      }
      // CLUSTERDOWN or TRYAGAIN (a failover or a migration in progress), an
      // ASK, a timeout: ask for the map again in a while and subscribe where
      // it says. A broken connection resubscribes by itself when it is back
      // (node_up), and a map that names another primary moves the channel.
      self->retry_later();
    });
  }

  // Messages and the server's own SUNSUBSCRIBE (a slot left the node) on a
  // node's connection; replies to our commands go to their requests.
  bool node_push(Node& n, Reply& r) {
    if (!r.is_array() || r.elements.size() < 3 || !r.elements[0].is_string()) return false;
    const std::string& kind = r.elements[0].str;
    if (kind == "smessage") {
      deliver(r.elements[1].str, r.elements[2].str);
      return true;
    }
    if (kind != "sunsubscribe") return false;
    const std::string ch = r.elements[1].str;
    if (auto it = n.own_sunsub.find(ch); it != n.own_sunsub.end() && it->second > 0) {
      if (--it->second == 0) n.own_sunsub.erase(it);
      return true;
    }
    auto p = placed.find(ch);
    if (wanted(ch) && p != placed.end() && p->second == n.address) {
      // The slot left this node (migrated, or the node was demoted): follow
      // it once the map says where it is.
      confirmed[ch] = false;
      placed.erase(p);
      ask_map();
    }
    return true;
  }

  void deliver(const std::string& channel, const std::string& msg) {
    // Copy handlers first: one may unsubscribe while we iterate.
    std::vector<Handler> hs;
    for (auto& [id, sub] : subs)
      if (sub.channel == channel) hs.push_back(sub.handler);
    for (auto& h : hs) h(channel, msg);
  }

  // Asks for the slot map through the client (a subscribed connection can
  // run nothing else; the client's call has its deadline), one request at a
  // time: one asked for meanwhile is asked again once it is in. On arrival
  // every wanted channel not on its slot's primary is moved there.
  void ask_map() {
    if (closed) return;
    if (map_in_flight) {
      map_again = true;
      return;
    }
    map_in_flight = true;
    map_again = false;
    std::weak_ptr<Impl> weak = weak_from_this();
    client->async_exec(Command(slot_source.command()), [weak](std::error_code ec, Reply r) {
      auto self = weak.lock();
      if (!self) return;
      // On the client's loop, which is ours.
      self->map_in_flight = false;
      if (self->closed) return;
      auto got = self->slot_source.parse(ec, r, self->opts.host, self->opts.tls.enabled);
      if (got.empty()) {
        if (self->slot_source.retry_with_slots()) return self->ask_map();
        return self->retry_later();
      }
      std::sort(got.begin(), got.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      self->ranges = std::move(got);
      self->have_map = true;
      // A MOVED that came while this map was on its way may be newer than it.
      if (!self->map_again) self->moved.clear();
      self->reconcile();
      if (self->map_again) self->ask_map();
    });
  }

  // Every wanted channel on its slot's primary as the map says.
  void reconcile() {
    std::vector<std::string> chs;
    for (auto& [ch, n] : refcount)
      if (n > 0) chs.push_back(ch);
    for (const auto& ch : chs) {
      const std::string where = owner_of(detail::key_slot(ch));
      auto p = placed.find(ch);
      if (p != placed.end() && p->second == where) continue;
      if (p != placed.end()) {
        // Still subscribed on the old node (a replica now, say): drop it
        // there, so SPUBLISH's count on the primary is the one that matters.
        if (auto old = nodes.find(p->second); old != nodes.end()) send_sunsubscribe(*old->second, ch);
        confirmed[ch] = false;
      }
      place(ch);
    }
  }

  void retry_later() {
    if (closed || retry_armed) return;
    retry_armed = true;
    // 50 ms doubling to 800 ms: a failover takes the cluster a second or two.
    const auto d = std::chrono::milliseconds(50 << std::min(retry_round++, 4));
    retry_timer.expires_after(d);
    std::weak_ptr<Impl> weak = weak_from_this();
    retry_timer.async_wait([weak](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->closed) return;
      self->retry_armed = false;
      // A channel whose SSUBSCRIBE failed is moved by the map if its slot
      // moved; one still owned by the same node is asked for there again.
      for (auto& [ch, n] : self->refcount) {
        if (n <= 0 || self->confirmed[ch]) continue;
        auto p = self->placed.find(ch);
        if (p == self->placed.end()) continue;
        auto nd = self->nodes.find(p->second);
        if (nd != self->nodes.end() && nd->second->conn->ready()) self->send_ssubscribe(*nd->second, ch);
      }
      self->ask_map();
    });
  }

  // The heartbeat on every node connection, and a look at the slot map.
  void ping_nodes() {
    std::unordered_set<std::string> in_use;
    for (const auto& [ch, w] : placed) in_use.insert(w);
    std::vector<std::shared_ptr<Node>> idle;
    for (auto it = nodes.begin(); it != nodes.end();) {
      auto& n = it->second;
      if (in_use.count(it->first)) {
        n->idle_seen = false;
      } else if (!n->idle_seen) {
        n->idle_seen = true;
      } else {
        // Two heartbeats without a channel: its subscriptions (none, or
        // SUNSUBSCRIBEs still unconfirmed) end with the connection.
        idle.push_back(std::move(n));
        it = nodes.erase(it);
        continue;
      }
      ++it;
      if (!n->conn->ready() || n->ping_in_flight) continue;
      n->ping_in_flight = true;
      std::weak_ptr<Node> wn = n;
      send_on(*n, Command{"PING"}, [wn](std::error_code, Reply) {
        if (auto nn = wn.lock()) nn->ping_in_flight = false;
      });
    }
    // Closed once out of the map: a completion the close runs may place a
    // channel (and so add a node) again.
    for (auto& n : idle) n->conn->close();
    // The map is asked for at every heartbeat while channels are placed: a
    // node holding channels that is not connected may be gone for good, and
    // a manual failover leaves the old primary up as a replica that Redis 7.0
    // neither unsubscribes us from nor (while the new primary does not yet
    // count it in its shard) forwards SPUBLISH to, so a release published
    // then is never heard there. The reconcile moves
    // such channels to the new primary, and on_resubscribed makes their
    // waiters try again (a release may have been missed). One CLUSTER SHARDS
    // per heartbeat per process, the way Redisson scans its topology.
    if (!placed.empty()) ask_map();
  }

  void close() {
    closed = true;
    ping_timer.cancel();
    retry_timer.cancel();
    if (conn) conn->close();
    for (auto& [where, n] : nodes) n->conn->close();
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

void Subscriber::set_on_resubscribed(std::function<void(const std::string&)> fn) {
  asio::post(impl_->ctx, [impl = impl_, fn = std::move(fn)]() mutable { impl->on_resubscribed = std::move(fn); });
}

void Subscriber::set_on_error(std::function<void(const Error&)> fn) {
  asio::post(impl_->ctx, [impl = impl_, fn = std::move(fn)]() mutable { impl->on_error = std::move(fn); });
}

}  // namespace jobguard::redis
