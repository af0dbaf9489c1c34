#include "jobguard/job/locked_run.hpp"

#include <fmt/format.h>

#include <boost/asio/io_context.hpp>

#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lease.hpp"
#include "jobguard/multilock.hpp"
#include "jobguard/redis/client.hpp"
#include "jobguard/rwlock.hpp"
#include "jobguard/semaphore.hpp"

namespace jobguard::job {

using namespace std::chrono;

namespace {

double ms_since(steady_clock::time_point t) { return duration<double, std::milli>(steady_clock::now() - t).count(); }

// "web-3/4121/job (ttl 2.1s left)", best effort, for the busy message.
std::string describe_holder(redis::Client& client, const std::string& key) {
  try {
    const auto v = client.exec(redis::Command{"GET", key}, redis::CallOptions{milliseconds(500)});
    const auto t = client.exec(redis::Command{"PTTL", key}, redis::CallOptions{milliseconds(500)});
    if (v.is_nil()) return "another owner (released just now)";
    std::string out = token_owner(v.str);
    if (t.is_integer() && t.integer > 0) out += fmt::format(" (ttl {} left)", format_duration(milliseconds(t.integer)));
    return out;
  } catch (const Error&) {
    return "another owner";
  }
}

// "has 3 holders of 3 permits (web-3/4121/job, ...)", best effort.
std::string describe_permits(LockService& service, const std::string& resource) {
  try {
    const auto info = inspect_semaphore(service, resource);
    std::string who;
    for (std::size_t i = 0; i < info.holders.size() && i < 3; ++i) who += (i ? ", " : "") + info.holders[i].holder;
    if (info.holders.size() > 3) who += ", ...";
    return fmt::format("has {} holder{}{}{}", info.holders.size(), info.holders.size() == 1 ? "" : "s",
                       info.stored_permits ? fmt::format(" (stored count {})", *info.stored_permits) : std::string(),
                       who.empty() ? std::string() : " (" + who + ")");
  } catch (const Error&) {
    return "has every permit held";
  }
}

// "has a writer (web-1/77/job)" or "has 3 readers (...), 1 writer waiting", best effort.
std::string describe_rw(LockService& service, const std::string& resource) {
  try {
    const auto info = inspect_rwlock(service, resource);
    if (info.writer) return fmt::format("has a writer ({})", info.writer->holder);
    std::string who;
    for (std::size_t i = 0; i < info.readers.size() && i < 3; ++i) who += (i ? ", " : "") + info.readers[i].holder;
    if (info.readers.size() > 3) who += ", ...";
    return fmt::format("has {} reader{}{}{}", info.readers.size(), info.readers.size() == 1 ? "" : "s",
                       who.empty() ? std::string() : " (" + who + ")",
                       info.waiting_writers > 0 ? fmt::format(", {} writer(s) waiting", info.waiting_writers)
                                                : std::string());
  } catch (const Error&) {
    return "is held";
  }
}

class LockedRun {
 public:
  LockedRun(redis::Client& client, const KeyBuilder& keys, LockedRunOptions opts, const std::function<void(RunEvent)>& emit)
      : client_(client), keys_(keys), o_(std::move(opts)), emit_(emit) {}

  LockedRunResult run() {
    const auto started = steady_clock::now();
    if (!o_.more_resources.empty()) return run_all(started);
    if (o_.once && find_record(started)) return skipped();

    auto service = LockService::create(client_, keys_);
    const bool semaphore = o_.lock.permits > 0;
    const bool rw = o_.lock.mode != LockMode::mutex;
    const std::string lock_key = semaphore                                ? keys_.permit_holders_key(o_.resource)
                                 : o_.lock.mode == LockMode::shared    ? keys_.rw_readers_key(o_.resource)
                                 : o_.lock.mode == LockMode::exclusive ? keys_.rw_writer_key(o_.resource)
                                                                       : keys_.lock_key(o_.resource);
    const auto acquire_start = steady_clock::now();
    std::optional<Lock> lock;
    try {
      lock = service->acquire(o_.resource, o_.lock);
    } catch (const Error& e) {
      if (next_step_for(e.code()) == next_step::retry_call)
        throw Error(errc::redis_unavailable,
                    fmt::format("Redis failed while acquiring {}: {}; CMD not run (fail-closed)", lock_key, e.what()));
      throw;
    }
    if (!lock) {
      const auto waited = o_.lock.wait;
      const std::string waited_text =
          waited.count() > 0 ? fmt::format(" (waited {})", format_duration(waited)) : std::string();
      if (semaphore)
        event("busy", "busy", ms_since(acquire_start), true,
              fmt::format("no permit free: {} {}{}", lock_key, describe_permits(*service, o_.resource), waited_text));
      else if (rw)
        event("busy", "busy", ms_since(acquire_start), true,
              fmt::format("read-write lock busy for a {}: {} {}{}", o_.lock.mode == LockMode::shared ? "reader" : "writer",
                          lock_key, describe_rw(*service, o_.resource), waited_text));
      else
        event("busy", "busy", ms_since(acquire_start), true,
              fmt::format("lock busy: {} is held by {}{}", lock_key, describe_holder(client_, lock_key), waited_text));
      return LockedRunResult{LockedRunResult::Status::busy, {}, false, false};
    }
    acquired_at_ = lock->acquired_at();
    std::vector<std::pair<std::string, observe::FieldValue>> fence;
    if (o_.lock.fence && lock->fence()) fence.emplace_back("fence", *lock->fence());
    event("acquired", "ok", ms_since(acquire_start), false, fmt::format("acquired {}", lock_key), fence);
    o_.cmd.env.emplace_back("JOBGUARD_KEY", lock->key());
    o_.cmd.env.emplace_back("JOBGUARD_TOKEN", lock->token());
    if (o_.lock.fence && lock->fence()) o_.cmd.env.emplace_back("JOBGUARD_FENCE", std::to_string(*lock->fence()));
    if (semaphore) {
      o_.cmd.env.emplace_back("JOBGUARD_PERMITS", std::to_string(lock->permits()));
      o_.cmd.env.emplace_back("JOBGUARD_PERMIT_SLOT", std::to_string(lock->permit_slot()));
    }
    if (rw) o_.cmd.env.emplace_back("JOBGUARD_LOCK_MODE", to_string(lock->mode()));

    // The authoritative --once check happens under the lock: two runs that
    // both passed the check above cannot both get here and find no record.
    if (o_.once && find_record(started)) {
      lock->release();
      return skipped();
    }
    // Made after the service, so destroyed before it: the lease is released
    // while the client still runs.
    auto scheduler = LeaseScheduler::create(service);
    Lease lease = scheduler->adopt(std::move(*lock));
    return supervise(lease, started);
  }

