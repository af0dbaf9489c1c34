// The CLI is a thin layer: each subcommand lives in its own cmd_*.cpp, parses
// its flags with CLI11 and calls the library. main.cpp dispatches through one
// explicit table of them (kCommands), so --help order is the table's, not the
// link order.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "exit_status.hpp"
#include "jobguard/error.hpp"

namespace jobguard::redis {
class Client;
}

namespace jobguard::cli {


struct Globals {
  std::string redis_url;     // --redis, else $JOBGUARD_REDIS_URL, else redis://127.0.0.1:6379/0
  std::string postgres_url;  // --postgres, else $JOBGUARD_POSTGRES_URL
  // A URL the user gave, by flag or variable (not the default): what
  // switches on the optional Redis checks of `policy lint` and makes `demo`
  // use the user's servers instead of starting its own.
  bool redis_given = false, postgres_given = false;
  bool json = false;         // --json
  std::string log_format = "human";  // --log-format human|json
};

// A subcommand's body: runs after parsing, returns the exit status. Errors
// thrown as jobguard::Error are mapped to exit statuses by main.
using Action = std::function<int()>;

// Each subcommand with the action to run when it was parsed.
using Commands = std::vector<std::pair<CLI::App*, Action>>;

// One per cmd_<name>.cpp: adds the subcommand `<name>` to the root app and
// its action(s) to `out`. Called once at startup, in main.cpp's kCommands order.
// A new subcommand's file ends with
//   }  // namespace
//   void add_<name>(CLI::App& root, Globals& g, Commands& out) { add(root, g, out); }
// plus a declaration here and a line in kCommands.
void add_bench(CLI::App& root, Globals& g, Commands& out);
void add_demo(CLI::App& root, Globals& g, Commands& out);
void add_jobs(CLI::App& root, Globals& g, Commands& out);
void add_pg(CLI::App& root, Globals& g, Commands& out);
void add_run(CLI::App& root, Globals& g, Commands& out);
void add_serve(CLI::App& root, Globals& g, Commands& out);
void add_stats(CLI::App& root, Globals& g, Commands& out);
void add_locks(CLI::App& root, Globals& g, Commands& out);
void add_doctor(CLI::App& root, Globals& g, Commands& out);
void add_policy(CLI::App& root, Globals& g, Commands& out);
void add_server(CLI::App& root, Globals& g, Commands& out);
// `jobs work`, added to the `jobs` subcommand by add_jobs.
void add_jobs_work(CLI::App& jobs, Globals& g, Commands& out);

// `jobguard --version`: our version, the client libraries', the build type.
std::string version_text();

// The command line exactly as main() received it (argv[1..]), for a
// subcommand that must pass arguments on verbatim (`run -- CMD...`): CLI11
// rewrites a positional like "[a,b]" as a list.
const std::vector<std::string>& raw_args();

// CMD's words exactly as typed: everything after the first "--" that follows
// the subcommand words `path` in order ({"run"}, {"jobs", "work"}); nullopt
// when there is no "--" (CMD must follow it).
std::optional<std::vector<std::string>> cmd_after_dashes(std::initializer_list<std::string_view> path);

// A client for g.redis_url named `client_name`, checked with a PING within
// the connect deadline: an unreachable Redis is exit 69 before anything else
// happens ("cannot reach Redis at <url, password redacted>: ..."); a refused
// password or certificate keeps its own code (78), since no retry mends it.
std::unique_ptr<redis::Client> connect_redis(const Globals& g, const char* client_name);
// connect_redis's error for a failed first PING `e` to Redis at `where`
// (display URL), `then` appended ("; CMD not run").
Error connect_error(const Error& e, const std::string& where, std::string_view then);

// `body`, with a jobguard::Error it throws reported as one line
// "jobguard <name>: <what>" on stderr and mapped to its exit status.
Action reported(std::string name, Action body);

// --json for a subcommand whose output is not data (`run`: CMD's own; `policy
// doc`: a page): Error(invalid_argument) "--json: <why>" (exit 64) when it
// was given, so it is refused, never ignored.
void refuse_json(const Globals& g, std::string_view why);

// --key-prefix, the one spelling of the key prefix (default "jobguard") for
// every subcommand that reads or writes keys under it; `alias` (e.g.
// "--prefix") is accepted too but not shown, for scripts written before.
CLI::Option* add_key_prefix(CLI::App& sub, std::string& prefix, const std::string& what,
                            const std::string& alias = {});

// CLI11 validator for durations ("250ms", "30s"): the error names the option.
CLI::Validator duration_validator();

}  // namespace jobguard::cli
