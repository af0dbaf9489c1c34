// The dashboard in process, behind a real MetricsServer: many clients at
// once (the server thread queues, the worker answers from its own thread),
// then shutdown with requests possibly in flight. Also under ThreadSanitizer.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "http_client.hpp"
#include "jobguard/lock.hpp"
#include "jobguard/ops/dashboard.hpp"
#include "jobguard/ops/metrics_server.hpp"
#include "support/redis_fixture.hpp"

namespace jobguard::test {
namespace {

using namespace std::chrono_literals;

class DashboardServer : public RedisTest {};

TEST_F(DashboardServer, ConcurrentClientsAreAnsweredOrToldBusyAndShutdownIsClean) {
  auto client = make_client();
  auto locks = LockService::create(*client);
  auto held = locks->acquire("invoice:1", {.ttl = 30s});
  ASSERT_TRUE(held);
  ops::DashboardOptions o;
  o.admin_token = "0123456789abcdef0123";
  o.max_queue = 4;  // small, so some requests meet a full queue
  o.cache = 0ms;
  auto dashboard = std::make_unique<ops::Dashboard>(*client, o);
  ops::MetricsServerOptions so;
  so.listen = {"127.0.0.1", 0};
  so.routes = dashboard->routes();
  observe::Registry registry;
  ops::MetricsServer http(registry, so);
  http.start();

  std::atomic<int> ok{0}, busy{0}, refused{0}, other{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 6; ++t)
    clients.emplace_back([&, t] {
      for (int i = 0; i < 15; ++i) {
        const auto r = t % 3 == 2 ? http_request(http.port(), "POST", "/api/locks/release")
                                  : http_request(http.port(), "GET", t % 3 ? "/api/incidents" : "/api/locks");
        if (r.status == 200) ++ok;
        else if (r.status == 503) ++busy;
        else if (r.status == 401) ++refused;
        else ++other;
      }
    });
  for (auto& c : clients) c.join();
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(refused.load(), 30) << "every POST without the token is refused, never queued";
  EXPECT_EQ(other.load(), 0);
  const auto j = nlohmann::json::parse(http_request(http.port(), "GET", "/api/locks").body);
  EXPECT_EQ(j.at("locks").at(0).at("resource"), "invoice:1");

  // Requests in flight while the server and then the dashboard go away.
  std::thread late([&] {
    for (int i = 0; i < 5; ++i) {
      try {
        http_request(http.port(), "GET", "/api/locks", 2s);
      } catch (const std::runtime_error&) {
      }
    }
  });
  std::this_thread::sleep_for(5ms);
  http.stop();
  late.join();
  dashboard.reset();
  EXPECT_TRUE(locks->inspect("invoice:1").held);
}

}  // namespace
}  // namespace jobguard::test
