// The I/O shell of the metrics server: sockets, deadlines and eviction on
// its own Asio loop. Requests are parsed, routed and serialized by the
// sans-IO code in http_request.cpp.
#include "jobguard/ops/metrics_server.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cctype>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "jobguard/error.hpp"
#include "jobguard/observe/exposition.hpp"
#include "jobguard/observe/json.hpp"
#include "jobguard/text.hpp"
#include "ops/http_request.hpp"

namespace jobguard::ops {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;
using observe::kPrometheusContentType;
using observe::Registry;
using observe::to_json;
using observe::to_prometheus;

namespace {

[[noreturn]] void bad_listen(std::string_view text, std::string_view why) {
  throw Error(errc::invalid_argument, fmt::format("listen address \"{}\": {}", escape_text(text, 128), why));
}

bool valid_host_name(std::string_view h) {
  for (unsigned char c : h)
    if (!(std::isalnum(c) || c == '.' || c == '-' || c == '_')) return false;
  return true;
}

bool valid_ipv6_text(std::string_view h) {
  for (unsigned char c : h)
    if (!(std::isxdigit(c) || c == ':' || c == '.' || c == '%' || std::isalnum(c))) return false;
  return h.find(':') != std::string_view::npos;
}

}  // namespace

ListenAddress parse_listen_address(std::string_view text) {
  if (text.empty()) bad_listen(text, "is empty; expected HOST:PORT, e.g. 127.0.0.1:9464");
  ListenAddress out;
  std::string_view port_text;
  if (text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) bad_listen(text, "missing ']' after the IPv6 address");
    out.host = std::string(text.substr(1, close - 1));
    if (out.host.empty()) bad_listen(text, "IPv6 address between [] is empty");
    if (!valid_ipv6_text(out.host)) bad_listen(text, fmt::format("\"{}\" is not an IPv6 address", escape_text(out.host, 64)));
    const auto rest = text.substr(close + 1);
    if (rest.empty() || rest.front() != ':') bad_listen(text, "expected :PORT after ']'");
    port_text = rest.substr(1);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) bad_listen(text, "missing :PORT; expected HOST:PORT, e.g. 127.0.0.1:9464");
    out.host = std::string(text.substr(0, colon));
    if (out.host.empty()) bad_listen(text, "host is empty; use 0.0.0.0 to listen on every interface");
    if (out.host.find(':') != std::string::npos)
      bad_listen(text, "an IPv6 address needs brackets, e.g. [::1]:9464");
    if (!valid_host_name(out.host)) bad_listen(text, fmt::format("\"{}\" is not a host name or address", escape_text(out.host, 64)));
    port_text = text.substr(colon + 1);
  }
  if (port_text.empty()) bad_listen(text, "port is empty; expected 0..65535");
  if (port_text.size() > 5) bad_listen(text, "port must be 0..65535");
  unsigned value = 0;
  for (char c : port_text) {
    if (c < '0' || c > '9') bad_listen(text, fmt::format("port \"{}\" is not a number", escape_text(port_text, 16)));
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535) bad_listen(text, "port must be 0..65535");
  out.port = static_cast<std::uint16_t>(value);
  return out;
}


namespace {

using SteadyClock = std::chrono::steady_clock;
class Session;

// Answers from a route handler may come from another thread (the health
// check completes on the Redis client's loop) and after the server stopped.
// They reach the server's loop only through this gate, which stop() closes
// first: a late answer is then dropped instead of posted to a dead loop.
struct Gate {
  std::mutex mutex;
  net::io_context* ioc = nullptr;  // null once stopped
};

// What a session needs from its server; lives in MetricsServer::Impl.
struct Shared {
  const MetricsServerOptions& opt;
  const http::Router& router;
  std::shared_ptr<Gate> gate;
};

// One HTTP/1.1 connection: reads bytes into the sans-IO parser
// (http_request.hpp), dispatches each whole request, writes the answer.
// Runs on the server's io thread only; alive while its timer or a socket
// operation is pending (their handlers hold the shared_ptr).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const Shared& shared) : socket_(std::move(socket)), timer_(socket_.get_executor()),
                                                      shared_(shared) {}

