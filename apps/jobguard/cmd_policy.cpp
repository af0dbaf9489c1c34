// `jobguard policy`: the lock catalog. `lint` refuses a catalog with a class
// missing a field or breaking the decision matrix (and, given --redis, a TTL
// that the fleet's observed hold times contradict); `doc` renders it as one
// page. A thin layer over jobguard/job/catalog.hpp.
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.hpp"
#include "jobguard/error.hpp"
#include "jobguard/job/catalog.hpp"
#include "jobguard/observe/fleet.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::cli {
namespace {

constexpr const char* kPolicyHelp = R"(The lock catalog: a YAML file declaring every lock class (docs/operations.md).

  jobguard policy lint FILE [--window 60m] [--key-prefix jobguard]
                                        check every class; with --redis (or
                                        $JOBGUARD_REDIS_URL) also
                                        refuse a TTL above the URL's max_ttl
                                        and compare each TTL with the fleet's
                                        observed p99 hold time over the window
                                        (classes with under 20 holds: skipped)
  jobguard policy doc FILE [--format md|html] [-o OUT]

lint prints one line per finding, FILE:LINE: error|warning: class 'NAME': WHAT.
Errors: a missing or unknown field, a malformed value, a duplicate name, a
declaration that breaks the decision matrix, a TTL (hard timeout for renewing
classes) under 1.25x the observed p99 hold time. Warning: a TTL over 20x it.

Exit status: 0 no errors (warnings may be printed); 65 at least one error or an
unreadable FILE; 69 --redis (or $JOBGUARD_REDIS_URL) given and Redis unavailable;
64 doc --json.)";

struct PolicyArgs {
  std::string file;
  std::string window = "60m";
  std::string format = "md";
  std::string output;
  std::string key_prefix = "jobguard";
};

std::string read_whole(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(errc::invalid_argument, fmt::format("{}: cannot read the file", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Each class's p99 hold time as the fleet published it (observe::FleetReader)
// over the window.
std::vector<job::ObservedHold> observed_hold_times(const Globals& g, const PolicyArgs& a,
                                                  std::chrono::minutes window) {
  const auto client = connect_redis(g, "jobguard-policy");
  observe::FleetReaderOptions ro;
  ro.prefix = a.key_prefix;
  const auto snap = observe::FleetReader(*client, ro).read(window);
  std::vector<job::ObservedHold> out;
  for (const auto& c : snap.classes)
    if (auto p99 = c.hold_quantile_seconds(0.99)) out.push_back({c.lock_class, *p99, c.counts.hold_count()});
  return out;
}

int run_lint(const Globals& g, const PolicyArgs& a) {
  // A bad --window is a usage error even when the file is bad too.
  const auto window = observe::parse_window(a.window);
  observe::FleetKeys check(a.key_prefix);  // validates --key-prefix before anything is read
  std::string text;
  try {
    text = read_whole(a.file);
  } catch (const Error& e) {
    std::cerr << "jobguard policy lint: " << e.what() << "\n";
    return exit_code::data;
  }
  std::vector<job::CatalogFinding> findings;
  const auto catalog = job::Catalog::check(text, a.file, findings);
  if (g.redis_given) {
    auto more = job::lint_max_ttl(catalog, redis::parse_url(g.redis_url).lock_max_ttl);
    findings.insert(findings.end(), more.begin(), more.end());
    more = job::lint_hold_times(catalog, observed_hold_times(g, a, window));
    findings.insert(findings.end(), more.begin(), more.end());
  }
  std::size_t errors = 0;
  for (const auto& f : findings) errors += f.severity == job::CatalogFinding::Severity::error;
  if (g.json) {
    auto arr = nlohmann::ordered_json::array();
    for (const auto& f : findings)
      arr.push_back({{"file", f.file}, {"line", f.line}, {"class", f.cls},
                     {"severity", f.severity == job::CatalogFinding::Severity::error ? "error" : "warning"},
                     {"message", f.message}});
    std::cout << nlohmann::ordered_json{{"classes", catalog.classes().size()}, {"errors", errors}, {"findings", arr}}
                     .dump()
              << "\n";
  } else {
    for (const auto& f : findings) std::cout << f.to_string() << "\n";
    if (errors == 0)
      std::cout << fmt::format("{}: {} class{} OK{}\n", a.file, catalog.classes().size(),
                               catalog.classes().size() == 1 ? "" : "es",
                               findings.empty() ? "" : fmt::format(" ({} warning{})", findings.size(),
                                                                   findings.size() == 1 ? "" : "s"));
  }
  return errors > 0 ? exit_code::data : exit_code::ok;
}

int run_doc(const Globals& g, const PolicyArgs& a) {
  refuse_json(g, "doc renders the catalog as Markdown or HTML (--format); `policy lint --json` gives its findings "
                 "as JSON");
  job::Catalog catalog;
  try {
    catalog = job::Catalog::load(a.file);
  } catch (const Error& e) {
    std::cerr << "jobguard policy doc: " << e.what() << " (run `jobguard policy lint` for every finding)\n";
    return exit_code::data;
  }
  const auto page = a.format == "html" ? job::render_html(catalog) : job::render_markdown(catalog);
  if (a.output.empty()) {
    std::cout << page;
  } else {
    std::ofstream out(a.output);
    if (!out) throw Error(errc::invalid_argument, fmt::format("-o {}: cannot write the file", a.output));
    out << page;
  }
  return exit_code::ok;
}

}  // namespace

void add_policy(CLI::App& root, Globals& g, Commands& out) {
  auto a = std::make_shared<PolicyArgs>();
  auto* policy = root.add_subcommand("policy", "The lock catalog: lint, doc");
  policy->footer(exit_status_help(kPolicyHelp));
  policy->require_subcommand(1);
  policy->fallthrough();

  auto* lint = policy->add_subcommand("lint", "Check a lock catalog (exit 65 on errors)");
  lint->fallthrough();
  lint->footer(exit_status_help("Exit status: 0 no errors (warnings may be printed); 65 at least one error or an unreadable FILE;\n"
                                "69 --redis (or $JOBGUARD_REDIS_URL) given and Redis unavailable."));
  lint->add_option("FILE", a->file, "Catalog YAML")->required();
  lint->add_option("--window", a->window, "With --redis: the fleet window the p99 is taken over (1m, 5m, 15m, 60m)")
      ->capture_default_str();
  add_key_prefix(*lint, a->key_prefix, "With --redis: key prefix the processes publish their numbers under");
  out.emplace_back(lint, [&g, a] { return run_lint(g, *a); });

  auto* doc = policy->add_subcommand("doc", "Render a lock catalog as one page");
  doc->fallthrough();
  doc->footer(exit_status_help("Exit status: 0 rendered; 65 an unreadable or invalid FILE; 64 --json (doc has no "
                               "JSON form)."));
  doc->add_option("FILE", a->file, "Catalog YAML")->required();
  doc->add_option("--format", a->format, "md or html")->check(CLI::IsMember({"md", "html"}))->capture_default_str();
  doc->add_option("-o,--output", a->output, "Write to OUT instead of stdout");
  out.emplace_back(doc, [&g, a] { return run_doc(g, *a); });
}

}  // namespace jobguard::cli
