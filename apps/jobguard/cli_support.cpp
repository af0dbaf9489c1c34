// Helpers more than one subcommand needs (cli.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <iostream>

#include "cli.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::cli {

std::optional<std::vector<std::string>> cmd_after_dashes(std::initializer_list<std::string_view> path) {
  const auto& argv = raw_args();
  auto at = argv.begin();
  for (auto word : path) {
    at = std::find(at, argv.end(), word);
    if (at == argv.end()) return std::nullopt;
  }
  auto dashes = std::find(at, argv.end(), "--");
  if (dashes == argv.end()) return std::nullopt;
  return std::vector<std::string>(dashes + 1, argv.end());
}

std::unique_ptr<redis::Client> connect_redis(const Globals& g, const char* client_name) {
  auto conn = redis::parse_url(g.redis_url);
  if (conn.client_name.empty()) conn.client_name = client_name;
  auto client = std::make_unique<redis::Client>(conn);
  try {
    client->exec(redis::Command{"PING"}, redis::CallOptions{conn.connect_timeout});
  } catch (const Error& e) {
    throw connect_error(e, redis::to_display_url(conn), "");
  }
  return client;
}

Error connect_error(const Error& e, const std::string& where, std::string_view then) {
  // Only what a later try may mend is "unavailable": a rejected password or
  // certificate, or an ACL that forbids PING, keeps its code and its status.
  if (e.next() == next_step::retry_call)
    return Error(errc::redis_unavailable, fmt::format("cannot reach Redis at {}: {}{}", where, e.what(), then),
                 error_source::redis);
  return Error(e.code(), fmt::format("cannot use Redis at {}: {}{}", where, e.detail(), then), error_source::redis);
}

void refuse_json(const Globals& g, std::string_view why) {
  if (g.json) throw Error(errc::invalid_argument, fmt::format("--json: {}", why));
}

CLI::Option* add_key_prefix(CLI::App& sub, std::string& prefix, const std::string& what, const std::string& alias) {
  auto* opt = sub.add_option("--key-prefix", prefix, what)->capture_default_str();
  // Hidden (an empty group): kept working, no longer taught.
  if (!alias.empty()) sub.add_option(alias, prefix, what + " (old spelling of --key-prefix)")->group("");
  return opt;
}

Action reported(std::string name, Action body) {
  return [name = std::move(name), body = std::move(body)]() -> int {
    try {
      return body();
    } catch (const Error& e) {
      std::cerr << "jobguard " << name << ": " << e.what() << "\n";
      return exit_status_for(e);
    }
  };
}

}  // namespace jobguard::cli
