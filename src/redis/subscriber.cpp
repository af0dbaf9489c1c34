#include "jobguard/redis/subscriber.hpp"

#include "redis/tls_context.hpp"

#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <openssl/ssl.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <map>
#include <optional>
#include <random>
#include <unordered_map>

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace jobguard::redis {

struct Subscriber::Impl : std::enable_shared_from_this<Impl> {
  asio::any_io_executor ex;
  ConnectionOptions opts;
  std::shared_ptr<asio::ssl::context> ssl;
  tcp::resolver resolver;
  std::optional<tcp::socket> plain;
  std::optional<asio::ssl::stream<tcp::socket>> tls;
  asio::steady_timer timer;  // connect deadline and reconnect backoff
  std::array<char, 16 * 1024> rbuf{};
  std::unique_ptr<redisReader, void (*)(redisReader*)> reader{nullptr, redisReaderFree};
  std::string wbuf, pending_wbuf;
  bool writing = false, up = false, closed = false, ever_up = false;
  std::uint64_t generation = 0;
  int attempt = 0;
  std::mt19937_64 rng{std::random_device{}()};
  Id next_id = 1;
  struct Sub {
    std::string channel;
    Handler handler;
  };
  std::unordered_map<Id, Sub> subs;
  std::unordered_map<std::string, int> refcount;
  std::multimap<std::string, std::function<void()>> ready_waiters;  // channel -> on_ready
  std::unordered_map<std::string, bool> confirmed;
  std::function<void()> on_reconnect;

  Impl(Client& c) : ex(c.get_executor()), opts(c.options()), resolver(ex), timer(ex) {
    // Same context as the client's connections (it already validated the files).
    if (opts.tls.enabled) ssl = detail::make_tls_context(opts.tls);
  }

  void send(std::initializer_list<std::string_view> args) {
    Command c(args);
    pending_wbuf += c.payload();
    flush();
  }

  void flush() {
    if (!up || writing || pending_wbuf.empty()) return;
    wbuf.swap(pending_wbuf);
    pending_wbuf.clear();
    writing = true;
    auto h = [self = shared_from_this(), gen = generation](boost::system::error_code ec, std::size_t) {
      if (gen != self->generation) return;
      self->writing = false;
      if (ec) return self->broken();
      self->flush();
    };
    if (tls) asio::async_write(*tls, asio::buffer(wbuf), h);
    else asio::async_write(*plain, asio::buffer(wbuf), h);
  }

  void connect() {
    if (closed) return;
    ++generation;
    const auto gen = generation;
    auto self = shared_from_this();
    timer.expires_after(opts.connect_timeout);
    timer.async_wait([self, gen](boost::system::error_code ec) {
      if (!ec && gen == self->generation && !self->up) self->broken();
    });
    resolver.async_resolve(opts.host, std::to_string(opts.port),
                           [self, gen](boost::system::error_code ec, tcp::resolver::results_type r) {
                             if (gen != self->generation || self->closed) return;
                             if (ec) return self->broken();
                             self->connect_to(r, gen);
                           });
  }

  void connect_to(const tcp::resolver::results_type& r, std::uint64_t gen) {
    auto self = shared_from_this();
    if (ssl) {
      tls.emplace(ex, *ssl);
      const std::string& sni = opts.tls.server_name.empty() ? opts.host : opts.tls.server_name;
      SSL_ctrl(tls->native_handle(), SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
               const_cast<char*>(sni.c_str()));
      if (opts.tls.verify_peer) tls->set_verify_callback(asio::ssl::host_name_verification(sni));
      asio::async_connect(tls->lowest_layer(), r, [self, gen](boost::system::error_code ec, const tcp::endpoint&) {
        if (gen != self->generation || self->closed) return;
        if (ec) return self->broken();
        self->tls->async_handshake(asio::ssl::stream_base::client, [self, gen](boost::system::error_code hec) {
          if (gen != self->generation || self->closed) return;
          if (hec) return self->broken();
          self->on_up();
        });
      });
    } else {
      plain.emplace(ex);
      asio::async_connect(*plain, r, [self, gen](boost::system::error_code ec, const tcp::endpoint&) {
        if (gen != self->generation || self->closed) return;
        if (ec) return self->broken();
        self->on_up();
      });
    }
  }

  void on_up() {
    timer.cancel();
    up = true;
    attempt = 0;
    reader.reset(redisReaderCreate());
    read();
    // AUTH first; its reply (+OK) is consumed like any non-message reply.
    std::string prefix;
    if (!opts.password.empty()) {
      Command auth = opts.user.empty() ? Command{"AUTH", opts.password} : Command{"AUTH", opts.user, opts.password};
      prefix = auth.payload();
    }
    // Resubscribe every channel: the old connection's subscriptions died with it.
    std::string subs_cmds;
    for (auto& [ch, n] : refcount) {
      if (n <= 0) continue;
      confirmed[ch] = false;
      subs_cmds += Command{"SUBSCRIBE", ch}.payload();
    }
    pending_wbuf = prefix + subs_cmds + pending_wbuf;
    flush();
    const bool was_up = ever_up;
    ever_up = true;
    if (was_up && on_reconnect) on_reconnect();
  }

  void broken() {
    if (closed) return;
    up = false;
    writing = false;
    ++generation;
    boost::system::error_code ignored;
    if (plain) plain->close(ignored), plain.reset();
    if (tls) tls->lowest_layer().close(ignored), tls.reset();
    // Commands queued for the dead connection are replaced by the resubscribe
    // list on the next connect.
    pending_wbuf.clear();
    const auto cap = std::min<long long>(opts.reconnect_max.count(), opts.reconnect_min.count() << std::min(attempt, 16));
    ++attempt;
    std::uniform_int_distribution<long long> d(0, std::max<long long>(cap, 1));
    timer.expires_after(std::chrono::milliseconds(d(rng)));
    timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec && !self->closed && !self->up) self->connect();
    });
  }

  void read() {
    auto h = [self = shared_from_this(), gen = generation](boost::system::error_code ec, std::size_t n) {
      if (gen != self->generation) return;
      if (ec) return self->broken();
      redisReaderFeed(self->reader.get(), self->rbuf.data(), n);
      for (;;) {
        void* raw = nullptr;
        if (redisReaderGetReply(self->reader.get(), &raw) != REDIS_OK) return self->broken();
        if (!raw) break;
        self->on_reply(static_cast<redisReply*>(raw));
        freeReplyObject(raw);
        if (gen != self->generation) return;
      }
      self->read();
    };
    if (tls) tls->async_read_some(asio::buffer(rbuf), h);
    else plain->async_read_some(asio::buffer(rbuf), h);
  }

  void on_reply(redisReply* r) {
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3) return;  // +OK to AUTH
    const std::string kind(r->element[0]->str, r->element[0]->len);
    const std::string channel(r->element[1]->str ? r->element[1]->str : "", r->element[1]->len);
    if (kind == "message" && r->element[2]->type == REDIS_REPLY_STRING) {
      const std::string msg(r->element[2]->str, r->element[2]->len);
      // Copy handlers first: one may unsubscribe while we iterate.
      std::vector<Handler> hs;
      for (auto& [id, s] : subs)
        if (s.channel == channel) hs.push_back(s.handler);
      for (auto& h : hs) h(channel, msg);
    } else if (kind == "subscribe") {
      confirmed[channel] = true;
      auto [b, e] = ready_waiters.equal_range(channel);
      std::vector<std::function<void()>> fs;
      for (auto it = b; it != e; ++it) fs.push_back(std::move(it->second));
      ready_waiters.erase(b, e);
      for (auto& f : fs) f();
    }
  }

  void do_subscribe(Id id, const std::string& channel, Handler h, std::function<void()> on_ready) {
    if (closed) return;
    subs.emplace(id, Sub{channel, std::move(h)});
    if (refcount[channel]++ == 0) {
      confirmed[channel] = false;
      if (on_ready) ready_waiters.emplace(channel, std::move(on_ready));
      if (up) send({"SUBSCRIBE", channel});
      if (!up && !ever_up && generation == 0) connect();
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
      if (up) send({"UNSUBSCRIBE", ch});
    }
  }

  void close() {
    closed = true;
    ++generation;
    timer.cancel();
    resolver.cancel();
    boost::system::error_code ignored;
    if (plain) plain->close(ignored);
    if (tls) tls->lowest_layer().close(ignored);
    subs.clear();
    ready_waiters.clear();
  }
};

