#include "jobguard/guard/fence_check.hpp"

#include <fmt/format.h>

#include "jobguard/error.hpp"

namespace jobguard::guard {

bool FenceCheck::accept(std::string_view resource, std::int64_t token) {
  std::lock_guard lk(mu_);
  auto it = marks_.find(resource);
  if (it == marks_.end()) {
    marks_.emplace(std::string(resource), token);
    return true;
  }
  const bool ok = compare_ == FenceCompare::same_or_newer ? token >= it->second : token > it->second;
  if (!ok) {
    ++rejected_;
    return false;
  }
  it->second = token;
  return true;
}

void FenceCheck::require(std::string_view resource, std::int64_t token) {
  if (accept(resource, token)) return;
  throw Error(errc::stale_fence, fmt::format("resource \"{}\": token {} is older than {}", resource, token,
                                             high_water(resource).value_or(0)));
}

std::optional<std::int64_t> FenceCheck::high_water(std::string_view resource) const {
  std::lock_guard lk(mu_);
  auto it = marks_.find(resource);
  if (it == marks_.end()) return std::nullopt;
  return it->second;
}

std::uint64_t FenceCheck::rejected() const {
  std::lock_guard lk(mu_);
  return rejected_;
}

void FenceCheck::forget(std::string_view resource) {
  std::lock_guard lk(mu_);
  if (auto it = marks_.find(resource); it != marks_.end()) marks_.erase(it);
}

}  // namespace jobguard::guard
