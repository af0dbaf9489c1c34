#include "jobguard/job/catalog.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "jobguard/observe/exposition.hpp"

namespace jobguard::job {
namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

constexpr const char* kFields[] = {"name", "key", "owner", "protects", "consequence", "ttl",
                                   "renewal", "hard_timeout", "fencing", "on_redis_down", "fallback"};

// Optional: a class without them is a plain lock.
constexpr const char* kOptionalFields[] = {"permits", "mode"};

int line_of(const YAML::Node& n) { return n.Mark().line >= 0 ? n.Mark().line + 1 : 0; }

struct Collector {
  const std::string& file;
  std::vector<CatalogFinding>& out;
  void error(int line, const std::string& cls, std::string msg) {
    out.push_back({CatalogFinding::Severity::error, file, line, cls, std::move(msg)});
  }
};

std::optional<std::string> scalar(const YAML::Node& n) {
  if (!n || !n.IsScalar()) return std::nullopt;
  return n.Scalar();
}

std::optional<bool> boolean(const YAML::Node& n) {
  auto s = scalar(n);
  if (!s) return std::nullopt;
  if (*s == "true" || *s == "yes" || *s == "on") return true;
  if (*s == "false" || *s == "no" || *s == "off") return false;
  return std::nullopt;
}

// The fields of one class entry as they are read: each reader records a
// finding for a value it cannot take and leaves the class's default.
struct EntryFields {
  const YAML::Node& node;
  const std::string& label;
  Collector& c;
  std::set<std::string> present{};

  // Unknown fields and missing ones, as findings; `present` filled.
  void check(int line) {
    for (const auto& kv : node) {
      const auto k = kv.first.Scalar();
      if (std::find(std::begin(kFields), std::end(kFields), k) == std::end(kFields) &&
          std::find(std::begin(kOptionalFields), std::end(kOptionalFields), k) == std::end(kOptionalFields))
        c.error(line_of(kv.first), label,
                fmt::format("unknown field '{}' (fields: name, key, owner, protects, consequence, ttl, renewal, "
                            "hard_timeout, fencing, on_redis_down, fallback; optional: permits, mode)", k));
      present.insert(k);
    }
    for (const char* f : kFields)
      if (!present.count(f)) c.error(line, label, fmt::format("missing field '{}'", f));
  }

  void text(const char* field, std::string& into) {
    if (!present.count(field)) return;
    auto v = scalar(node[field]);
    if (!v || v->empty()) c.error(line_of(node[field]), label, fmt::format("'{}' must be a non-empty string", field));
    else into = *v;
  }

  // A value `parse` names; `expected` lists the names it takes.
  template <class T, class Parse>
  void choice(const char* field, Parse parse, std::string_view expected, T& into) {
    if (!present.count(field)) return;
    auto v = scalar(node[field]);
    auto parsed = v ? parse(*v) : std::nullopt;
    if (!parsed)
      c.error(line_of(node[field]), label, fmt::format("{} \"{}\": expected {}", field, v.value_or(""), expected));
    else into = *parsed;
  }

  void flag(const char* field, bool& into) {
    if (!present.count(field)) return;
    auto v = boolean(node[field]);
    if (!v) c.error(line_of(node[field]), label, fmt::format("'{}' must be true or false", field));
    else into = *v;
  }

  void duration(const char* field, milliseconds& into, bool none_ok) {
    if (!present.count(field)) return;
    auto v = scalar(node[field]);
    if (v && none_ok && (*v == "none" || *v == "0")) {
      into = milliseconds(0);
      return;
    }
    try {
      if (!v) throw Error(errc::invalid_argument, "not a scalar");
      into = duration_cast<milliseconds>(parse_duration(*v, field));
    } catch (const Error& e) {
      c.error(line_of(node[field]), label, e.what());
    }
  }