  void start() {
    become_idle();
    read();
  }

  void close() {
    if (phase_ == Phase::closed) return;
    phase_ = Phase::closed;
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    timer_.cancel();
  }

  // Waiting for the first byte of a request: the eviction candidates.
  bool idle() const noexcept { return phase_ == Phase::idle; }
  SteadyClock::time_point idle_since() const noexcept { return idle_since_; }

 private:
  enum class Phase { idle, reading, handling, writing, closed };

  void become_idle() {
    phase_ = Phase::idle;
    idle_since_ = SteadyClock::now();
    // read_timeout counts from here too, so it caps the idle time.
    arm(std::min(shared_.opt.idle_timeout, shared_.opt.read_timeout));
  }

  // One timer per connection; each phase re-arms it. The generation makes a
  // handler that was already queued when the timer was re-armed a no-op.
  void arm(std::chrono::milliseconds d) {
    ++timer_gen_;
    timer_.expires_after(d);
    timer_.async_wait([self = shared_from_this(), gen = timer_gen_](error_code ec) {
      if (!ec && gen == self->timer_gen_) self->on_timeout();
    });
  }

  void on_timeout() {
    if (phase_ == Phase::handling) {
      // The handler (the health check) did not answer in time.
      ++request_id_;
      write(http::error_response(503, "timed out waiting for the answer"), false, false);
      return;
    }
    close();  // idle, a request that never completed, or a stuck write
  }

  void read() {
    socket_.async_read_some(net::buffer(buf_), [self = shared_from_this()](error_code ec, std::size_t n) {
      self->on_read(ec, n);
    });
  }

  void on_read(error_code ec, std::size_t n) {
    if (phase_ == Phase::closed) return;
    if (ec) {
      close();  // the client closed, reset, or we were evicted/stopped
      return;
    }
    if (phase_ == Phase::idle) {
      // The whole-request deadline counts from the previous response, as
      // before idle_timeout existed: idle time is not a free extension.
      phase_ = Phase::reading;
      const auto since = SteadyClock::now() - idle_since_;
      const auto left = shared_.opt.read_timeout - std::chrono::duration_cast<std::chrono::milliseconds>(since);
      arm(std::max(left, std::chrono::milliseconds(1)));
    }
    process(parser_.feed(std::string_view(buf_.data(), n)));
  }

  void process(http::RequestParser::State st) {
    using State = http::RequestParser::State;
    if (st == State::need_more) {
      read();
      return;
    }
    if (st == State::error) {
      write(http::error_response(parser_.error_status(), parser_.error_reason()), false, false);
      return;
    }
    const http::Request& req = parser_.request();
    const bool keep_alive = req.keep_alive;
    const bool head = req.method == "HEAD";
    phase_ = Phase::handling;
    arm(shared_.opt.handler_timeout);
    const std::uint64_t id = ++request_id_;
    std::weak_ptr<Session> weak = weak_from_this();
    std::shared_ptr<Gate> gate = shared_.gate;
    shared_.router.dispatch(req, [weak, gate, id, keep_alive, head](http::Response res) {
      std::lock_guard lock(gate->mutex);
      if (gate->ioc == nullptr) return;
      net::post(*gate->ioc, [weak, id, keep_alive, head, res = std::move(res)]() mutable {
        auto self = weak.lock();
        if (!self || self->phase_ != Phase::handling || self->request_id_ != id) return;  // timed out meanwhile
        self->write(std::move(res), keep_alive, head);
      });
    });
  }

  void write(http::Response res, bool keep_alive, bool head) {
    out_ = http::serialize(res, keep_alive, head);
    phase_ = Phase::writing;
    arm(shared_.opt.write_timeout);
    net::async_write(socket_, net::buffer(out_),
                     [self = shared_from_this(), keep_alive](error_code ec, std::size_t) {
                       self->on_written(ec, keep_alive);
                     });
  }

  void on_written(error_code ec, bool keep_alive) {
    if (phase_ == Phase::closed) return;
    if (ec || !keep_alive) {
      close();
      return;
    }
    // A pipelined request may already be buffered, whole or in part.
    become_idle();
    const auto st = parser_.next();
    if (st != http::RequestParser::State::need_more || parser_.mid_request()) {
      phase_ = Phase::reading;
      arm(shared_.opt.read_timeout);
    }
    process(st);
  }

