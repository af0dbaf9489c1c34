#include "support/replicated_redis.hpp"

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <stdexcept>
#include <thread>

#include "support/redis_fixture.hpp"

namespace jobguard::test {

std::string info_field(const std::string& info, const std::string& field) {
  const std::string needle = field + ":";
  auto at = info.find("\n" + needle);
  if (at == std::string::npos) {
    if (info.rfind(needle, 0) != 0) return {};
    at = 0;
  } else {
    at += 1;
  }
  const auto start = at + needle.size();
  const auto end = info.find_first_of("\r\n", start);
  return info.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

ReplicatedRedis::ReplicatedRedis(int replicas, std::vector<std::string> extra_args) : replica_count_(replicas) {
  // The primary would wait 5 s (the default delay) for more replicas before
  // a diskless full sync; tests start them together.
  options_.extra_args = {"--repl-diskless-sync-delay", "0"};
  options_.extra_args.insert(options_.extra_args.end(), extra_args.begin(), extra_args.end());
  make();
}

// The servers are objects from the start (a test may name them before
// start()); tls() makes them again with the certificate.
void ReplicatedRedis::make() {
  primary_ = std::make_unique<EmbeddedRedis>(options_);
  replicas_.clear();
  for (int i = 0; i < replica_count_; ++i) replicas_.push_back(std::make_unique<EmbeddedRedis>(options_));
}

void ReplicatedRedis::tls(const std::string& cert_file, const std::string& key_file, const std::string& ca_file) {
  options_.tls_cert_file = cert_file;
  options_.tls_key_file = key_file;
  options_.tls_ca_file = ca_file;
  options_.extra_args.insert(options_.extra_args.end(), {"--tls-replication", "yes"});
  tls_ = true;
  make();
}

// Members die in reverse order: the replicas first, then the primary; each
// EmbeddedRedis SIGCONTs and SIGKILLs its child, a stopped one too.
ReplicatedRedis::~ReplicatedRedis() = default;

bool ReplicatedRedis::linked(std::size_t i, bool caught_up) {
  try {
    const std::string info = redis_command_at("127.0.0.1", replicas_.at(i)->port(), "INFO replication");
    if (info_field(info, "master_link_status") != "up") return false;
    if (!caught_up) return true;
    const std::string pinfo = redis_command_at("127.0.0.1", primary_->port(), "INFO replication");
    return info_field(info, "slave_repl_offset") == info_field(pinfo, "master_repl_offset");
  } catch (const std::runtime_error&) {
    return false;
  }
}

void ReplicatedRedis::start(std::chrono::milliseconds timeout) {
  primary_->start();
  for (auto& r : replicas_) {
    r->start();
    const std::string reply =
        redis_command_at("127.0.0.1", r->port(),
                         fmt::format("REPLICAOF 127.0.0.1 {}", tls_ ? primary_->tls_port() : primary_->port()));
    if (reply != "OK") throw std::runtime_error(fmt::format("REPLICAOF on 127.0.0.1:{}: {}", r->port(), reply));
  }
  for (std::size_t i = 0; i < replicas_.size(); ++i)
    if (!eventually([&] { return linked(i); }, timeout))
      throw std::runtime_error(fmt::format("replica 127.0.0.1:{} never caught up with the primary 127.0.0.1:{}",
                                           replicas_[i]->port(), primary_->port()));
  if (replicas_.empty()) return;
  // A write and WAIT on one connection: every replica acknowledges, so the
  // tests start with the acknowledgement path working, not only the link.
  const bool acking = eventually(
      [&] {
        timeval tv{2, 0};
        redisContext* c = redisConnectWithTimeout("127.0.0.1", primary_->port(), tv);
        if (c == nullptr || c->err) {
          if (c) redisFree(c);
          return false;
        }
        redisSetTimeout(c, timeval{3, 0});
        auto* w = static_cast<redisReply*>(redisCommand(c, "SET jobguard-test:replicated 1"));
        if (w) freeReplyObject(w);
        auto* r = static_cast<redisReply*>(redisCommand(c, "WAIT %d 1000", static_cast<int>(replicas_.size())));
        const bool all = r && r->type == REDIS_REPLY_INTEGER && r->integer == static_cast<long long>(replicas_.size());
        if (r) freeReplyObject(r);
        auto* d = static_cast<redisReply*>(redisCommand(c, "DEL jobguard-test:replicated"));
        if (d) freeReplyObject(d);
        redisFree(c);
        return all;
      },
      timeout);
  if (!acking)
    throw std::runtime_error(fmt::format("the replicas of 127.0.0.1:{} never acknowledged a write (WAIT)", primary_->port()));
}

}  // namespace jobguard::test
