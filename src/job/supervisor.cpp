#include "jobguard/job/supervisor.hpp"

#include <fmt/format.h>
#include <signal.h>

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <system_error>

#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "jobguard/lease.hpp"

namespace jobguard::job {

namespace asio = boost::asio;
using std::chrono::milliseconds;

std::string_view to_string(Ending e) noexcept {
  switch (e) {
    case Ending::exited: return "exited";
    case Ending::lease_lost: return "lease_lost";
    case Ending::timed_out: return "timed_out";
    case Ending::signaled: return "signaled";
    case Ending::stopped: return "stopped";
    case Ending::failed_to_start: return "failed_to_start";
  }
  return "?";
}

namespace {

std::string signame(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

}  // namespace

std::string CmdOutcome::describe() const {
  switch (ending) {
    case Ending::exited: return status.describe();
    case Ending::failed_to_start: return detail;
    case Ending::stopped:
      return fmt::format("CMD stayed stopped by {}; {}", signame(signal), status.describe());
    case Ending::signaled:
      return fmt::format("stopped by a forwarded {}; {}", signame(signal), status.describe());
    default: return fmt::format("{}; {}", detail, status.describe());
  }
}

const std::vector<int>& Supervisor::forwarded_signals() {
  static const std::vector<int> sigs{SIGHUP,    SIGINT,  SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGTERM,
#ifdef SIGSTKFLT
                                     SIGSTKFLT,
#endif
                                     SIGVTALRM, SIGPROF, SIGIO,   SIGPWR,  SIGXCPU, SIGXFSZ};
  return sigs;
}

void Supervisor::ignore_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] { ::signal(SIGPIPE, SIG_IGN); });
}

// Carries stop requests from other threads (the Redis client's loop, where a
// lease is declared lost) to the executor, and only while the Supervisor lives.
struct Mailbox {
  std::mutex mu;
  bool open = true;
  asio::any_io_executor ex;
  std::weak_ptr<Supervisor::Impl> target;
  void post(Ending why, std::string detail);
};

struct Supervisor::Impl : std::enable_shared_from_this<Supervisor::Impl> {
  Impl(asio::any_io_executor e, SupervisorOptions o)
      : ex(e),
        opts(std::move(o)),
        kill_timer(e),
        timeout_timer(e),
        safe_timer(e),
        suspend_timer(e),
        renew_timer(e),
        signals(e),
        mailbox(std::make_shared<Mailbox>()) {}

  asio::any_io_executor ex;
  SupervisorOptions opts;
  DoneHandler on_done;
  EventHandler on_event;
  std::unique_ptr<Process> proc;
  asio::steady_timer kill_timer, timeout_timer, safe_timer, suspend_timer, renew_timer;
  asio::signal_set signals;
  std::shared_ptr<Mailbox> mailbox;
  std::optional<Ending> cause;
  int cause_signal = 0;
  std::string detail;
  bool kill_armed = false;
  bool finished = false;
  bool suspended = false;

  void event(SupervisorEvent::Kind kind, Ending c, int sig, std::string message) {
    if (on_event) on_event(SupervisorEvent{kind, c, sig, std::move(message)});
  }

  // The first cause wins; a later one cannot shorten or extend the grace.
  void begin_stop(Ending why, int sig, std::string why_text) {
    if (finished || !proc) return;
    if (cause) {
      // Already stopping: a forwarded signal still reaches CMD (a trap may
      // care), but the cause and the SIGKILL deadline stay.
      if (why == Ending::signaled) proc->signal_group(sig);
      return;
    }
    cause = why;
    cause_signal = why == Ending::signaled || why == Ending::stopped ? sig : 0;
    detail = std::move(why_text);
    const int send = why == Ending::signaled ? sig : SIGTERM;
    event(SupervisorEvent::Kind::stopping, why, send,
          fmt::format("{}; sending {} to CMD's process group {}, SIGKILL after {}", detail, signame(send),
                      proc->pgid(), format_duration(opts.grace)));
    if (opts.grace.count() <= 0) {
      proc->kill();
      return;
    }
    proc->signal_group(send);
    kill_armed = true;
    kill_timer.expires_after(opts.grace);
    kill_timer.async_wait([w = weak_from_this()](boost::system::error_code ec) {
      auto self = w.lock();
      if (ec || !self || self->finished) return;
      self->proc->kill();
    });
  }

