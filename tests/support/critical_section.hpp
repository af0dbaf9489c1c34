// What the multi-process failover tests (Sentinel, Cluster) count: each
// holder marks its critical section with an O_EXCL file, so a second holder
// inside at the same time finds the file there, and appends one line per
// grant to a log shared by every worker process.
#pragma once

#include <chrono>
#include <string>

namespace jobguard::test {

// Appends `line` in one write (O_APPEND keeps lines whole across processes).
void append_line(const std::string& path, const std::string& line);

// Holds the critical section for `hold`, marked by the file `held`, and logs
// "grant <fields> <steady ns>" to `log` — "overlap ..." when another holder
// was inside. steady_clock is CLOCK_MONOTONIC, the same in every process of
// the host, so the lines of all workers can be ordered. True when alone.
bool hold_critical_section(const std::string& held, const std::string& log, const std::string& fields,
                           std::chrono::milliseconds hold);

}  // namespace jobguard::test
