// `jobguard serve --listen HOST:PORT`: serves this process's lock metrics
// (/metrics, /metrics.json, /healthz: Redis answers PING) until SIGINT or
// SIGTERM.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/observe/metrics_server.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/command.hpp"
#include "jobguard/redis/options.hpp"
#include "jobguard/observe/fleet.hpp"

namespace jobguard::cli {
namespace {

// /healthz answers 200 only while Redis answers PING within `deadline`: a
// load balancer or orchestrator then sees the dependency the workers need.
std::function<void(std::function<void(bool, std::string)>)> redis_health_check(
    std::shared_ptr<redis::Client> client, std::chrono::milliseconds deadline, std::string where) {
  return [client = std::move(client), deadline, where = std::move(where)](std::function<void(bool, std::string)> done) {
    client->async_exec(
        redis::Command{"PING"},
        [done = std::move(done), where](std::error_code ec, const redis::Reply& reply) {
          if (ec) done(false, fmt::format("Redis at {}: {}", where, reply.str));
          else done(true, {});
        },
        redis::CallOptions{deadline});
  };
}

int serve(const Globals& g, const std::string& listen, const std::string& health_timeout) {
  observe::MetricsServerOptions opt;
  opt.listen = observe::parse_listen_address(listen);  // throws invalid_argument -> exit 64
  // Block the signals before the Redis client's and the server's threads
  // start so they inherit the mask: only sigwait() below receives them,
  // never an arbitrary thread.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  const auto deadline = parse_duration_ms(health_timeout, "--health-timeout");
  if (deadline <= std::chrono::milliseconds::zero())
    throw Error(errc::invalid_argument, "--health-timeout must be positive");
  // The server waits a little longer than the PING's own deadline, so the
  // answer names Redis rather than a generic timeout.
  opt.handler_timeout = deadline + std::chrono::milliseconds(500);
  auto conn = redis::parse_url(g.redis_url);  // throws invalid_url -> exit 64
  if (conn.client_name.empty()) conn.client_name = "jobguard-serve";
  auto client = std::make_shared<redis::Client>(conn);  // connects in the background
  opt.health_check = redis_health_check(client, deadline, redis::to_display_url(conn));

  // The fleet's numbers (what every jobguard process published to this
  // Redis), read on the exporter's thread so a scrape never waits on Redis.
  observe::FleetExporter fleet(*client);
  opt.extra_metrics = [&fleet] { return fleet.text(); };

  observe::MetricsServer server(observe::Registry::global(), opt);
  server.start();
  if (!server.loopback_only())
    std::fputs(fmt::format("jobguard serve: warning: {} is reachable from other hosts and its endpoints have no "
                           "authentication; listen on 127.0.0.1 unless a firewall or proxy guards it\n",
                           server.base_url())
                   .c_str(),
               stderr);
  if (g.json) {
    std::fputs((nlohmann::json{{"listening", server.base_url()}, {"port", server.port()}}.dump() + "\n").c_str(),
               stdout);
  } else {
    std::fputs(fmt::format("jobguard serve: listening on {} (GET /metrics, /metrics.json, /healthz)\n",
                           server.base_url())
                   .c_str(),
               stdout);
  }
  std::fflush(stdout);

  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  server.stop();
  return exit_code::ok;
}

void add(CLI::App& root, Globals& g, Commands& out) {
  auto* sub = root.add_subcommand("serve", "Serve lock metrics for Prometheus until SIGINT/SIGTERM");
  auto listen = std::make_shared<std::string>("127.0.0.1:9464");
  sub->add_option("--listen", *listen, "HOST:PORT to listen on; [IPv6]:PORT; port 0 picks a free one")
      ->capture_default_str();
  auto health_timeout = std::make_shared<std::string>("1s");
  sub->add_option("--health-timeout", *health_timeout, "Deadline of the Redis PING behind /healthz")
      ->check(duration_validator())
      ->capture_default_str();
  sub->footer(
      "Endpoints: GET /metrics (Prometheus text 0.0.4), GET /metrics.json, GET /healthz (200 \"ok\" while Redis "
      "answers PING, else 503 with the reason).");
  out.emplace_back(sub, [&g, listen, health_timeout] { return serve(g, *listen, *health_timeout); });
}

}  // namespace

void add_serve(CLI::App& root, Globals& g, Commands& out) { add(root, g, out); }
}  // namespace jobguard::cli