  // The optional `permits: N` (a semaphore) and `mode: shared|exclusive` (a
  // read-write lock): what a unit's lock excludes. Their contradictions with
  // each other and with the decision matrix are LockClass::validate()'s.
  void exclusion(LockClass& lc) {
    auto permits = [](std::string_view v) -> std::optional<int> {
      int n = 0;
      const auto [at, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc() || at != v.data() + v.size() || n < 1 || n > LockOptions::kMaxPermits) return std::nullopt;
      return n;
    };
    auto mode = [](std::string_view v) -> std::optional<LockMode> {
      if (v == "shared") return LockMode::shared;
      if (v == "exclusive") return LockMode::exclusive;
      return std::nullopt;
    };
    choice("permits", permits, fmt::format("a whole number in 1..{} (omit it for a lock)", LockOptions::kMaxPermits),
           lc.permits);
    choice("mode", mode, "shared or exclusive (omit it for a lock)", lc.mode);
  }
};

// The decision matrix a class that read cleanly must also pass: a finding
// when it does not.
bool matrix_allows(const LockClass& lc, int line, const std::string& label, Collector& c) {
  // LockClass::validate() is the one place the matrix lives.
  try {
    lc.validate();
  } catch (const Error& e) {
    std::string msg = e.what();
    const std::string head = fmt::format("lock class '{}': ", lc.name);
    if (msg.rfind(head, 0) == 0) msg.erase(0, head.size());
    c.error(line, label, msg);
    return false;
  }
  // "high: PostgreSQL advisory lock + completion record + fencing".
  if (lc.consequence == Consequence::high && !lc.fenced) {
    c.error(line, label, "consequence high needs fencing: true (decision matrix: a high class is fenced)");
    return false;
  }
  return true;
}

// One class entry: every finding it has, and the class when it has none.
std::optional<CatalogClass> read_class(const YAML::Node& node, std::size_t index, Collector& c) {
  const int line = line_of(node);
  if (!node.IsMap()) {
    c.error(line, "", fmt::format("classes[{}] is not a mapping of fields", index));
    return std::nullopt;
  }
  std::string name = scalar(node["name"]).value_or("");
  const std::string label = name.empty() ? fmt::format("#{}", index + 1) : name;
  const std::size_t before = c.out.size();
  EntryFields fields{node, label, c};
  fields.check(line);

  CatalogClass cc;
  cc.line = line;
  LockClass& lc = cc.lock_class;
  lc.name = name;
  fields.text("key", lc.key_pattern);
  fields.text("owner", lc.owner);
  fields.text("protects", lc.protects);
  fields.text("fallback", cc.fallback);
  fields.choice("consequence", parse_consequence, "low, moderate or high", lc.consequence);
  fields.choice("on_redis_down", parse_redis_down_policy, "fail-closed or fail-open", lc.on_redis_down);
  fields.flag("renewal", lc.long_running);
  fields.flag("fencing", lc.fenced);
  fields.duration("ttl", lc.ttl, false);
  fields.duration("hard_timeout", lc.hard_timeout, true);
  fields.exclusion(lc);
  if (c.out.size() != before || !matrix_allows(lc, line, label, c)) return std::nullopt;
  return cc;
}

std::string html_escape(std::string_view s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += ch;
    }
  }
  return o;
}

// Markdown table cells: a '|' or a newline would end the cell or the row.
std::string md_cell(std::string_view s) {
  std::string o;
  for (char ch : s) {
    if (ch == '|') o += "\\|";
    else if (ch == '\n' || ch == '\r') o += ' ';
    else o += ch;
  }
  return o;
}

// As people write them in the catalog: "2h", "5m", "30s", "250ms".
std::string fmt_ms(milliseconds d) {
  const auto n = d.count();
  if (n > 0 && n % 3600000 == 0) return fmt::format("{}h", n / 3600000);
  if (n > 0 && n % 60000 == 0) return fmt::format("{}m", n / 60000);
  return format_duration(d);
}

std::string guards_of(const LockClass& lc) {
  switch (lc.consequence) {
    case Consequence::low: return "Redis lock with TTL";
    case Consequence::moderate: return "Redis lock + idempotency key";
    case Consequence::high: return "PostgreSQL advisory lock + completion record + fencing";
  }
  return "";
}

// The key kind of a unit's lock: KeyBuilder's holders key of each primitive.
const char* redis_kind(const LockClass& lc) {
  if (lc.permits > 0) return "sem";
  if (lc.mode == LockMode::shared) return "rwr";
  if (lc.mode == LockMode::exclusive) return "rww";
  return "lock";
}

