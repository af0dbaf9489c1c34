// The only translation unit that includes Boost.Beast (each one costs 10-25 s
// of compile time); everything else sees metrics_server.hpp.
#include "jobguard/observe/metrics_server.hpp"

#include <fmt/format.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "jobguard/error.hpp"
#include "jobguard/observe/exposition.hpp"
#include "jobguard/observe/json.hpp"

namespace jobguard::observe {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

[[noreturn]] void bad_listen(std::string_view text, std::string_view why) {
  throw Error(errc::invalid_argument, fmt::format("listen address \"{}\": {}", text, why));
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
    if (!valid_ipv6_text(out.host)) bad_listen(text, fmt::format("\"{}\" is not an IPv6 address", out.host));
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
    if (!valid_host_name(out.host)) bad_listen(text, fmt::format("\"{}\" is not a host name or address", out.host));
    port_text = text.substr(colon + 1);
  }
  if (port_text.empty()) bad_listen(text, "port is empty; expected 0..65535");
  if (port_text.size() > 5) bad_listen(text, "port must be 0..65535");
  unsigned value = 0;
  for (char c : port_text) {
    if (c < '0' || c > '9') bad_listen(text, fmt::format("port \"{}\" is not a number", port_text));
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535) bad_listen(text, "port must be 0..65535");
  out.port = static_cast<std::uint16_t>(value);
  return out;
}


namespace {

// One HTTP/1.1 connection. Lives as long as an operation of it is pending
// (handlers hold the shared_ptr). Runs on the server's io thread only.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Registry& registry, const MetricsServerOptions& opt)
      : stream_(std::move(socket)), registry_(registry), opt_(opt) {}

  void start() { read(); }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

 private:
  void read() {
    parser_.emplace();
    // Scrape requests have no body; small limits stop a client from making
    // us buffer megabytes before we answer 405/404.
    parser_->header_limit(8 * 1024);
    parser_->body_limit(4 * 1024);
    // The deadline covers the whole request: a client that connects and
    // sends nothing, or trickles a byte a second, is dropped when it passes.
    stream_.expires_after(opt_.read_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec) {
      // end_of_stream: the client closed between requests; anything else
      // (timeout, malformed request, reset) ends the connection too.
      close();
      return;
    }
    respond(parser_->release());
  }

  void respond(const http::request<http::string_body>& req) {
    res_ = {};
    res_.version(req.version());
    res_.keep_alive(req.keep_alive());
    res_.set(http::field::server, "jobguard");
    res_.set(http::field::cache_control, "no-store");
    std::string_view target(req.target().data(), req.target().size());
    if (auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
    try {
      if (req.method() != http::verb::get) {
        reply(http::status::method_not_allowed, "text/plain; charset=utf-8", "method not allowed; use GET\n");
        res_.set(http::field::allow, "GET");
      } else if (target == "/metrics") {
        reply(http::status::ok, std::string(kPrometheusContentType),
              to_prometheus(registry_) + (opt_.extra_metrics ? opt_.extra_metrics() : std::string()));
      } else if (target == "/metrics.json") {
        reply(http::status::ok, "application/json",
              to_json(registry_).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
      } else if (target == "/healthz") {
        reply(http::status::ok, "text/plain; charset=utf-8", "ok\n");
      } else {
        reply(http::status::not_found, "text/plain; charset=utf-8",
              "not found; try /metrics, /metrics.json or /healthz\n");
      }
    } catch (const std::exception& e) {
      reply(http::status::internal_server_error, "text/plain; charset=utf-8", std::string(e.what()) + "\n");
    }
    res_.prepare_payload();
    stream_.expires_after(opt_.write_timeout);
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code wec, std::size_t) {
      if (wec || !self->res_.keep_alive()) {
        self->close();
        return;
      }
      self->read();
    });
  }

  void reply(http::status status, const std::string& content_type, std::string body) {
    res_.result(status);
    res_.set(http::field::content_type, content_type);
    res_.body() = std::move(body);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> res_;
  Registry& registry_;
  const MetricsServerOptions& opt_;
};

}  // namespace

struct MetricsServer::Impl {
  Impl(Registry& r, MetricsServerOptions o) : registry(r), opt(std::move(o)) {}

  // Declared before the io_context: the io_context's destructor destroys
  // pending handlers, which own sessions; everything those touch must still
  // be alive then.
  Registry& registry;
  MetricsServerOptions opt;
  std::vector<std::weak_ptr<Session>> sessions;  // io thread, or owner after join
  net::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  net::steady_timer retry_timer{ioc};
  std::thread thread;
  std::atomic<std::uint16_t> port{0};
  bool started = false;
  bool stopped = false;

  std::size_t live_sessions() {
    std::erase_if(sessions, [](const std::weak_ptr<Session>& w) { return w.expired(); });
    return sessions.size();
  }

  void accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      if (ec) {
        // EMFILE and friends: back off instead of spinning on the error.
        retry_timer.expires_after(std::chrono::milliseconds(100));
        retry_timer.async_wait([this](beast::error_code tec) {
          if (!tec) accept();
        });
        return;
      }
      if (live_sessions() >= opt.max_connections) {
        beast::error_code ignored;
        socket.close(ignored);
      } else {
        auto s = std::make_shared<Session>(std::move(socket), registry, opt);
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
      m.opt.write_timeout <= std::chrono::milliseconds::zero())
    throw Error(errc::invalid_argument, "metrics server: read_timeout and write_timeout must be positive");
  const std::string where = fmt::format("{}:{}", m.opt.listen.host, m.opt.listen.port);

  // Resolve with a deadline on our own loop (before its thread starts): a
  // host name must not hang start() on a dead DNS server.
  std::optional<tcp::endpoint> endpoint;
  beast::error_code ec;
  if (auto addr = net::ip::make_address(m.opt.listen.host, ec); !ec) {
    endpoint.emplace(addr, m.opt.listen.port);
  } else {
    tcp::resolver resolver(m.ioc);
    beast::error_code rec = net::error::timed_out;
    resolver.async_resolve(m.opt.listen.host, std::to_string(m.opt.listen.port),
                           tcp::resolver::passive | tcp::resolver::numeric_service,
                           [&](beast::error_code e, tcp::resolver::results_type results) {
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
  m.started = true;
  m.accept();
  m.thread = std::thread([&m] { m.ioc.run(); });
}

void MetricsServer::stop() {
  Impl& m = *impl_;
  if (!m.started || m.stopped) return;
  m.stopped = true;
  m.ioc.stop();
  if (m.thread.joinable()) m.thread.join();
  // The io thread is gone: this thread may now touch the acceptor and the
  // sessions. Closing them and polling once runs the aborted handlers, which
  // drop the last references, so no socket outlives stop().
  beast::error_code ec;
  m.acceptor.close(ec);
  m.retry_timer.cancel();
  for (auto& w : m.sessions)
    if (auto s = w.lock()) s->close();
  m.sessions.clear();
  m.ioc.restart();
  m.ioc.poll();
}

std::uint16_t MetricsServer::port() const noexcept { return impl_->port.load(); }

std::string MetricsServer::base_url() const {
  const std::string& h = impl_->opt.listen.host;
  return h.find(':') != std::string::npos ? fmt::format("http://[{}]:{}", h, port())
                                          : fmt::format("http://{}:{}", h, port());
}

}  // namespace jobguard::observe
