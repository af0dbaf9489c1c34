// `jobguard serve --listen HOST:PORT`: serves this process's lock metrics
// (/metrics, /metrics.json, /healthz: Redis answers PING) and the dashboard
// (/, /api/...: ops/dashboard.hpp) until SIGINT or SIGTERM.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "cli.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/ops/metrics_server.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/redis/command.hpp"
#include "jobguard/redis/options.hpp"
#include "jobguard/ops/fleet_exporter.hpp"
#include "jobguard/job/catalog.hpp"
#include "jobguard/ops/dashboard.hpp"
#include "jobguard/ops/doctor.hpp"

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

struct ServeArgs {
  std::string listen = "127.0.0.1:9464";
  std::string health_timeout = "1s";
  std::string redis_check_interval = "15s";
  std::string admin_token_file, catalog, group = "jobguard", key_prefix = "jobguard";
  std::vector<std::string> streams;
};

// The admin token comes from a file or the environment, never from argv,
// which every local user can read in ps.
std::string admin_token(const ServeArgs& a) {
  std::string token;
  if (!a.admin_token_file.empty()) {
    std::ifstream in(a.admin_token_file);
    if (!in) throw Error(errc::invalid_argument, fmt::format("--admin-token-file {}: cannot read it", a.admin_token_file));
    std::ostringstream ss;
    ss << in.rdbuf();
    token = ss.str();
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
    if (token.empty()) throw Error(errc::invalid_argument, fmt::format("--admin-token-file {} is empty", a.admin_token_file));
  } else if (const char* env = std::getenv("JOBGUARD_ADMIN_TOKEN"); env && *env) {
    token = env;
  }
  if (!token.empty() && token.size() < 16)
    throw Error(errc::invalid_argument, "the admin token must be at least 16 bytes (e.g. openssl rand -hex 24)");
  return token;
}

int serve(const Globals& g, const ServeArgs& a) {
  const std::string& listen = a.listen;
  const std::string& health_timeout = a.health_timeout;
  ops::MetricsServerOptions opt;
  opt.listen = ops::parse_listen_address(listen);  // throws invalid_argument -> exit 64
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
  const auto check_every = parse_duration_ms(a.redis_check_interval, "--redis-check-interval");
  if (check_every <= std::chrono::milliseconds::zero())
    throw Error(errc::invalid_argument, "--redis-check-interval must be positive");
  ops::DashboardOptions dopt;
  dopt.prefix = a.key_prefix;
  dopt.admin_token = admin_token(a);
  dopt.streams = a.streams;
  dopt.group = a.group;
  if (!a.catalog.empty()) dopt.catalog = std::make_shared<const job::Catalog>(job::Catalog::load(a.catalog));
  // The server waits longer than the PING's own deadline, so the answer
  // names Redis rather than a generic timeout; and long enough for a
  // dashboard listing of tens of thousands of locks on a loaded host.
  opt.handler_timeout = std::max(deadline + std::chrono::milliseconds(500), std::chrono::milliseconds(10000));
  auto conn = redis::parse_url(g.redis_url);  // throws invalid_url -> exit 64
  if (conn.client_name.empty()) conn.client_name = "jobguard-serve";
  auto client = std::make_shared<redis::Client>(conn);  // connects in the background
  opt.health_check = redis_health_check(client, deadline, redis::to_display_url(conn));

  // The fleet's numbers (what every jobguard process published to this
  // Redis), read on the exporter's thread so a scrape never waits on Redis.
  ops::FleetExporter fleet(*client);
  // The lock Redis's deployment (eviction, persistence, replicas, lost lock
  // state), watched with the doctor's read-only checks on its own thread.
  ops::RedisWatcherOptions wopt;
  wopt.refresh = check_every;
  wopt.doctor.key_prefix = a.key_prefix;
  ops::RedisWatcher watcher(*client, wopt);
  const std::string catalog_text = dopt.catalog ? job::catalog_to_prometheus(*dopt.catalog) : std::string();
  opt.extra_metrics = [&fleet, &watcher, &catalog_text] { return fleet.text() + watcher.text() + catalog_text; };

  // Before the server, so its handlers never outlive it.
  ops::Dashboard dashboard(*client, dopt);
  opt.routes = dashboard.routes();
  ops::MetricsServer server(observe::Registry::global(), opt);
  server.start();
  if (!server.loopback_only())
    std::fputs(fmt::format("jobguard serve: warning: {} is reachable from other hosts and its read endpoints have no "
                           "authentication; listen on 127.0.0.1 unless a firewall or proxy guards it\n",
                           server.base_url())
                   .c_str(),
               stderr);
  if (g.json) {
    const nlohmann::json ready{{"listening", server.base_url()}, {"port", server.port()},
                               {"dashboard", server.base_url() + "/"}, {"actions", dashboard.actions_enabled()}};
    std::fputs((ready.dump() + "\n").c_str(), stdout);
  } else {
    std::fputs(fmt::format("jobguard serve: listening on {} (GET /metrics, /metrics.json, /healthz; dashboard {}/, {})\n",
                           server.base_url(), server.base_url(),
                           dashboard.actions_enabled() ? "actions enabled" : "read-only")
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

}  // namespace

void add_serve(CLI::App& root, Globals& g, Commands& out) {
  auto* sub = root.add_subcommand("serve", "Serve lock metrics and the live dashboard until SIGINT/SIGTERM");
  auto a = std::make_shared<ServeArgs>();
  sub->add_option("--listen", a->listen, "HOST:PORT to listen on; [IPv6]:PORT; port 0 picks a free one")
      ->capture_default_str();
  sub->add_option("--health-timeout", a->health_timeout, "Deadline of the Redis PING behind /healthz")
      ->check(duration_validator())
      ->capture_default_str();
  sub->add_option("--redis-check-interval", a->redis_check_interval,
                  "How often the lock Redis's deployment is checked (jobguard_redis_* gauges: eviction, persistence, "
                  "replicas, lost lock state)")
      ->check(duration_validator())
      ->capture_default_str();
  sub->add_option("--admin-token-file", a->admin_token_file,
                  "Enable the dashboard's actions (force release, dead-letter retry) for requests carrying the token in "
                  "FILE (else $JOBGUARD_ADMIN_TOKEN; neither: read-only)");
  sub->add_option("--catalog", a->catalog,
                  "Lock catalog YAML: each lock's class and declared TTL on the dashboard, and as "
                  "jobguard_lock_class_ttl_seconds / _max_hold_seconds gauges");
  sub->add_option("--stream", a->streams, "A job stream the dashboard shows (repeatable)");
  sub->add_option("--group", a->group, "Consumer group of the streams")->capture_default_str();
  add_key_prefix(*sub, a->key_prefix, "Key prefix of the locks");
  sub->footer(exit_status_help(
      "Endpoints: GET /metrics (Prometheus text 0.0.4), GET /metrics.json, GET /healthz (200 \"ok\" while Redis "
      "answers PING, else 503 with the reason), GET / (the dashboard) and the JSON API under /api "
      "(docs/dashboard.md). Actions are POSTs with Authorization: Bearer TOKEN and a reason; without a token "
      "configured they answer 403.\n"
      "Exit status: 0 stopped by SIGINT/SIGTERM."));
  out.emplace_back(sub, [&g, a] { return serve(g, *a); });
}

}  // namespace jobguard::cli