std::string holders_of(const LockClass& lc) {
  if (lc.permits > 0) return fmt::format("at most {} at once (a counting semaphore, docs/semaphore.md)", lc.permits);
  if (lc.mode == LockMode::shared)
    return "readers together, never beside the resource's writer (a read-write lock, docs/rwlock.md)";
  return "the writer alone: no reader, no other writer (a read-write lock, docs/rwlock.md)";
}

// Observed quantiles are estimates: a millisecond is precision enough.
std::chrono::nanoseconds round_ms(std::chrono::nanoseconds d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::round<milliseconds>(d));
}

}  // namespace

std::string CatalogFinding::to_string() const {
  std::string s = file;
  if (line > 0) s += fmt::format(":{}", line);
  s += severity == Severity::error ? ": error: " : ": warning: ";
  if (!cls.empty()) s += fmt::format("class '{}': ", cls);
  s += message;
  return s;
}

Catalog Catalog::check(std::string_view yaml, const std::string& source, std::vector<CatalogFinding>& findings) {
  Catalog cat;
  cat.source_ = source;
  Collector c{source, findings};
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    c.error(e.mark.line >= 0 ? e.mark.line + 1 : 0, "", fmt::format("not valid YAML: {}", e.msg));
    return cat;
  }
  if (!root.IsMap() || !root["classes"]) {
    c.error(root ? line_of(root) : 0, "", "expected a mapping with a 'classes' list");
    return cat;
  }
  for (const auto& kv : root)
    if (kv.first.Scalar() != "classes")
      c.error(line_of(kv.first), "", fmt::format("unknown top-level field '{}' (expected only 'classes')",
                                                 kv.first.Scalar()));
  const auto classes = root["classes"];
  if (!classes.IsSequence()) {
    c.error(line_of(classes), "", "'classes' must be a list");
    return cat;
  }
  std::map<std::string, int> seen;
  for (std::size_t i = 0; i < classes.size(); ++i) {
    auto cc = read_class(classes[i], i, c);
    if (!cc) continue;
    const auto& name = cc->lock_class.name;
    if (auto it = seen.find(name); it != seen.end()) {
      c.error(cc->line, name, fmt::format("duplicate class name (first declared on line {})", it->second));
      continue;
    }
    seen.emplace(name, cc->line);
    cat.classes_.push_back(std::move(*cc));
  }
  return cat;
}

Catalog Catalog::parse(std::string_view yaml, const std::string& source) {
  std::vector<CatalogFinding> findings;
  auto cat = check(yaml, source, findings);
  for (const auto& f : findings)
    if (f.severity == CatalogFinding::Severity::error) throw Error(errc::invalid_argument, f.to_string());
  return cat;
}

