// Shared by quorum.cpp (the quorum lock), quorum_lease.cpp and the lease
// scheduler (its lease): the calls to every instance and the service's own
// event loop.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "jobguard/quorum.hpp"

namespace jobguard {

struct QuorumLockService::Impl {
  static boost::asio::io_context& loop(const QuorumLockService& s);
  // Blocking here would deadlock: the reply is delivered on one of these.
  static bool in_any_loop(const QuorumLockService& s);
  // The scheduler QuorumLease::adopt renews on (quorum_lease.cpp), on the
  // service's own loop; made on first use.
  static std::shared_ptr<LeaseScheduler> scheduler(const QuorumLockService& s);
  // One acquire: its attempts, their undo, the backoff between them (quorum.cpp).
  struct Acquire;
};

namespace detail {
// Compare-and-delete everywhere; `done` (may be null) gets how many instances
// still had our token, and the failures (QuorumLock::async_release). Runs on
// the thread of the last instance to answer.
void release_all(const QuorumLockService& svc, const std::string& key, const std::string& channel,
                 const std::string& token, std::chrono::milliseconds timeout, QuorumLock::ReleaseHandler done);

struct ExtendTally {
  std::size_t ok = 0;      // extended
  std::size_t gone = 0;    // answered: the token is not ours there
  std::size_t failed = 0;  // no answer (error, deadline)
  std::string failures;
};

// Compare-and-pexpire everywhere; `done` runs on the thread of the last
// instance to answer.
void extend_all(const QuorumLockService& svc, const std::string& key, const std::string& token,
                std::chrono::milliseconds ttl, std::chrono::milliseconds timeout, std::function<void(ExtendTally)> done);
}  // namespace detail

}  // namespace jobguard