 private:
  // Several resources, all or none (acquire_all): the same steps as run().
  LockedRunResult run_all(steady_clock::time_point started) {
    if (o_.once) throw Error(errc::invalid_argument, "a completion record (once) is for one resource, not several");
    std::vector<std::string> resources = o_.more_resources;
    resources.insert(resources.begin(), o_.resource);
    auto service = LockService::create(client_, keys_);
    resources = canonical_resources(*service, std::move(resources), o_.lock);  // bad sets: invalid_argument
    std::string names;
    for (const auto& r : resources) names += (names.empty() ? "" : ", ") + keys_.lock_key(r);
    const auto acquire_start = steady_clock::now();
    std::optional<MultiLock> locks;
    try {
      locks = acquire_all(*service, resources, o_.lock);
    } catch (const Error& e) {
      if (next_step_for(e.code()) == next_step::retry_call)
        throw Error(errc::redis_unavailable,
                    fmt::format("Redis failed while acquiring {}: {}; CMD not run (fail-closed)", names, e.what()));
      throw;
    }
    if (!locks) {
      std::string held;
      for (const auto& r : resources) {
        const std::string k = keys_.lock_key(r);
        const auto who = describe_holder(client_, k);
        if (who != "another owner (released just now)") held += fmt::format("{}{} is held by {}", held.empty() ? "" : "; ", k, who);
      }
      if (held.empty()) held = "every key was released just now";
      event("busy", "busy", ms_since(acquire_start), true,
            fmt::format("lock busy: {}; none of {} held{}", held, names,
                        o_.lock.wait.count() > 0 ? fmt::format(" (waited {})", format_duration(o_.lock.wait)) : ""));
      return LockedRunResult{LockedRunResult::Status::busy, {}, false, false};
    }
    acquired_at_ = locks->locks().front().acquired_at();
    std::string rs, ks, ts, fs;
    for (const auto& l : locks->locks()) {
      const char* sep = rs.empty() ? "" : " ";
      rs += sep + l.resource();
      ks += sep + l.key();
      ts += sep + l.token();
      if (l.fence()) fs += sep + std::to_string(*l.fence());
    }
    std::vector<std::pair<std::string, observe::FieldValue>> extra;
    if (o_.lock.fence) extra.emplace_back("fences", fs);
    event("acquired", "ok", ms_since(acquire_start), false, fmt::format("acquired {}", names), extra);
    o_.cmd.env.emplace_back("JOBGUARD_RESOURCES", rs);
    o_.cmd.env.emplace_back("JOBGUARD_KEYS", ks);
    o_.cmd.env.emplace_back("JOBGUARD_TOKENS", ts);
    if (o_.lock.fence) o_.cmd.env.emplace_back("JOBGUARD_FENCES", fs);
    auto scheduler = LeaseScheduler::create(service);
    Lease lease = scheduler->adopt_all(std::move(*locks));
    return supervise(lease, started);
  }

  // "jobguard:lock:{a}", or every key of a multi-lock's lease.
  static std::string lease_keys(const Lease& lease) {
    std::string out = lease.key();
    for (std::size_t i = 1; i < lease.lock_count(); ++i) out += ", " + lease.lock_at(i).key();
    return out;
  }