Catalog Catalog::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(errc::invalid_argument, fmt::format("lock catalog {}: cannot read the file", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

const CatalogClass* Catalog::find(std::string_view name) const noexcept {
  for (const auto& c : classes_)
    if (c.lock_class.name == name) return &c;
  return nullptr;
}

const LockClass& Catalog::get(std::string_view name) const {
  if (const auto* c = find(name)) return c->lock_class;
  std::string names;
  for (const auto& c : classes_) names += (names.empty() ? "" : ", ") + c.lock_class.name;
  throw Error(errc::invalid_argument,
              fmt::format("lock catalog {}: no class '{}' (it has: {})", source_, name, names.empty() ? "none" : names));
}

bool key_pattern_matches(std::string_view pattern, std::string_view resource) noexcept {
  const auto at = pattern.find("{id}");
  if (at == std::string_view::npos) return pattern == resource;
  const auto head = pattern.substr(0, at), tail = pattern.substr(at + 4);
  return resource.size() > head.size() + tail.size() && resource.substr(0, head.size()) == head &&
         resource.substr(resource.size() - tail.size()) == tail;
}

const CatalogClass* Catalog::match(std::string_view resource) const noexcept {
  for (const auto& c : classes_)
    if (key_pattern_matches(c.lock_class.key_pattern, resource)) return &c;
  return nullptr;
}

std::vector<CatalogFinding> lint_hold_times(const Catalog& catalog, const std::vector<ObservedHold>& observed,
                                            const HoldLintOptions& opts) {
  std::vector<CatalogFinding> out;
  for (const auto& cc : catalog.classes()) {
    const auto& lc = cc.lock_class;
    auto it = std::find_if(observed.begin(), observed.end(), [&](const ObservedHold& o) { return o.cls == lc.name; });
    if (it == observed.end() || it->samples < opts.min_samples || it->p99_seconds <= 0) continue;
    // A plain lock must be done within its TTL; a renewing lease within its
    // hard timeout: that is the time a holder is allowed.
    const milliseconds allowed = lc.long_running ? lc.hard_timeout : lc.ttl;
    const char* what = lc.long_running ? "hard_timeout" : "ttl";
    const double allowed_s = std::chrono::duration<double>(allowed).count();
    const auto p99 = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(it->p99_seconds));
    if (it->p99_seconds >= opts.too_close * allowed_s) {
      out.push_back({CatalogFinding::Severity::error, catalog.source(), cc.line, lc.name,
                     fmt::format("{} {} is too close to the observed p99 hold time {} ({} samples): "
                                 "holders will outlive their lock; raise it or make the class renew",
                                 what, fmt_ms(allowed), format_duration(round_ms(p99)), it->samples)});
    } else if (allowed_s > opts.far_too_long * it->p99_seconds) {
      out.push_back({CatalogFinding::Severity::warning, catalog.source(), cc.line, lc.name,
                     fmt::format("{} {} is over {}x the observed p99 hold time {} ({} samples): a crashed "
                                 "holder keeps the resource locked that much longer than needed",
                                 what, fmt_ms(allowed), opts.far_too_long, format_duration(round_ms(p99)),
                                 it->samples)});
    }
  }
  return out;
}

std::string catalog_to_prometheus(const Catalog& catalog) {
  std::string out;
  auto family = [&](const char* name, const char* help, auto value_of) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n", name, observe::escape_help(help), name);
    for (const auto& cc : catalog.classes())
      out += fmt::format("{}{{class=\"{}\"}} {}\n", name, observe::escape_label_value(cc.lock_class.name),
                         observe::format_value(std::chrono::duration<double>(value_of(cc.lock_class)).count()));
  };
  family("jobguard_lock_class_ttl_seconds", "The lock TTL the lock catalog declares for the class.",
         [](const LockClass& lc) { return lc.ttl; });
  // As lint_hold_times: a plain lock must be done within its TTL, a renewing
  // lease within its hard timeout.
  family("jobguard_lock_class_max_hold_seconds",
         "The time a holder of the class is allowed: its TTL, or the hard timeout of a renewing class.",
         [](const LockClass& lc) { return lc.long_running ? lc.hard_timeout : lc.ttl; });
  return out;
}

std::vector<CatalogFinding> lint_max_ttl(const Catalog& catalog, milliseconds max_ttl) {
  std::vector<CatalogFinding> out;
  for (const auto& cc : catalog.classes()) {
    if (cc.lock_class.ttl <= max_ttl) continue;
    out.push_back({CatalogFinding::Severity::error, catalog.source(), cc.line, cc.lock_class.name,
                   fmt::format("ttl {} is above the lock Redis's max TTL {} (URL option max_ttl): every acquire is "
                               "refused; lower the ttl (renew instead) or raise max_ttl on every client's URL",
                               fmt_ms(cc.lock_class.ttl), fmt_ms(max_ttl))});
  }
  return out;
}

