// SCAN over every primary, for the admin listings (admin.cpp,
// admin_semaphore.cpp, rwlock.cpp).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "jobguard/admin.hpp"
#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"
#include "lock/inspect_internal.hpp"

namespace jobguard::detail {
// Every key that matches `match`, on every primary (SCAN sees only the node it
// runs on): one visit per node, in the order primaries() gives.
template <class Batch>
void scan_everywhere(redis::Client& client, const std::string& match, std::size_t count_hint, std::uint64_t* calls,
                     Batch&& batch) {
  const std::string count = std::to_string(count_hint);
  const auto nodes = client.options().cluster ? client.primaries() : std::vector<std::string>{""};
  for (const auto& node : nodes) {
    std::string cursor = "0";
    do {
      auto r = client.exec(redis::Command{"SCAN", cursor, "MATCH", match, "COUNT", count}, {.node = node});
      if (calls) ++*calls;
      if (!r.is_array() || r.elements.size() != 2 || !r.elements[1].is_array())
        throw Error(errc::protocol_error, fmt::format("SCAN on {}: unexpected reply {}",
                                                      node.empty() ? client.address() : node,
                                                      redis::to_debug_string(r)));
      cursor = r.elements[0].str;
      if (!batch(r.elements[1].elements)) return;
    } while (cursor != "0");
  }
}

// Each resource with a key "<head><resource>}" for one of `heads` (a
// primitive's key kinds, "<prefix>:sem:{"), of opts.prefix and accepted by
// opts.filter, once, until `each(resource)` returns false.
template <class Each>
void scan_resources(redis::Client& client, const std::vector<std::string>& heads, const admin::ListOptions& opts,
                    Each&& each) {
  if (opts.scan_count == 0) throw Error(errc::invalid_argument, "scan_count must be >= 1");
  std::set<std::string> seen;  // SCAN may return a key twice (rehashing), and a resource has a key per kind
  bool more = true;
  for (const auto& head : heads) {
    if (!more) return;
    scan_everywhere(client, glob_escape(head + opts.prefix) + "*}", opts.scan_count, nullptr,
                    [&](const std::vector<redis::Reply>& found) {
                      for (const auto& k : found) {
                        const std::string_view key = k.str;
                        if (key.size() <= head.size() + 1 || key.substr(0, head.size()) != head || key.back() != '}')
                          continue;
                        std::string resource(key.substr(head.size(), key.size() - head.size() - 1));
                        if (opts.filter && !opts.filter(resource)) continue;
                        if (!seen.insert(resource).second) continue;
                        if (!each(resource)) return more = false;
                      }
                      return true;
                    });
  }
}
}  // namespace jobguard::detail