  tcp::socket socket_;
  net::steady_timer timer_;
  const Shared& shared_;
  http::RequestParser parser_;
  std::array<char, 4096> buf_{};
  std::string out_;
  Phase phase_ = Phase::idle;
  SteadyClock::time_point idle_since_{};
  std::uint64_t timer_gen_ = 0;
  std::uint64_t request_id_ = 0;
};

http::Response text(int status, std::string body, std::string content_type = "text/plain; charset=utf-8") {
  http::Response r;
  r.status = status;
  r.body = std::move(body);
  r.content_type = std::move(content_type);
  return r;
}

// The routes. One line each to add another: a handler gets the request and
// answers through `respond`, now or later (exactly once), on any thread.
void add_routes(http::Router& router, Registry& registry, const MetricsServerOptions& opt) {
  for (const auto& r : opt.routes) router.add(r);
  router.add("/metrics", [&registry, &opt](const http::Request&, const http::Router::Respond& respond) {
    respond(text(200, to_prometheus(registry) + (opt.extra_metrics ? opt.extra_metrics() : std::string()),
                 std::string(kPrometheusContentType)));
  });
  router.add("/metrics.json", [&registry](const http::Request&, const http::Router::Respond& respond) {
    respond(text(200, to_json(registry).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                 "application/json"));
  });
  router.add("/healthz", [&opt](const http::Request&, const http::Router::Respond& respond) {
    if (!opt.health_check) return respond(text(200, "ok\n"));
    opt.health_check([respond](bool ok, const std::string& detail) {
      respond(ok ? text(200, "ok\n") : text(503, "unavailable: " + escape_text(detail, 512) + "\n"));
    });
  });
}

}  // namespace

struct MetricsServer::Impl {
  Impl(Registry& r, MetricsServerOptions o) : registry(r), opt(std::move(o)) { add_routes(router, registry, opt); }

  // Declared before the io_context: the io_context's destructor destroys
  // pending handlers, which own sessions; everything those touch must still
  // be alive then.
  Registry& registry;
  MetricsServerOptions opt;
  http::Router router;
  std::shared_ptr<Gate> gate = std::make_shared<Gate>();
  Shared shared{opt, router, gate};
  std::vector<std::weak_ptr<Session>> sessions;  // io thread, or owner after join
  net::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  net::steady_timer retry_timer{ioc};
  std::thread thread;
  std::atomic<std::uint16_t> port{0};
  bool loopback = true;
  bool started = false;
  bool stopped = false;

  std::size_t live_sessions() {
    std::erase_if(sessions, [](const std::weak_ptr<Session>& w) { return w.expired(); });
    return sessions.size();
  }

  // At the limit, the connection idle longest makes room: a flood of idle
  // connections (without it, 64 of them lock every scrape out) then only
  // churns itself.
  bool make_room() {
    if (live_sessions() < opt.max_connections) return true;
    std::shared_ptr<Session> victim;
    for (auto& w : sessions) {
      auto s = w.lock();
      if (s && s->idle() && (!victim || s->idle_since() < victim->idle_since())) victim = std::move(s);
    }
    if (!victim) return false;
    victim->close();
    std::erase_if(sessions, [&](const std::weak_ptr<Session>& w) { return w.lock() == victim; });
    return true;
  }

  void accept() {
    acceptor.async_accept([this](error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      if (ec) {
        // EMFILE and friends: back off instead of spinning on the error.
        retry_timer.expires_after(std::chrono::milliseconds(100));
        retry_timer.async_wait([this](error_code tec) {
          if (!tec) accept();
        });
        return;
      }
      if (!make_room()) {
        error_code ignored;
        socket.close(ignored);
      } else {
        auto s = std::make_shared<Session>(std::move(socket), shared);
        sessions.push_back(s);
        s->start();
      }
      accept();
    });
  }
};

MetricsServer::MetricsServer(Registry& registry, MetricsServerOptions options)
    : impl_(std::make_unique<Impl>(registry, std::move(options))) {}

