// Private to src/job: one run of GuardedRunner as its files share it
// (runner.cpp: the claim and the run's end; runner_step.cpp: the steps).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <optional>
#include <string>

#include "job/claim_path.hpp"
#include "jobguard/job/runner.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/lock.hpp"

namespace jobguard::job {

// What the effect is and where blocking work goes.
struct GuardedRunner::Body {
  Effect sync;        // runs on `blocking`
  AsyncEffect async;  // runs on the event loop
  boost::asio::any_io_executor blocking;
};

struct GuardedRunner::Attempt {
  const Unit* unit = nullptr;
  const Body* body = nullptr;
  ClaimCall call;  // the resource, job id and fingerprint, the lock's options
  std::optional<Lock> lock;
  std::optional<Lease> lease;
  // The unit's key, claimed with the lock (the one-call claim).
  std::optional<KeyClaim> key;
  bool fail_open = false;
  observe::LockClassMetrics* m = nullptr;
  std::chrono::steady_clock::time_point t0;

  const std::string& lock_key() const {
    static const std::string none;
    return lease ? lease->key() : lock ? lock->key() : none;
  }
};

// Thrown to end a run with a verdict that is not an error of the effect
// (inside a high-class transaction: rolling it back).
struct StepVerdict {
  Outcome outcome;
  std::string detail;
  std::string result;
};

}  // namespace jobguard::job
