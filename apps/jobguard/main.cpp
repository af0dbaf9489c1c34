// jobguard: a thin dispatcher over the library. Subcommands live in cmd_*.cpp.
#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli.hpp"
#include "postgres.hpp"
#include "jobguard/duration.hpp"
#include "jobguard/error.hpp"
#include "jobguard/redis/options.hpp"
#include "jobguard/text.hpp"

namespace jobguard::cli {
namespace {

// Every subcommand, in --help order (as ninja's kTools). A new cmd_<name>.cpp
// adds its add_<name> to cli.hpp and one line here.
struct CommandEntry {
  const char* name;  // the subcommand add() creates; checked at startup
  void (*add)(CLI::App& root, Globals& g, Commands& out);
};
constexpr CommandEntry kCommands[] = {
    {"run", add_run},     {"jobs", add_jobs},   {"pg", add_pg},
    {"demo", add_demo},   {"bench", add_bench}, {"serve", add_serve},
    {"stats", add_stats}, {"locks", add_locks}, {"doctor", add_doctor},
    {"policy", add_policy}, {"server", add_server},
};

}  // namespace

std::vector<std::string>& raw_args_storage() {
  static std::vector<std::string> a;
  return a;
}
const std::vector<std::string>& raw_args() { return raw_args_storage(); }

CLI::Validator duration_validator() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          // Every option checked here is kept in milliseconds: refuse what
          // would round away ("500us" meant "none").
          jobguard::parse_duration_ms(s);
          return {};
        } catch (const jobguard::Error& e) {
          return e.what();
        }
      },
      "DURATION", "duration");
}

namespace {

// A password kept out of argv (visible in ps) and out of the URL: from a file
// or $JOBGUARD_REDIS_PASSWORD, put into the URL every subcommand parses.
void apply_redis_password(Globals& g, const std::string& file) {
  std::string password;
  std::string source;
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in)
      throw Error(errc::invalid_argument, fmt::format("--redis-password-file \"{}\": cannot open: {}",
                                                      escape_text(file), std::strerror(errno)));
    std::ostringstream buf;
    buf << in.rdbuf();
    password = buf.str();
    if (password.size() >= 1 && password.back() == '\n') password.pop_back();
    if (password.size() >= 1 && password.back() == '\r') password.pop_back();
    if (password.empty())
      throw Error(errc::invalid_argument, fmt::format("--redis-password-file \"{}\" is empty", escape_text(file)));
    if (password.find('\n') != std::string::npos)
      throw Error(errc::invalid_argument,
                  fmt::format("--redis-password-file \"{}\": more than one line (a password is one line)",
                              escape_text(file)));
    source = "--redis-password-file";
  } else if (const char* env = std::getenv("JOBGUARD_REDIS_PASSWORD"); env && *env) {
    password = env;
    source = "$JOBGUARD_REDIS_PASSWORD";
  } else {
    return;
  }
  try {
    g.redis_url = redis::with_password(g.redis_url, password);
  } catch (const Error& e) {
    throw Error(errc::invalid_argument, fmt::format("{}: {}", source, e.what()));
  }
}

// --redis, --redis-password-file and --postgres, their defaults from the
// environment.
struct UrlOptions {
  CLI::Option* redis = nullptr;
  CLI::Option* postgres = nullptr;
};
UrlOptions add_url_options(CLI::App& app, Globals& g, std::string& password_file) {
  if (const char* env = std::getenv("JOBGUARD_REDIS_URL"); env && *env) {
    g.redis_url = env;
    g.redis_given = true;
  } else {
    g.redis_url = "redis://127.0.0.1:6379/0";
  }
  if (const char* env = std::getenv("JOBGUARD_POSTGRES_URL"); env && *env) {
    g.postgres_url = env;
    g.postgres_given = true;
  }
  // The default shown by --help is redacted: $JOBGUARD_REDIS_URL often
  // carries a password, and help text ends up in terminals and bug reports.
  UrlOptions o;
  o.redis = app.add_option("--redis", g.redis_url, "Redis URL (redis:// or rediss://); default $JOBGUARD_REDIS_URL")
      ->default_str(jobguard::redact_url(g.redis_url));
  app.add_option("--redis-password-file", password_file,
                 "Read the Redis password from FILE (one trailing newline dropped) instead of the URL; "
                 "or set $JOBGUARD_REDIS_PASSWORD");
  o.postgres = app.add_option("--postgres", g.postgres_url,
                 pg::built_in() ? "PostgreSQL URL; default $JOBGUARD_POSTGRES_URL (keep its password in $PGPASSWORD "
                                  "or ~/.pgpass, which libpq reads)"
                                : "PostgreSQL URL; default $JOBGUARD_POSTGRES_URL. This build has no PostgreSQL: a "
                                  "command that would use it exits 78")
      ->default_str(jobguard::redact_url(g.postgres_url));
  return o;
}

