// `jobguard serve --listen HOST:PORT`: serves this process's lock metrics
// (/metrics, /metrics.json, /healthz) until SIGINT or SIGTERM.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "jobguard/observe/fleet.hpp"
#include "jobguard/observe/metrics.hpp"
#include "jobguard/observe/metrics_server.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::cli {
namespace {

int serve(const Globals& g, const std::string& listen) {
  observe::MetricsServerOptions opt;
  opt.listen = observe::parse_listen_address(listen);  // throws invalid_argument -> exit 64

  // Block the signals before the server thread starts so it inherits the
  // mask: only sigwait() below receives them, never an arbitrary thread.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  // The fleet's numbers (what every jobguard process published to this
  // Redis), read on the exporter's thread so a scrape never waits on Redis.
  auto conn = redis::parse_url(g.redis_url);
  if (conn.client_name.empty()) conn.client_name = "jobguard-serve";
  redis::Client fleet_client(conn);
  observe::FleetExporter fleet(fleet_client);
  opt.extra_metrics = [&fleet] { return fleet.text(); };

  observe::MetricsServer server(observe::Registry::global(), opt);
  server.start();
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

JOBGUARD_COMMAND([](CLI::App& root, Globals& g, std::vector<std::pair<CLI::App*, Action>>& out) {
  auto* sub = root.add_subcommand("serve", "Serve lock metrics for Prometheus until SIGINT/SIGTERM");
  auto listen = std::make_shared<std::string>("127.0.0.1:9464");
  sub->add_option("--listen", *listen, "HOST:PORT to listen on; [IPv6]:PORT; port 0 picks a free one")
      ->capture_default_str();
  sub->footer("Endpoints: GET /metrics (Prometheus text 0.0.4), GET /metrics.json, GET /healthz.");
  out.emplace_back(sub, [&g, listen] { return serve(g, *listen); });
});

}  // namespace
}  // namespace jobguard::cli
