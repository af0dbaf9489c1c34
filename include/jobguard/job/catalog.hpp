// The lock catalog: a YAML file declaring every lock class of a fleet — what
// it protects, who owns it, how bad a repeat is, its TTL policy, fencing and
// what a job does when Redis is down — read by `jobguard policy lint|doc`,
// `jobguard jobs work --catalog`, `jobguard locks ls --class` and by library
// users (Catalog::load(...).get("invoice-charge")). docs/operations.md
// documents the format; docs/catalog.example.yaml is a complete example.
//
//   classes:
//     - name: invoice-charge
//       key: "invoice:{id}"
//       owner: billing-team
//       protects: the card charge of one invoice
//       consequence: moderate        # low | moderate | high
//       ttl: 30s
//       renewal: false               # true: a renewing lease (long-running)
//       hard_timeout: none           # a duration when renewal is true
//       fencing: false
//       on_redis_down: fail-closed   # fail-closed | fail-open
//       fallback: the job stays queued and runs when Redis is back
//       permits: 5                   # optional: one of 5 permits instead of the lock
//                                    # (or mode: shared | exclusive: a reader /
//                                    # the writer of a read-write lock; not both)
//
// Every field but permits and mode is required: a catalog is documentation,
// and a class whose TTL policy nobody wrote down is the finding. Unknown fields are errors (a typo
// must not silently fall back to a default).
//
// Threads: a Catalog is an immutable value once loaded; share it freely.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jobguard/job/lock_class.hpp"

namespace jobguard::job {

struct CatalogClass {
  LockClass lock_class;
  // What happens instead when the lock cannot be taken or Redis is down
  // (documentation: "the job stays queued", "the nightly run catches up").
  std::string fallback;
  int line = 0;  // 1-based line of the class in its file
};

struct CatalogFinding {
  enum class Severity { error, warning };
  Severity severity = Severity::error;
  std::string file;
  int line = 0;       // 1-based; 0 when the finding is about the whole file
  std::string cls;    // class name; empty when unknown
  std::string message;
  // "FILE:LINE: error: class 'NAME': MESSAGE" — one line, as lint prints it.
  std::string to_string() const;
};

class Catalog {
 public:
  // Reads, parses and checks a catalog file. Throws Error(invalid_argument)
  // carrying the first error finding ("FILE:LINE: error: class 'X': ...") or
  // naming the unreadable file.
  static Catalog load(const std::string& path);
  // The same for text already in memory; `source` names it in findings.
  static Catalog parse(std::string_view yaml, const std::string& source);
  // Everything wrong with a catalog, without throwing: missing or unknown
  // fields, malformed values, duplicate names, a declaration that breaks the
  // decision matrix. The returned catalog holds the classes that passed.
  static Catalog check(std::string_view yaml, const std::string& source, std::vector<CatalogFinding>& findings);

  const std::vector<CatalogClass>& classes() const noexcept { return classes_; }
  const std::string& source() const noexcept { return source_; }
  // nullptr when no class has that name.
  const CatalogClass* find(std::string_view name) const noexcept;
  // The class named `name`; throws Error(invalid_argument) naming the file
  // and the classes it has when there is none.
  const LockClass& get(std::string_view name) const;
  // The class whose key pattern produces `resource` ("invoice:{id}" matches
  // "invoice:48291"); the first in file order. nullptr when none does.
  const CatalogClass* match(std::string_view resource) const noexcept;

 private:
  std::string source_;
  std::vector<CatalogClass> classes_;
};

// True when `pattern` ("invoice:{id}", or a fixed resource without "{id}")
// produces `resource` for some non-empty unit id.
bool key_pattern_matches(std::string_view pattern, std::string_view resource) noexcept;

// The fleet's observed hold time of one class (from the fleet metrics).
struct ObservedHold {
  std::string cls;
  double p99_seconds = 0;
  std::uint64_t samples = 0;
};

struct HoldLintOptions {
  // Error when the observed p99 hold time reaches this fraction of the time
  // a holder is allowed (ttl, or hard_timeout for a renewing class): a slow
  // day pushes holders past it. Default 0.8.
  double too_close = 0.8;
  // Warning when the allowed time is more than this many times the p99: a
  // crashed holder keeps everyone out that much longer than needed.
  // Default 20.
  double far_too_long = 20.0;
  // Classes with fewer samples are not judged. Default 20.
  std::uint64_t min_samples = 20;
};

// Compares each class's TTL (hard timeout for renewing classes) with the
// observed p99 hold time. Classes without observations get no finding.
std::vector<CatalogFinding> lint_hold_times(const Catalog& catalog, const std::vector<ObservedHold>& observed,
                                            const HoldLintOptions& opts = {});

// Classes whose TTL is above `max_ttl`, the longest TTL the lock Redis's
// clients accept (the URL option `max_ttl`, default 60 s: the length of the
// quarantine after lost lock state). Every acquire of such a class is refused
// (invalid_argument), so each is an error finding.
std::vector<CatalogFinding> lint_max_ttl(const Catalog& catalog, std::chrono::milliseconds max_ttl);

// The catalog's declared limits as Prometheus gauges, for `jobguard serve
// --catalog`: jobguard_lock_class_ttl_seconds{class} and
// jobguard_lock_class_max_hold_seconds{class} (the time a holder is allowed:
// the ttl, or the hard_timeout of a renewing class — what lint_hold_times
// compares the p99 with). The hold-time alert divides the fleet's p99 by it.
std::string catalog_to_prometheus(const Catalog& catalog);

// The one-page description of a catalog.
std::string render_markdown(const Catalog& catalog);
std::string render_html(const Catalog& catalog);

}  // namespace jobguard::job
