#include "jobguard/observe/event_log.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <ctime>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "jobguard/error.hpp"
#include "jobguard/text.hpp"

namespace jobguard::observe {

LogFormat parse_log_format(std::string_view s) {
  if (s == "human") return LogFormat::human;
  if (s == "json") return LogFormat::json;
  throw Error(errc::invalid_argument, fmt::format("log format \"{}\": expected human or json", escape_text(s, 64)));
}

std::string format_timestamp(std::chrono::system_clock::time_point at) {
  using namespace std::chrono;
  const auto ms_total = duration_cast<milliseconds>(at.time_since_epoch()).count();
  // Floor division so times before 1970 still print a valid millisecond field.
  std::int64_t secs = ms_total / 1000;
  std::int64_t ms = ms_total % 1000;
  if (ms < 0) {
    ms += 1000;
    secs -= 1;
  }
  const std::time_t t = static_cast<std::time_t>(secs);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

namespace {

constexpr std::string_view kFixedJsonNames[] = {"ts", "event", "lock_key", "job_id", "lock_class", "outcome",
                                                "elapsed_ms"};
constexpr std::string_view kFixedHumanNames[] = {"key", "job", "class", "outcome", "elapsed"};

template <std::size_t N>
bool is_fixed(std::string_view name, const std::string_view (&names)[N]) {
  for (auto n : names)
    if (n == name) return true;
  return false;
}

// A human value is written bare when it is one shell-friendly token, else
// quoted with escapes (logfmt style), so `grep key=` and `cut` keep working.
void append_human_value(std::string& out, std::string_view v) {
  bool bare = !v.empty();
  for (unsigned char c : v)
    if (c <= ' ' || c == '"' || c == '\\' || c == '=' || c == 0x7f) {
      bare = false;
      break;
    }
  if (bare) {
    out += v;
    return;
  }
  out += '"';
  for (unsigned char c : v) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        // Control bytes would let a crafted key break or fake a log line.
        if (c < 0x20 || c == 0x7f) fmt::format_to(std::back_inserter(out), "\\x{:02x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
}

std::string human_elapsed(double ms) {
  if (!std::isfinite(ms)) return "?";
  if (ms < 10) return fmt::format("{:.1f}ms", ms);
  if (ms < 10000) return fmt::format("{:.0f}ms", ms);
  return fmt::format("{:.1f}s", ms / 1000);
}

void append_human_field(std::string& out, std::string_view name, std::string_view value) {
  out += ' ';
  out += name;
  out += '=';
  append_human_value(out, value);
}

std::string human_line(const Event& e, std::chrono::system_clock::time_point at) {
  std::string out = format_timestamp(at);
  out += ' ';
  // Event names padded to the longest common one ("fail_open", "completed")
  // so the fields of consecutive lines line up on a terminal.
  fmt::format_to(std::back_inserter(out), "{:<9}", e.event.empty() ? std::string_view("event") : e.event);
  if (!e.lock_key.empty()) append_human_field(out, "key", e.lock_key);
  if (!e.job_id.empty()) append_human_field(out, "job", e.job_id);
  if (!e.lock_class.empty()) append_human_field(out, "class", e.lock_class);
  if (!e.outcome.empty()) append_human_field(out, "outcome", e.outcome);
  if (e.elapsed_ms) {
    out += " elapsed=";
    out += human_elapsed(*e.elapsed_ms);
  }
  for (const auto& [name, value] : e.extra) {
    const std::string key = is_fixed(name, kFixedHumanNames) ? "extra_" + name : name;
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::string>) append_human_field(out, key, v);
          else if constexpr (std::is_same_v<T, bool>) append_human_field(out, key, v ? "true" : "false");
          else append_human_field(out, key, fmt::format("{}", v));
        },
        value);
  }
  return out;
}

std::string json_line(const Event& e, std::chrono::system_clock::time_point at) {
  // ordered_json keeps the documented field order: ts and event first, which
  // is what a person scanning raw JSON lines looks for.
  nlohmann::ordered_json j;
  j["ts"] = format_timestamp(at);
  j["event"] = e.event;
  if (!e.lock_key.empty()) j["lock_key"] = e.lock_key;
  if (!e.job_id.empty()) j["job_id"] = e.job_id;
  if (!e.lock_class.empty()) j["lock_class"] = e.lock_class;
  if (!e.outcome.empty()) j["outcome"] = e.outcome;
  if (e.elapsed_ms) {
    // JSON has no NaN/Inf; null says "unknown" without breaking parsers.
    if (std::isfinite(*e.elapsed_ms)) j["elapsed_ms"] = std::round(*e.elapsed_ms * 1000) / 1000;
    else j["elapsed_ms"] = nullptr;
  }
  for (const auto& [name, value] : e.extra) {
    const std::string key = is_fixed(name, kFixedJsonNames) ? "extra_" + name : name;
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, double>) {
            if (std::isfinite(v)) j[key] = v;
            else j[key] = nullptr;
          } else {
            j[key] = v;
          }
        },
        value);
  }
  // Lock keys come from business data and may hold invalid UTF-8: replace the
  // bad bytes instead of throwing from a log call.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

std::string format_event(const Event& e, LogFormat format, std::chrono::system_clock::time_point at) {
  return format == LogFormat::json ? json_line(e, at) : human_line(e, at);
}

EventLog::EventLog(LogFormat format)
    : EventLog(format, Sink([](std::string_view line) {
        // One write(2) per line: stderr is shared with child processes and
        // other libraries, and a single write of a line is not torn by them.
        std::string buf(line);
        buf += '\n';
        const char* p = buf.data();
        std::size_t left = buf.size();
        while (left > 0) {
          const ssize_t n = ::write(STDERR_FILENO, p, left);
          if (n <= 0) {
            if (n < 0 && errno == EINTR) continue;
            return;  // nowhere to report a failing stderr
          }
          p += n;
          left -= static_cast<std::size_t>(n);
        }
      })) {}

EventLog::EventLog(LogFormat format, std::ostream& out)
    : EventLog(format, Sink([&out](std::string_view line) {
        out << line << '\n';
        out.flush();
      })) {}

EventLog::EventLog(LogFormat format, Sink sink)
    : format_(format), sink_(std::move(sink)), clock_([] { return std::chrono::system_clock::now(); }) {}

void EventLog::emit(const Event& e) {
  // Format outside the lock: only the write is serialised.
  const std::string line = format_event(e, format_, clock_());
  std::lock_guard lock(mu_);
  sink_(line);
}

}  // namespace jobguard::observe
