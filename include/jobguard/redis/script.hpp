// A Lua script known by its SHA1. The client calls it with EVALSHA and, on a
// NOSCRIPT reply (script cache flushed, failover to a fresh replica), resends
// it once with EVAL, which also reloads the cache. Scripts are immutable
// values; share them freely across threads.
#pragma once

#include <string>
#include <string_view>

namespace jobguard::redis {

class Script {
 public:
  explicit Script(std::string source);
  const std::string& source() const noexcept { return source_; }
  const std::string& sha1() const noexcept { return sha1_; }

 private:
  std::string source_;
  std::string sha1_;  // lowercase hex, as SCRIPT LOAD returns it
};

}  // namespace jobguard::redis