std::string render_markdown(const Catalog& catalog) {
  std::string o = fmt::format("# Lock catalog\n\nGenerated by `jobguard policy doc` from `{}`: {} lock class{}.\n\n",
                              catalog.source(), catalog.classes().size(), catalog.classes().size() == 1 ? "" : "es");
  o += "| class | key | consequence | ttl | renewal | hard timeout | fencing | Redis down | owner |\n";
  o += "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& cc : catalog.classes()) {
    const auto& lc = cc.lock_class;
    o += fmt::format("| {} | `{}` | {} | {} | {} | {} | {} | {} | {} |\n", md_cell(lc.name), md_cell(lc.key_pattern),
                     to_string(lc.consequence), fmt_ms(lc.ttl), lc.long_running ? "lease" : "no",
                     lc.long_running ? fmt_ms(lc.hard_timeout) : "-", lc.fenced ? "yes" : "no",
                     to_string(lc.on_redis_down), md_cell(lc.owner));
  }
  for (const auto& cc : catalog.classes()) {
    const auto& lc = cc.lock_class;
    o += fmt::format("\n## {}\n\n", lc.name);
    o += fmt::format("- **Protects:** {}\n", lc.protects);
    o += fmt::format("- **Owner:** {}\n", lc.owner);
    o += fmt::format("- **Key:** `{}` (Redis key `<prefix>:{}:{{{}}}`)\n", lc.key_pattern, redis_kind(lc), lc.key_pattern);
    if (lc.permits > 0 || lc.mode != LockMode::mutex) o += fmt::format("- **Holders:** {}\n", holders_of(lc));
    o += fmt::format("- **Consequence:** {} — guards: {}\n", to_string(lc.consequence), guards_of(lc));
    if (lc.long_running)
      o += fmt::format("- **TTL:** {}, renewed every ttl/3 while the job runs; hard timeout {}\n", fmt_ms(lc.ttl),
                       fmt_ms(lc.hard_timeout));
    else
      o += fmt::format("- **TTL:** {}; the job must finish within it (no renewal)\n", fmt_ms(lc.ttl));
    o += fmt::format("- **Fencing:** {}\n", lc.fenced ? "every grant carries a fencing token" : "no");
    o += fmt::format("- **When Redis is down:** {}\n", lc.on_redis_down == RedisDownPolicy::fail_closed
                                                           ? "fail-closed: the job does not run"
                                                           : "fail-open: the job runs unguarded (logged, counted)");
    o += fmt::format("- **Fallback:** {}\n", cc.fallback);
  }
  return o;
}

std::string render_html(const Catalog& catalog) {
  std::string o =
      "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Lock catalog</title>\n"
      "<style>body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse}"
      "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}code{background:#f4f4f4}</style>"
      "</head><body>\n";
  o += fmt::format("<h1>Lock catalog</h1>\n<p>Generated by <code>jobguard policy doc</code> from <code>{}</code>: "
                   "{} lock class{}.</p>\n",
                   html_escape(catalog.source()), catalog.classes().size(), catalog.classes().size() == 1 ? "" : "es");
  o += "<table><thead><tr><th>class</th><th>key</th><th>consequence</th><th>ttl</th><th>renewal</th>"
       "<th>hard timeout</th><th>fencing</th><th>Redis down</th><th>owner</th></tr></thead><tbody>\n";
  for (const auto& cc : catalog.classes()) {
    const auto& lc = cc.lock_class;
    o += fmt::format(
        "<tr><td><a href=\"#{0}\">{0}</a></td><td><code>{1}</code></td><td>{2}</td><td>{3}</td><td>{4}</td>"
        "<td>{5}</td><td>{6}</td><td>{7}</td><td>{8}</td></tr>\n",
        html_escape(lc.name), html_escape(lc.key_pattern), to_string(lc.consequence), fmt_ms(lc.ttl),
        lc.long_running ? "lease" : "no", lc.long_running ? fmt_ms(lc.hard_timeout) : "-", lc.fenced ? "yes" : "no",
        to_string(lc.on_redis_down), html_escape(lc.owner));
  }
  o += "</tbody></table>\n";
  for (const auto& cc : catalog.classes()) {
    const auto& lc = cc.lock_class;
    o += fmt::format("<h2 id=\"{0}\">{0}</h2>\n<dl>\n", html_escape(lc.name));
    auto row = [&](const char* k, const std::string& v) { o += fmt::format("<dt>{}</dt><dd>{}</dd>\n", k, v); };
    row("Protects", html_escape(lc.protects));
    row("Owner", html_escape(lc.owner));
    row("Key", "<code>" + html_escape(lc.key_pattern) + "</code>");
    if (lc.permits > 0 || lc.mode != LockMode::mutex) row("Holders", holders_of(lc));
    row("Consequence", fmt::format("{} — guards: {}", to_string(lc.consequence), guards_of(lc)));
    row("TTL", lc.long_running ? fmt::format("{}, renewed every ttl/3; hard timeout {}", fmt_ms(lc.ttl),
                                             fmt_ms(lc.hard_timeout))
                               : fmt::format("{}; the job must finish within it", fmt_ms(lc.ttl)));
    row("Fencing", lc.fenced ? "every grant carries a fencing token" : "no");
    row("When Redis is down", to_string(lc.on_redis_down));
    row("Fallback", html_escape(cc.fallback));
    o += "</dl>\n";
  }
  o += "</body></html>\n";
  return o;
}

}  // namespace jobguard::job
