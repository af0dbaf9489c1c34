// Structured event logs: one line per lock/job event (acquired, busy, renewed,
// lost, released, fail_open, skipped, completed ...), as JSON for machines or
// a compact human form for terminals:
//
//   {"ts":"2026-11-30T09:41:02.123Z","event":"acquired","lock_key":"jobguard:lock:{invoice:1}",
//    "job_id":"w1-42","lock_class":"billing","outcome":"ok","elapsed_ms":3.2}
//   2026-11-30T09:41:02.123Z acquired  key=jobguard:lock:{invoice:1} job=w1-42 class=billing outcome=ok elapsed=3.2ms
//
// Threads: EventLog::emit may be called from any thread; each line reaches the
// sink in one call under a mutex, so lines never interleave. format_event is a
// pure function.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace jobguard::observe {

enum class LogFormat { human, json };

// "human" or "json" (the values of the CLI's --log-format); throws
// jobguard::Error(invalid_argument) naming the bad value otherwise.
LogFormat parse_log_format(std::string_view s);

using FieldValue = std::variant<std::string, std::int64_t, double, bool>;

// One event; every field has a default so designated initializers may name
// only what they need. Empty strings and an empty elapsed_ms are left out of the line.
// The string_views must stay valid only for the emit() call.
struct Event {
  std::string_view event{};     // phase: acquired, busy, renewed, lost, released, fail_open, skipped, completed...
  std::string_view lock_key{};  // the Redis key, prefix included; never used as a metric label
  std::string_view job_id{};
  std::string_view lock_class{};
  std::string_view outcome{};   // ok, busy, error, timeout ...
  std::optional<double> elapsed_ms{};
  // Free fields, written after the fixed ones in this order. An extra field
  // named like a fixed one is written as "extra_<name>" so it cannot forge it.
  std::vector<std::pair<std::string, FieldValue>> extra{};
};

// Renders `e` as one line without the trailing newline. `at` is wall-clock
// time, for display only.
std::string format_event(const Event& e, LogFormat format, std::chrono::system_clock::time_point at);

// 2026-11-30T09:41:02.123Z (UTC, milliseconds).
std::string format_timestamp(std::chrono::system_clock::time_point at);

class EventLog {
 public:
  // Receives one complete line, without the trailing newline.
  using Sink = std::function<void(std::string_view line)>;
  using Clock = std::function<std::chrono::system_clock::time_point()>;

  // Writes to stderr.
  explicit EventLog(LogFormat format = LogFormat::human);
  // Writes to `out`, which must outlive this EventLog.
  EventLog(LogFormat format, std::ostream& out);
  EventLog(LogFormat format, Sink sink);

  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  void emit(const Event& e);
  LogFormat format() const noexcept { return format_; }
  // Replaces the wall clock (tests). Not thread-safe: call before emitting.
  void set_clock(Clock clock) { clock_ = std::move(clock); }

 private:
  LogFormat format_;
  Sink sink_;
  Clock clock_;
  std::mutex mu_;
};

}  // namespace jobguard::observe