MetricsServer::~MetricsServer() { stop(); }

void MetricsServer::start() {
  Impl& m = *impl_;
  if (m.started) throw Error(errc::invalid_argument, "metrics server: start() called twice");
  if (m.opt.read_timeout <= std::chrono::milliseconds::zero() ||
      m.opt.write_timeout <= std::chrono::milliseconds::zero() ||
      m.opt.idle_timeout <= std::chrono::milliseconds::zero() ||
      m.opt.handler_timeout <= std::chrono::milliseconds::zero())
    throw Error(errc::invalid_argument,
                "metrics server: idle_timeout, read_timeout, write_timeout and handler_timeout must be positive");
  if (m.opt.max_connections == 0) throw Error(errc::invalid_argument, "metrics server: max_connections must be positive");
  const std::string where = fmt::format("{}:{}", m.opt.listen.host, m.opt.listen.port);

  // Resolve with a deadline on our own loop (before its thread starts): a
  // host name must not hang start() on a dead DNS server.
  std::optional<tcp::endpoint> endpoint;
  error_code ec;
  if (auto addr = net::ip::make_address(m.opt.listen.host, ec); !ec) {
    endpoint.emplace(addr, m.opt.listen.port);
  } else {
    tcp::resolver resolver(m.ioc);
    error_code rec = net::error::timed_out;
    resolver.async_resolve(m.opt.listen.host, std::to_string(m.opt.listen.port),
                           tcp::resolver::passive | tcp::resolver::numeric_service,
                           [&](error_code e, tcp::resolver::results_type results) {
                             rec = e;
                             if (!e && !results.empty()) endpoint.emplace(results.begin()->endpoint());
                           });
    m.ioc.run_for(std::chrono::seconds(5));
    resolver.cancel();
    m.ioc.restart();
    m.ioc.poll();
    m.ioc.restart();
    if (!endpoint)
      throw Error(errc::invalid_argument, fmt::format("metrics server: cannot resolve \"{}\": {}", m.opt.listen.host,
                                                      rec ? rec.message() : "no address"));
  }

  auto fail = [&](const char* what) {
    throw Error(errc::invalid_argument, fmt::format("metrics server: cannot {} {}: {}", what, where, ec.message()));
  };
  m.acceptor.open(endpoint->protocol(), ec);
  if (ec) fail("open a socket for");
  m.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (ec) fail("set SO_REUSEADDR on");
  m.acceptor.bind(*endpoint, ec);
  if (ec) fail("bind");
  m.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) fail("listen on");
  m.port = m.acceptor.local_endpoint().port();
  m.loopback = endpoint->address().is_loopback();
  {
    std::lock_guard lock(m.gate->mutex);
    m.gate->ioc = &m.ioc;
  }
  m.started = true;
  m.accept();
  m.thread = std::thread([&m] { m.ioc.run(); });
}

void MetricsServer::stop() {
  Impl& m = *impl_;
  if (!m.started || m.stopped) return;
  m.stopped = true;
  {
    std::lock_guard lock(m.gate->mutex);
    m.gate->ioc = nullptr;
  }
  m.ioc.stop();
  if (m.thread.joinable()) m.thread.join();
  // The io thread is gone: this thread may now touch the acceptor and the
  // sessions. Closing them and polling once runs the aborted handlers, which
  // drop the last references, so no socket outlives stop().
  error_code ec;
  m.acceptor.close(ec);
  m.retry_timer.cancel();
  for (auto& w : m.sessions)
    if (auto s = w.lock()) s->close();
  m.sessions.clear();
  m.ioc.restart();
  m.ioc.poll();
}

std::uint16_t MetricsServer::port() const noexcept { return impl_->port.load(); }

bool MetricsServer::loopback_only() const noexcept { return impl_->loopback; }

std::string MetricsServer::base_url() const {
  const std::string& h = impl_->opt.listen.host;
  return h.find(':') != std::string::npos ? fmt::format("http://[{}]:{}", h, port())
                                          : fmt::format("http://{}:{}", h, port());
}

}  // namespace jobguard::ops