Subscriber::Subscriber(Client& client) : impl_(std::make_shared<Impl>(client)) {}

Subscriber::~Subscriber() {
  auto impl = impl_;
  asio::post(impl->ex, [impl] { impl->close(); });
}

Subscriber::Id Subscriber::subscribe(const std::string& channel, Handler handler, std::function<void()> on_ready) {
  // Ids are handed out before the loop sees the request, so the caller can
  // unsubscribe right away; the loop thread is the only reader of next_id
  // otherwise, hence the atomic-free counter guarded by the post order.
  static std::atomic<Id> ids{1};
  const Id id = ids.fetch_add(1);
  asio::post(impl_->ex, [impl = impl_, id, channel, handler = std::move(handler), on_ready = std::move(on_ready)]() mutable {
    impl->do_subscribe(id, channel, std::move(handler), std::move(on_ready));
  });
  return id;
}

void Subscriber::unsubscribe(Id id) {
  asio::post(impl_->ex, [impl = impl_, id] { impl->do_unsubscribe(id); });
}

void Subscriber::set_on_reconnect(std::function<void()> fn) {
  asio::post(impl_->ex, [impl = impl_, fn = std::move(fn)]() mutable { impl->on_reconnect = std::move(fn); });
}

}  // namespace jobguard::redis