  void on_stopped(bool stopped, int sig) {
    if (finished) return;
    suspended = stopped;
    if (!stopped) {
      suspend_timer.cancel();
      event(SupervisorEvent::Kind::resumed, Ending::exited, 0, "CMD continued");
      return;
    }
    event(SupervisorEvent::Kind::suspended, Ending::stopped, sig,
          fmt::format("CMD (pid {}) was stopped by {}{}; it is killed if still stopped after {}", proc->pid(),
                      signame(sig),
                      sig == SIGTTIN || sig == SIGTTOU ? " (it used the terminal from the background: see --foreground)"
                                                       : "",
                      format_duration(opts.grace)));
    // A stopped CMD does no work but would hold the lease for ever: it gets
    // the grace to be continued, then is stopped like on a lost lease.
    suspend_timer.expires_after(opts.grace);
    suspend_timer.async_wait([w = weak_from_this(), sig](boost::system::error_code ec) {
      auto self = w.lock();
      if (ec || !self || self->finished || !self->proc->stopped()) return;
      self->begin_stop(Ending::stopped, sig,
                       fmt::format("CMD stayed stopped by {} for {}", signame(sig), format_duration(self->opts.grace)));
    });
  }

  void on_exit(ExitStatus st) {
    if (finished) return;
    // waitpid reports a continue only if it is reaped before the exit: a CMD
    // that is continued and exits at once shows only the exit. Such a CMD
    // was continued all the same (only SIGKILL ends a stopped process), and
    // a listener that saw "suspended" must not be left believing it still is.
    if (suspended && !(st.signaled && st.signal == SIGKILL)) on_stopped(false, 0);
    finished = true;
    boost::system::error_code ignored;
    for (auto* t : {&kill_timer, &timeout_timer, &safe_timer, &suspend_timer, &renew_timer}) t->cancel();
    signals.cancel();
    signals.clear(ignored);
    close_mailbox();
    CmdOutcome out;
    out.ending = cause.value_or(Ending::exited);
    out.status = st;
    out.signal = cause_signal;
    out.detail = detail;
    if (auto cb = std::move(on_done)) {
      on_done = nullptr;
      cb(out);
    }
  }

  void close_mailbox() {
    std::lock_guard<std::mutex> g(mailbox->mu);
    mailbox->open = false;
  }

  void wait_signal() {
    signals.async_wait([w = weak_from_this()](boost::system::error_code ec, int sig) {
      auto self = w.lock();
      if (ec || !self || self->finished) return;
      if (sig == SIGCONT) {
        // Back from a stop of jobguard itself (SIGSTOP, a frozen VM): the safe
        // time comes from the monotonic clock, so we know at once whether the
        // TTL ran out while we were not running, before any renewal timer.
        if (auto* l = self->opts.lease; l && l->safe_time_left().count() <= 0)
          self->begin_stop(Ending::lease_lost, 0,
                           l->lost() ? l->reason()
                                     : fmt::format("lease on {} lost: jobguard was stopped past the lock's safe time",
                                                   l->key()));
      } else {
        self->begin_stop(Ending::signaled, sig, fmt::format("jobguard received {}", signame(sig)));
      }
      self->wait_signal();
    });
  }

  void watch_renewals(std::uint64_t seen) {
    const auto period = std::max(milliseconds(10), std::chrono::duration_cast<milliseconds>(opts.lease->safe_time_left() / 3));
    renew_timer.expires_after(period);
    renew_timer.async_wait([w = weak_from_this(), seen](boost::system::error_code ec) {
      auto self = w.lock();
      if (ec || !self || self->finished) return;
      const auto n = self->opts.lease->renewals();
      if (n != seen && !self->opts.lease->lost())
        self->event(SupervisorEvent::Kind::renewed, Ending::exited, 0, fmt::format("renewed {}", self->opts.lease->key()));
      self->watch_renewals(n);
    });
  }
};

void Mailbox::post(Ending why, std::string detail) {
  std::lock_guard<std::mutex> g(mu);
  if (!open) return;
  asio::post(ex, [w = target, why, detail = std::move(detail)]() mutable {
    if (auto s = w.lock()) s->begin_stop(why, 0, std::move(detail));
  });
}

