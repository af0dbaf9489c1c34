// SCAN over every primary, for the admin listings (admin.cpp,
// admin_semaphore.cpp).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"

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
}  // namespace jobguard::detail
