#include "support/cluster_redis.hpp"

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <optional>
#include <stdexcept>

#include "support/redis_fixture.hpp"
#include "support/subprocess.hpp"

namespace jobguard::test {

namespace {
// CLUSTER SLOTS on `port`, as (first, last, primary port, replica ports).
struct Range {
  long long first, last;
  std::uint16_t primary;
  std::vector<std::uint16_t> replicas;
};
std::vector<Range> slots(std::uint16_t port) {
  std::vector<Range> out;
  timeval tv{2, 0};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (c == nullptr || c->err) {
    if (c) redisFree(c);
    throw std::runtime_error("cannot reach a cluster node");
  }
  redisSetTimeout(c, tv);
  auto* r = static_cast<redisReply*>(redisCommand(c, "CLUSTER SLOTS"));
  if (r != nullptr && r->type == REDIS_REPLY_ARRAY) {
    for (std::size_t i = 0; i < r->elements; ++i) {
      const redisReply* e = r->element[i];
      Range g{e->element[0]->integer, e->element[1]->integer,
              static_cast<std::uint16_t>(e->element[2]->element[1]->integer), {}};
      for (std::size_t k = 3; k < e->elements; ++k)
        g.replicas.push_back(static_cast<std::uint16_t>(e->element[k]->element[1]->integer));
      out.push_back(std::move(g));
    }
  }
  if (r) freeReplyObject(r);
  redisFree(c);
  return out;
}
}  // namespace

namespace {
std::unique_ptr<EmbeddedRedis> make_node(std::vector<std::string> env) {
  EmbeddedRedisOptions o;
  o.env = std::move(env);
  // The bus defaults to port + 10000, which for an ephemeral port may be
  // out of range or taken: a free one of its own. node-timeout 1 s keeps a
  // failover quick.
  o.extra_args = {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout",
                  "1000", "--cluster-port", std::to_string(pick_free_port()), "--repl-diskless-sync-delay", "0"};
  return std::make_unique<EmbeddedRedis>(o);
}
}  // namespace

ClusterRedis::ClusterRedis(int primaries, int replicas_each, std::vector<std::vector<std::string>> env)
    : primaries_(primaries), replicas_each_(replicas_each), env_(std::move(env)) {
  for (int i = 0; i < primaries * (1 + replicas_each); ++i) nodes_.push_back(make_node(env_for(i)));
}

std::vector<std::string> ClusterRedis::env_for(std::size_t i) const { return i < env_.size() ? env_[i] : std::vector<std::string>{}; }

ClusterRedis::~ClusterRedis() = default;

std::string ClusterRedis::on(std::uint16_t port, const std::string& command) {
  return redis_command_at("127.0.0.1", port, command);
}

void ClusterRedis::start(std::chrono::milliseconds timeout) {
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    auto& n = nodes_[i];
    // A bus port found free when the node was made may be taken by now (a
    // test running beside us): EmbeddedRedis retries its own port, not the
    // bus's, so a node that will not start is made again with another.
    for (int attempt = 0;; ++attempt) {
      try {
        n->start();
        break;
      } catch (const std::exception&) {
        if (attempt == 4) throw;
        n = make_node(env_for(i));
      }
    }
  }
  std::vector<std::string> args = {"redis-cli", "--cluster", "create"};
  for (auto& n : nodes_) args.push_back(fmt::format("127.0.0.1:{}", n->port()));
  args.insert(args.end(), {"--cluster-replicas", std::to_string(replicas_each_), "--cluster-yes"});
  Subprocess create(args);
  const auto r = create.wait_or_kill(timeout);
  if (r.status != 0) throw std::runtime_error("redis-cli --cluster create failed: " + r.out + r.err);
  for (auto& n : nodes_) {
    const bool ok = eventually(
        [&] {
          try {
            return on(n->port(), "CLUSTER INFO").find("cluster_state:ok") != std::string::npos;
          } catch (const std::exception&) {
            return false;
          }
        },
        timeout);
    if (!ok) throw std::runtime_error(fmt::format("cluster node 127.0.0.1:{} never reached cluster_state:ok", n->port()));
  }
}

void ClusterRedis::wait_replicated(std::chrono::milliseconds timeout) {
  // Replicas join after the slots are assigned (seconds later): every shard
  // must list its replicas before a CLUSTER FAILOVER can be asked of one.
  const bool replicated = eventually(
      [&] {
        try {
          const auto gs = slots(nodes_.front()->port());
          if (gs.empty()) return false;
          for (const auto& g : gs)
            if (static_cast<int>(g.replicas.size()) < replicas_each_) return false;
          return true;
        } catch (const std::exception&) {
          return false;
        }
      },
      timeout);
  if (!replicated) throw std::runtime_error("the cluster's replicas never showed in CLUSTER SLOTS");
}

std::string ClusterRedis::url(const std::string& query) const {
  return fmt::format("redis://127.0.0.1:{}/0?cluster=yes{}{}", nodes_.front()->port(), query.empty() ? "" : "&", query);
}


std::uint16_t ClusterRedis::primary_of(std::uint16_t slot) {
  // Mid-failover the node asked may list no primary for a slot for a moment
  // (the old one failed, the new one not yet announced): asked again for a
  // while, not thrown at once into a caller's own wait (a CI run failed so).
  std::optional<std::uint16_t> found;
  eventually(
      [&] {
        try {
          for (const auto& g : slots(nodes_.front()->port()))
            if (slot >= g.first && slot <= g.last) {
              found = g.primary;
              return true;
            }
        } catch (const std::exception&) {
        }
        return false;
      },
      std::chrono::seconds(5));
  if (found) return *found;
  throw std::runtime_error(fmt::format("no node serves slot {}", slot));
}

std::uint16_t ClusterRedis::replica_of(std::uint16_t primary_port) {
  for (const auto& g : slots(nodes_.front()->port()))
    if (g.primary == primary_port && !g.replicas.empty()) return g.replicas.front();
  throw std::runtime_error(fmt::format("no replica of 127.0.0.1:{}", primary_port));
}

}  // namespace jobguard::test
