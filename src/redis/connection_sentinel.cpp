// Finding the primary through Sentinel: the question asked on every
// (re)connect, the periodic check while ready, and the list of sentinels
// learned from the answers.
#include <fmt/format.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <charconv>

#include "redis/connection.hpp"

namespace jobguard::redis::detail {

// While ready behind Sentinel: ask every sentinel_check whether the
// primary moved. A forced or automatic failover leaves the old primary
// accepting writes until the sentinels demote it (seconds later), so the
// connection cannot wait for the server to close it.
void Connection::arm_sentinel_check() {
  if (sentinels_.empty() || opts_.sentinel.check_interval.count() <= 0) return;
  const auto gen = generation_;
  sentinel_timer_.expires_after(opts_.sentinel.check_interval);
  sentinel_timer_.async_wait([self = shared_from_this(), gen](boost::system::error_code ec) {
    if (ec || gen != self->generation_ || self->state_ != State::ready) return;
    self->ask_sentinel(0, {}, [self, gen](const std::optional<SentinelOptions::Address>& a, const std::string&) {
      if (gen != self->generation_ || self->state_ != State::ready) return;
      // No answer says nothing about the primary: keep it, ask again later.
      if (a && (a->host != self->target_host_ || a->port != self->target_port_)) {
        const std::string why = fmt::format("the sentinels name {}:{} as the primary of '{}' now, not {}; "
                                            "reconnecting there",
                                            a->host, a->port, self->opts_.sentinel.master_name, self->where_);
        self->warn(why);
        return self->on_broken(make_error_code(errc::connection_lost), why);
      }
      self->arm_sentinel_check();
    });
  });
}

// A one-shot connection to one sentinel, closed with us.
std::shared_ptr<Connection> Connection::sentinel_probe(const SentinelOptions::Address& addr) {
  ConnectionOptions so;
  so.host = addr.host;
  so.port = addr.port;
  so.password = opts_.sentinel.password;
  so.connect_timeout = opts_.connect_timeout;
  so.command_timeout = opts_.connect_timeout;
  so.keepalive = false;
  so.recycle_after_timeouts = 0;
  so.on_warning = opts_.on_warning;
  // The client made ssl_ for either side that wants TLS (make_tls_context
  // holds the CA, client certificate and verify mode, not a host name).
  if (opts_.sentinel.tls) {
    so.tls = opts_.tls;
    so.tls.enabled = true;
  }
  auto probe =
      std::make_shared<Connection>(ctx_, so, opts_.sentinel.tls ? ssl_ : nullptr, std::make_shared<SharedStats>());
  probe->set_probe();
  probe->start();
  std::erase_if(probes_, [](const std::weak_ptr<Connection>& w) { return w.expired(); });
  probes_.push_back(probe);
  return probe;
}

void Connection::ask_sentinel(std::size_t i, std::string errors, Found found_cb) {
  if (state_ == State::closed) return;
  const std::string& name = opts_.sentinel.master_name;
  if (i >= sentinels_.size())
    return found_cb(std::nullopt, fmt::format("no sentinel named the primary of '{}' ({})", name, errors));
  const SentinelOptions::Address addr = sentinels_[i];
  auto probe = sentinel_probe(addr);
  auto self = shared_from_this();
  auto found = std::make_shared<std::optional<SentinelOptions::Address>>();
  auto drop = [this, probe] { asio::post(ctx_, [probe] { probe->close(); }); };
  const auto deadline = Clock::now() + opts_.connect_timeout;
  Multiplexer::Request master;
  master.payload = Command{"SENTINEL", "get-master-addr-by-name", name}.payload();
  master.deadline = deadline;
  master.done = [self, i, addr, errors, found, drop, name, found_cb](const Error& err, const Reply& r) {
    if (!err && r.is_array() && r.elements.size() == 2 && r.elements[1].is_string()) {
      unsigned port = 0;
      const auto& ps = r.elements[1].str;
      const auto [end, perr] = std::from_chars(ps.data(), ps.data() + ps.size(), port);
      if (perr == std::errc() && end == ps.data() + ps.size() && port > 0 && port < 65536) {
        *found = SentinelOptions::Address{r.elements[0].str, static_cast<std::uint16_t>(port)};
        return;  // connected when the list of sentinels is in
      }
    }
    drop();
    const std::string why = err ? r.str
                            : (r.is_nil() || (r.is_array() && r.elements.empty()))
                                ? fmt::format("does not monitor a master named '{}'", name)
                                : "unexpected reply " + to_debug_string(r);
    self->ask_sentinel(i + 1, errors + (errors.empty() ? "" : "; ") + fmt::format("{}:{}: {}", addr.host, addr.port, why),
                       found_cb);
  };
  Multiplexer::Request others;
  others.payload = Command{"SENTINEL", "sentinels", name}.payload();
  others.deadline = deadline;
  others.done = [self, i, found, drop, found_cb](const Error& err, const Reply& r) {
    if (!found->has_value()) return;  // the first question failed; the next sentinel is being asked
    drop();
    if (!err && r.is_array()) self->learn_sentinels(r);
    if (i != 0 && i < self->sentinels_.size()) std::swap(self->sentinels_[0], self->sentinels_[i]);
    found_cb(*found, {});
  };
  probe->submit(std::move(master));
  probe->submit(std::move(others));
}

// `SENTINEL sentinels NAME`: one flat field/value array per other sentinel.
void Connection::learn_sentinels(const Reply& r) {
  for (const auto& e : r.elements) {
    if (!e.is_array()) continue;
    std::string ip;
    unsigned port = 0;
    for (std::size_t k = 0; k + 1 < e.elements.size(); k += 2) {
      const auto& f = e.elements[k].str;
      const auto& v = e.elements[k + 1].str;
      if (f == "ip") ip = v;
      else if (f == "port") std::from_chars(v.data(), v.data() + v.size(), port);
    }
    if (ip.empty() || port == 0 || port > 65535) continue;
    SentinelOptions::Address a{ip, static_cast<std::uint16_t>(port)};
    // A bounded list: a misbehaving sentinel cannot make us keep thousands.
    if (std::find(sentinels_.begin(), sentinels_.end(), a) == sentinels_.end() && sentinels_.size() < 64)
      sentinels_.push_back(std::move(a));
  }
}

}  // namespace jobguard::redis::detail
