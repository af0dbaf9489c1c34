// Takes, holds and releases one lock and one renewing lease with nothing but
// jobguard::lock linked, blocking and from a coroutine (<jobguard/async.hpp>
// compiles warning-free in the user's build). Redis: $JOBGUARD_REDIS_URL.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <jobguard/async.hpp>
#include <jobguard/lease.hpp>
#include <jobguard/lock.hpp>
#include <jobguard/redis/client.hpp>

#include <chrono>
#include <cstdlib>
#include <iostream>

using namespace std::chrono_literals;

// 0 when a coroutine took, held and released the lock.
boost::asio::awaitable<int> with_a_coroutine(jobguard::LockService& locks) {
  const jobguard::LockOptions opts{.ttl = 5s};
  auto lock = co_await jobguard::async_acquire(locks, "consumer:lock-only:co", opts, boost::asio::use_awaitable);
  if (!lock) co_return 6;
  co_return co_await jobguard::async_release(*lock, boost::asio::use_awaitable) ? 0 : 7;
}

int main() {
  const char* url = std::getenv("JOBGUARD_REDIS_URL");
  jobguard::redis::Client client(jobguard::redis::parse_url(url ? url : "redis://127.0.0.1:6379/0"));
  auto locks = jobguard::LockService::create(client);
  auto lock = locks->acquire("consumer:lock-only", {.ttl = 5s});
  if (!lock) return 1;
  // A second owner is refused while we hold it.
  if (locks->acquire("consumer:lock-only", {.ttl = 5s})) return 2;
  if (!lock->release()) return 3;
  if (int rc = boost::asio::co_spawn(client.get_executor(), with_a_coroutine(*locks), boost::asio::use_future).get())
    return rc;

  auto leases = jobguard::LeaseScheduler::create(locks);
  auto lease = leases->acquire("consumer:lock-only", {.ttl = 5s, .fence = true});
  if (!lease || !lease->fence()) return 4;
  lease->ensure(1s);
  std::cout << "lock-only consumer: fence " << *lease->fence() << "\n";
  return lease->release() ? 0 : 5;
}
