// The client on a Redis Cluster (ConnectionOptions::cluster): a connection
// per node, each call routed to its key's primary, redirects followed, the
// slot map kept from CLUSTER SHARDS (SLOTS before 7.0), and the primaries a
// per-node command must visit.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <charconv>
#include <future>

#include "redis/client_impl.hpp"

namespace asio = boost::asio;

namespace jobguard::redis {

using detail::Clock;

Client::Impl::Connection& Client::Impl::node(const std::string& host, std::uint16_t port) {
  const std::string where = fmt::format("{}:{}", host, port);
  auto it = nodes.find(where);
  if (it != nodes.end()) return *it->second;
  ConnectionOptions no = opts;
  no.host = host;
  no.port = port;
  auto c = std::make_shared<Connection>(*ctx, no, ssl, stats);
  nodes.emplace(where, c);
  if (!closed.load()) c->start();
  return *c;
}

void Client::Impl::submit_to_node(Request r, std::string_view where) {
  const auto colon = where.rfind(':');
  std::uint16_t port = 0;
  const char* end = where.data() + where.size();
  if (colon == std::string_view::npos || colon == 0 || std::from_chars(where.data() + colon + 1, end, port).ptr != end ||
      port == 0)
    return refuse(r.done, make_error_code(errc::invalid_argument),
                  fmt::format("CallOptions::node \"{}\" is not host:port", where));
  // Copied: the view is the caller's, valid during the call only.
  auto to_node = [host = std::string(where.substr(0, colon)), port](Impl& self, Request& req) {
    self.node(host, port).submit(std::move(req));
  };
  if (on_loop()) return to_node(*this, r);
  asio::post(*ctx, [keep = shared_from_this(), r = std::move(r), to_node]() mutable {
    if (keep->closed.load()) return keep->refuse_shutdown(r.done);
    to_node(*keep, r);
  });
}

Client::Impl::Connection& Client::Impl::pick_for(std::string_view payload) {
  if (!opts.cluster) return pick();
  const auto key = detail::routing_key(payload);
  if (!key) return pick();
  Connection* c = slot_owner[detail::key_slot(*key)];
  return c ? *c : pick();
}

void Client::Impl::refresh_slots() {
  if (refreshing || closed.load()) return;
  refreshing = true;
  Request r;
  r.payload = Command(slot_source.command()).payload();
  r.deadline = Clock::now() + opts.command_timeout;
  r.done = [self = shared_from_this()](const Error& err, const Reply& reply) {
    self->refreshing = false;
    if (self->closed.load()) return;
    const auto map = self->slot_source.parse(err.code(), reply, self->opts.host, self->opts.tls.enabled);
    // A server before 7.0: the same again with CLUSTER SLOTS. A failed
    // call is not retried here: the next MOVED asks again.
    if (map.empty() && self->slot_source.retry_with_slots()) return self->refresh_slots();
    for (const auto& range : map) {
      Connection* c = &self->node(range.host, range.port);
      for (unsigned s = range.first; s <= range.last; ++s) self->slot_owner[s] = c;
    }
  };
  pick().submit(std::move(r));
}

namespace {
// The primaries of a slot map, each with its ranges, sorted by address.
std::vector<PrimaryShard> primaries_of(const std::vector<detail::SlotRange>& map) {
  std::vector<PrimaryShard> out;
  for (const auto& range : map) {
    const std::string at = fmt::format("{}:{}", range.host, range.port);
    auto it = std::find_if(out.begin(), out.end(), [&](const PrimaryShard& p) { return p.address == at; });
    if (it == out.end()) it = out.insert(out.end(), PrimaryShard{at, {}});
    it->slots.emplace_back(range.first, range.last);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
  return out;
}
}  // namespace

void Client::Impl::ask_primaries(std::shared_ptr<detail::SlotMapSource> source, Client::PrimariesCompletion done) {
  if (!opts.cluster) {
    std::vector<PrimaryShard> one{PrimaryShard{current_address(), {{0, detail::kClusterSlots - 1}}}};
    return done(Error(), std::move(one));
  }
  if (closed.load()) return done(Error(errc::shutdown, "client is shutting down", error_source::redis), {});
  Request r;
  r.payload = Command(source->command()).payload();
  r.deadline = Clock::now() + opts.command_timeout;
  r.done = [self = shared_from_this(), source, done = std::move(done)](const Error& err, const Reply& reply) mutable {
    const auto map = source->parse(err.code(), reply, self->opts.host, self->opts.tls.enabled);
    if (map.empty() && source->retry_with_slots()) return self->ask_primaries(source, std::move(done));
    if (!map.empty()) return done(Error(), primaries_of(map));
    const std::string what = fmt::format("{} on {}", fmt::join(source->command(), " "), self->current_address());
    if (err)
      return done(Error(err.code(), fmt::format("{}: {}", what, reply.is_error() ? reply.str : err.code().message()),
                        error_source::redis),
                  {});
    done(Error(errc::protocol_error, fmt::format("{}: no slot map in the reply {}", what, to_debug_string(reply)),
               error_source::redis),
         {});
  };
  pick().submit(std::move(r));
}

void Client::Impl::route(Request r, int hops, Connection* to) {
  if (!opts.cluster) return pick().submit(std::move(r));
  Connection& c = to ? *to : pick_for(r.payload);
  auto payload = std::make_shared<const std::string>(r.payload);
  r.done = [self = shared_from_this(), payload, deadline = r.deadline, done = std::move(r.done), hops](
               const Error& err, Reply reply) mutable {
    if (err && reply.is_error() && hops < kMaxRedirects && !self->closed.load() &&
        self->reroute(payload, deadline, done, hops, reply))
      return;
    done(err, std::move(reply));
  };
  c.submit(std::move(r));
}

bool Client::Impl::reroute(const std::shared_ptr<const std::string>& payload, Clock::time_point deadline,
                           Completion& done, int hops, const Reply& reply) {
  // Built only when resent: `done` stays the caller's until then.
  auto resend = [&] {
    Request again;
    again.payload = *payload;
    again.deadline = deadline;
    again.done = std::move(done);
    return again;
  };
  if (auto rd = detail::parse_redirect(reply.str)) {
    auto again = resend();
    Connection& target = node(rd->host, rd->port);
    if (rd->kind == detail::Redirect::Kind::moved) {
      slot_owner[rd->slot] = &target;
      refresh_slots();
      route(std::move(again), hops + 1, &target);
      return true;
    }
    // ASK: this one command, on the importing node, after ASKING.
    Request asking;
    asking.payload = Command{"ASKING"}.payload();
    asking.deadline = deadline;
    asking.done = [](const Error&, const Reply&) {};
    target.submit(std::move(asking));
    route(std::move(again), hops + 1, &target);
    return true;
  }
  const auto prefix = reply.error_prefix();
  if (prefix != "TRYAGAIN" && prefix != "CLUSTERDOWN") return false;
  const auto backoff = std::chrono::milliseconds(10 << std::min(hops, 4));
  if (Clock::now() + backoff >= deadline) return false;
  auto timer = std::make_shared<asio::steady_timer>(*ctx, backoff);
  timer->async_wait([self = shared_from_this(), timer, again = resend(), hops](boost::system::error_code tec) mutable {
    if (tec || self->closed.load()) return self->refuse_shutdown(again.done);
    self->route(std::move(again), hops + 1);
  });
  return true;
}

void Client::async_primaries(PrimariesCompletion done) {
  asio::post(*impl_->ctx, [impl = impl_, done = std::move(done)]() mutable {
    impl->ask_primaries(std::make_shared<detail::SlotMapSource>(), std::move(done));
  });
}

void Client::async_primaries(PrimariesTextCompletion done) {
  async_primaries([done = std::move(done)](const Error& err, std::vector<PrimaryShard> shards) {
    done(err.code(), std::string(err.detail()), std::move(shards));
  });
}

std::vector<std::string> Client::primaries() {
  if (!impl_->opts.cluster) return {address()};
  if (impl_->on_loop())
    throw Error(errc::invalid_argument, "blocking Client::primaries called on the event-loop thread (would deadlock)");
  std::promise<std::vector<PrimaryShard>> p;
  auto f = p.get_future();
  async_primaries([&p](const Error& err, std::vector<PrimaryShard> s) {
    if (err) p.set_exception(std::make_exception_ptr(err));
    else p.set_value(std::move(s));
  });
  std::vector<std::string> out;
  for (auto& shard : f.get()) out.push_back(std::move(shard.address));
  return out;
}

}  // namespace jobguard::redis