  LockedRunResult supervise(Lease& lease, steady_clock::time_point started) {
    o_.cmd.lease = &lease;
    boost::asio::io_context ctx;
    LockedRunResult r;
    {
      Supervisor sup(ctx.get_executor(), std::move(o_.cmd), [&](const CmdOutcome& o) { r.outcome = o; },
                     [&](const SupervisorEvent& ev) { report(ev); });
      ctx.run();
    }
    const std::string key = lease_keys(lease);
    if (r.outcome.ending == Ending::failed_to_start) {
      const bool ours = lease.release();
      event("released", ours ? "ok" : "not_ours", ms_since(acquired_at_), false, fmt::format("released {}", key));
      event("error", "error", ms_since(started), true, r.outcome.detail);
      return r;
    }
    // A lease that ran out while CMD ran means someone else may have held the
    // lock at the same time, whether or not we heard it before CMD ended.
    r.lost = r.outcome.ending == Ending::lease_lost || lease.lost() || lease.safe_time_left().count() <= 0;
    if (r.lost && r.outcome.ending != Ending::lease_lost)
      event("lost", "lost", ms_since(acquired_at_), true,
            lease.reason().empty() ? fmt::format("lease on {} lost while CMD ran", key) : lease.reason());
    // Recorded before the release, so the next holder of the lock sees it.
    if (o_.once && r.outcome.ending == Ending::exited && r.outcome.status.shell_status() == 0) {
      try {
        o_.once->record("run", o_.resource, o_.run_id, token_owner(lease.token()));
      } catch (const Error& e) {
        r.record_failed = true;
        r.record_error = e;
        event("error", "error", ms_since(started), true,
              e.code() == errc::in_doubt
                  ? fmt::format("CMD succeeded but whether its completion record for run {} was written is "
                                "unknown: {}; a rerun checks the record first", o_.run_id, e.what())
                  : fmt::format("CMD succeeded but its completion record for run {} could not be written: {}; a "
                                "rerun will repeat it", o_.run_id, e.what()));
      }
    }
    const auto held_ms = ms_since(acquired_at_);
    const bool ours = lease.release();
    // Not ours although renewals were fine until CMD ended: exclusion held
    // while it ran; the key vanished since (force-released) or Redis was unreachable.
    event("released", ours ? "ok" : r.lost ? "lost" : "not_ours", held_ms, !ours && !r.lost,
          ours || r.lost ? fmt::format("released {} ({})", key, r.outcome.status.describe())
                         : fmt::format("could not release {}: it was no longer ours or Redis was unreachable (it "
                                       "expires by its TTL)", key),
          {{"ending", std::string(to_string(r.outcome.ending))},
           {"cmd_status", static_cast<std::int64_t>(r.outcome.status.shell_status())}});
    return r;
  }

  void report(const SupervisorEvent& ev) {
    using K = SupervisorEvent::Kind;
    const double t = ms_since(acquired_at_);
    switch (ev.kind) {
      case K::renewed: return event("renewed", "ok", t, false, ev.message);
      case K::suspended: return event("stopped", "stopped", t, true, ev.message, {{"signal", std::int64_t{ev.signal}}});
      case K::resumed: return event("continued", "ok", t, false, ev.message);
      case K::stopping: break;
    }
    switch (ev.cause) {
      case Ending::lease_lost: return event("lost", "lost", t, true, ev.message);
      case Ending::timed_out: return event("timeout", "timeout", t, true, ev.message);
      case Ending::stopped: return event("stopped", "killed", t, true, ev.message);
      default: return event("signal", "forwarded", t, false, ev.message, {{"signal", std::int64_t{ev.signal}}});
    }
  }

  bool find_record(steady_clock::time_point started) {
    std::optional<guard::CompletionRecord> rec;
    try {
      rec = o_.once->find("run", o_.resource, o_.run_id);
    } catch (const Error& e) {
      if (next_step_for(e.code()) == next_step::retry_call)
        throw Error(e.code(), fmt::format("cannot read the completion record of run {}: {}; CMD not run (fail-closed)",
                                          o_.run_id, e.what()));
      throw;
    }
    if (!rec) return false;
    event("skipped", "done", ms_since(started), true,
          fmt::format("run {} of {} already done{}; CMD skipped", o_.run_id, o_.resource,
                      rec->completed_by.empty() ? std::string() : fmt::format(" (by {})", rec->completed_by)),
          {{"run_id", o_.run_id}});
    return true;
  }

  static LockedRunResult skipped() { return LockedRunResult{LockedRunResult::Status::skipped, {}, false, false}; }

  void event(std::string_view name, std::string_view outcome, std::optional<double> elapsed, bool problem,
             std::string message, std::vector<std::pair<std::string, observe::FieldValue>> extra = {}) {
    if (emit_) emit_(RunEvent{name, outcome, elapsed, problem, std::move(message), std::move(extra)});
  }

  redis::Client& client_;
  const KeyBuilder& keys_;
  LockedRunOptions o_;
  const std::function<void(RunEvent)>& emit_;
  steady_clock::time_point acquired_at_{};
};

}  // namespace

LockedRunResult run_locked(redis::Client& client, const KeyBuilder& keys, LockedRunOptions opts,
                           const std::function<void(RunEvent)>& on_event) {
  return LockedRun(client, keys, std::move(opts), on_event).run();
}

}  // namespace jobguard::job
