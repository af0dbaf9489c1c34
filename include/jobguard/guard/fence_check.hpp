// FenceCheck: the downstream side of fencing for a service that keeps its own
// high-water mark in memory, per resource. A request carrying a token below
// the mark comes from a holder whose grant was superseded (paused past its
// TTL, partitioned): refuse it, it must restart its attempt.
//
// The mark lives only as long as this object: a process restart forgets it.
// Services that must survive restarts keep the mark where the data lives
// (PgTransaction::fenced_update / advance_fence).
//
// Threads: every member is safe to call from any thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "jobguard/guard/postgres.hpp"

namespace jobguard::guard {

class FenceCheck {
 public:
  explicit FenceCheck(FenceCompare compare = FenceCompare::same_or_newer) : compare_(compare) {}

  // True when `token` is acceptable for `resource` (same_or_newer: token >=
  // mark; newer_only: token > mark), and then raises the mark to it. False:
  // "stale fencing token"; the mark is unchanged.
  bool accept(std::string_view resource, std::int64_t token);
  // Like accept(), but throws Error(errc::stale_fence) naming the resource and both tokens.
  void require(std::string_view resource, std::int64_t token);

  std::optional<std::int64_t> high_water(std::string_view resource) const;
  std::uint64_t rejected() const;
  void forget(std::string_view resource);

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  FenceCompare compare_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::int64_t, Hash, std::equal_to<>> marks_;
  std::uint64_t rejected_ = 0;
};

}  // namespace jobguard::guard
