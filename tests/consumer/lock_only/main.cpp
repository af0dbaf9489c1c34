// Takes, holds and releases one lock and one renewing lease with nothing but
// jobguard::lock linked. Redis: $JOBGUARD_REDIS_URL.
#include <jobguard/lease.hpp>
#include <jobguard/lock.hpp>
#include <jobguard/redis/client.hpp>

#include <chrono>
#include <cstdlib>
#include <iostream>

using namespace std::chrono_literals;

int main() {
  const char* url = std::getenv("JOBGUARD_REDIS_URL");
  jobguard::redis::Client client(jobguard::redis::parse_url(url ? url : "redis://127.0.0.1:6379/0"));
  auto locks = jobguard::LockService::create(client);
  auto lock = locks->acquire("consumer:lock-only", {.ttl = 5s});
  if (!lock) return 1;
  // A second owner is refused while we hold it.
  if (locks->acquire("consumer:lock-only", {.ttl = 5s})) return 2;
  if (!lock->release()) return 3;

  auto leases = jobguard::LeaseScheduler::create(locks);
  auto lease = leases->acquire("consumer:lock-only", {.ttl = 5s, .fence = true});
  if (!lease || !lease->fence()) return 4;
  lease->ensure(1s);
  std::cout << "lock-only consumer: fence " << *lease->fence() << "\n";
  return lease->release() ? 0 : 5;
}