// "locks ls" for `ls` under `locks`: the words the user typed to reach it.
std::string command_path(const CLI::App* sub) {
  std::string path = sub->get_name();
  for (const CLI::App* p = sub->get_parent(); p != nullptr && p->get_parent() != nullptr; p = p->get_parent())
    path = p->get_name() + " " + path;
  return path;
}

}  // namespace

}  // namespace jobguard::cli

int main(int argc, char** argv) {
  using namespace jobguard::cli;
  raw_args_storage().assign(argv + (argc > 0 ? 1 : 0), argv + argc);
  CLI::App app{"jobguard: guard the side effects of background jobs with Redis and PostgreSQL"};
  app.require_subcommand(1);
  app.footer(exit_status_help(
      "Exit status: CMD's own status when `run` ran it to the end; 0 ok; 65 bad input file;\n"
      "70 lease lost; 75 lock busy; 124 hard timeout (each subcommand's --help says which it uses)."));
  Globals g;
  std::string redis_password_file;
  const auto urls = add_url_options(app, g, redis_password_file);
  app.add_flag("--json", g.json, "Machine-readable JSON output");
  app.add_option("--log-format", g.log_format, "Log lines on stderr: human or json")
      ->check(CLI::IsMember({"human", "json"}));
  app.fallthrough();

  app.set_version_flag("--version", version_text, "Print the version, the client libraries' and the build type");

  Commands actions;
  for (const auto& c : kCommands) {
    c.add(app, g, actions);
    app.get_subcommand(c.name);  // throws if the table's name and the file's disagree
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, naming what is wrong; usage status as sysexits(3) EX_USAGE.
    // Every error line passes escape_controls: a control byte in an argument
    // or a server's text must not forge lines or drive the terminal.
    std::cerr << "jobguard: " << jobguard::escape_controls(e.what()) << "\n";
    return exit_code::usage;
  }
  g.redis_given = g.redis_given || urls.redis->count() > 0;
  g.postgres_given = g.postgres_given || urls.postgres->count() > 0;
  try {
    apply_redis_password(g, redis_password_file);
  } catch (const jobguard::Error& e) {
    std::cerr << "jobguard: " << jobguard::escape_controls(e.what()) << "\n";
    return exit_code::usage;
  }
  for (auto& [sub, action] : actions) {
    if (sub->parsed()) {
      const std::string name = command_path(sub);
      try {
        return action();
      } catch (const jobguard::Error& e) {
        std::cerr << "jobguard " << name << ": " << jobguard::escape_controls(e.what()) << "\n";
        return exit_status_for(e);
      } catch (const CLI::ParseError& e) {
        std::cerr << "jobguard " << name << ": " << jobguard::escape_controls(e.what()) << "\n";
        return exit_code::usage;
      } catch (const pg::NotBuiltIn& e) {
        std::cerr << "jobguard " << name << ": " << jobguard::escape_controls(e.what()) << "\n";
        return exit_code::config;
      } catch (const std::exception& e) {
        std::cerr << "jobguard " << name << ": " << jobguard::escape_controls(e.what()) << "\n";
        return exit_code::unavailable;
      }
    }
  }
  std::cerr << "jobguard: no subcommand given (see --help)\n";
  return exit_code::usage;
}
