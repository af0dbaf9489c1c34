#include "jobguard/job/unique.hpp"

#include <fmt/format.h>

#include "jobguard/error.hpp"

namespace jobguard::job {

std::string_view to_string(UniqueStrategy s) noexcept {
  switch (s) {
    case UniqueStrategy::until_executed: return "until-executed";
    case UniqueStrategy::until_and_while_executing: return "until-and-while-executing";
    case UniqueStrategy::until_expired: return "until-expired";
    case UniqueStrategy::while_executing: return "while-executing";
  }
  return "?";
}

std::optional<UniqueStrategy> parse_unique_strategy(std::string_view s) noexcept {
  for (auto v : {UniqueStrategy::until_executed, UniqueStrategy::until_and_while_executing,
                 UniqueStrategy::until_expired, UniqueStrategy::while_executing})
    if (to_string(v) == s) return v;
  return std::nullopt;
}

std::string_view to_string(UniqueConflict c) noexcept {
  switch (c) {
    case UniqueConflict::reject: return "reject";
    case UniqueConflict::replace: return "replace";
    case UniqueConflict::log: return "log";
  }
  return "?";
}

std::optional<UniqueConflict> parse_unique_conflict(std::string_view s) noexcept {
  for (auto v : {UniqueConflict::reject, UniqueConflict::replace, UniqueConflict::log})
    if (to_string(v) == s) return v;
  return std::nullopt;
}

void validate(const UniqueOptions& o) {
  const auto name = to_string(o.strategy);
  if (o.unique_for.count() < 0) throw Error(errc::invalid_argument, "unique: unique_for must not be negative");
  if (o.strategy == UniqueStrategy::until_expired && o.unique_for.count() == 0)
    throw Error(errc::invalid_argument, "unique: until-expired needs unique_for (how long the job stays unique)");
  if (o.strategy == UniqueStrategy::while_executing) {
    if (o.unique_for.count() > 0)
      throw Error(errc::invalid_argument,
                  "unique: while-executing takes no unique_for (its lock is the run's lease, with the class's TTL)");
    if (!o.by.empty())
      throw Error(errc::invalid_argument, "unique: while-executing takes no fields to key by (its key is the unit)");
    if (o.on_conflict == UniqueConflict::replace)
      throw Error(errc::invalid_argument,
                  "unique: while-executing cannot replace (the job in the way is already running)");
  }
  for (const auto& f : o.by)
    if (f.empty()) throw Error(errc::invalid_argument, fmt::format("unique ({}): empty field name to key by", name));
}

namespace {
// Redis Cluster's rule: the slot is the hash of the text between the first
// '{' and the first '}' after it, when that text is not empty.
bool has_hash_tag(std::string_view key) {
  const auto open = key.find('{');
  if (open == std::string_view::npos) return false;
  const auto close = key.find('}', open + 1);
  return close != std::string_view::npos && close > open + 1;
}

std::string slot_prefix(std::string_view stream) {
  if (has_hash_tag(stream)) return std::string(stream);
  return fmt::format("{{{}}}", stream);
}
}  // namespace

std::string unique_lock_key(std::string_view stream, std::string_view value) {
  return fmt::format("{}:unique:{}", slot_prefix(stream), value);
}

std::string unique_registry_key(std::string_view stream) { return slot_prefix(stream) + ":unique"; }

}  // namespace jobguard::job