Supervisor::Supervisor(asio::any_io_executor ex, SupervisorOptions options, DoneHandler on_done, EventHandler on_event)
    : impl_(std::make_shared<Impl>(ex, std::move(options))) {
  ignore_sigpipe();
  auto& s = *impl_;
  if (s.opts.argv.empty() || s.opts.argv[0].empty()) throw Error(errc::invalid_argument, "no command to run");
  s.on_done = std::move(on_done);
  s.on_event = std::move(on_event);
  s.mailbox->ex = ex;
  s.mailbox->target = impl_;

  if (s.opts.forward_signals) {
    // Installed before CMD starts: a signal in between is forwarded, not fatal.
    for (int sig : forwarded_signals()) s.signals.add(sig);
    s.signals.add(SIGCONT);
    s.wait_signal();
  }

  ProcessOptions po{s.opts.argv, s.opts.env, s.opts.foreground};
  std::weak_ptr<Impl> w = impl_;
  try {
    s.proc = std::make_unique<Process>(
        ex, po,
        [w](ExitStatus st) {
          if (auto self = w.lock()) self->on_exit(st);
        },
        [w](bool stopped, int sig) {
          if (auto self = w.lock()) self->on_stopped(stopped, sig);
        });
  } catch (const std::system_error& e) {
    s.finished = true;
    boost::system::error_code ignored;
    s.signals.cancel();
    s.signals.clear(ignored);
    s.close_mailbox();
    CmdOutcome out;
    out.ending = Ending::failed_to_start;
    out.error = e.code().value();
    out.detail = e.what();
    asio::post(ex, [w, out] {
      auto self = w.lock();
      if (!self) return;
      if (auto cb = std::move(self->on_done)) {
        self->on_done = nullptr;
        cb(out);
      }
    });
    return;
  }

  if (s.opts.timeout.count() > 0) {
    s.timeout_timer.expires_after(s.opts.timeout);
    s.timeout_timer.async_wait([w](boost::system::error_code ec) {
      auto self = w.lock();
      if (ec || !self) return;
      self->begin_stop(Ending::timed_out, 0,
                       fmt::format("hard timeout: CMD still running after {}", format_duration(self->opts.timeout)));
    });
  }
  if (s.opts.safe_time.count() > 0) {
    // A lock that is not renewed: CMD past the lock's safe time would run
    // beside the next holder.
    s.safe_timer.expires_after(s.opts.safe_time);
    s.safe_timer.async_wait([w](boost::system::error_code ec) {
      auto self = w.lock();
      if (ec || !self) return;
      self->begin_stop(Ending::lease_lost, 0,
                       fmt::format("the lock's TTL ran out: CMD still running after its safe time of {}",
                                   format_duration(self->opts.safe_time)));
    });
  }
  if (auto* lease = s.opts.lease) {
    lease->on_lost([mb = s.mailbox](LeaseState, const std::string& why) { mb->post(Ending::lease_lost, why); });
    if (s.on_event) s.watch_renewals(0);
  }
}

Supervisor::~Supervisor() {
  auto& s = *impl_;
  s.finished = true;
  s.close_mailbox();
  s.on_done = nullptr;
  s.on_event = nullptr;
  boost::system::error_code ignored;
  for (auto* t : {&s.kill_timer, &s.timeout_timer, &s.safe_timer, &s.suspend_timer, &s.renew_timer}) t->cancel();
  s.signals.cancel();
  s.signals.clear(ignored);
  s.proc.reset();  // kills the group and reaps CMD and the guardian if still running
}

pid_t Supervisor::pid() const noexcept { return impl_->proc ? impl_->proc->pid() : -1; }
pid_t Supervisor::pgid() const noexcept { return impl_->proc ? impl_->proc->pgid() : -1; }
bool Supervisor::done() const noexcept { return impl_->finished; }

void Supervisor::forward(int sig) { impl_->begin_stop(Ending::signaled, sig, fmt::format("forwarding {}", signame(sig))); }

void Supervisor::stop(Ending why, std::string detail) { impl_->begin_stop(why, 0, std::move(detail)); }

void Supervisor::kill() {
  auto& s = *impl_;
  if (s.finished || !s.proc) return;
  if (!s.cause) {
    s.cause = Ending::signaled;
    s.cause_signal = SIGKILL;
    s.detail = "killed";
  }
  s.proc->kill();
}

Supervisor::RemoteStop Supervisor::remote_stop() {
  return [mb = impl_->mailbox](Ending why, std::string detail) { mb->post(why, std::move(detail)); };
}

}  // namespace jobguard::job
