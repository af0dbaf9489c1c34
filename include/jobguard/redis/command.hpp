// A Redis command, encoded to RESP once when it is built, so the event loop
// only copies bytes. Binary-safe: arguments may hold any bytes.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace jobguard::redis {

class Command {
 public:
  Command(std::initializer_list<std::string_view> args);
  explicit Command(const std::vector<std::string>& args);
  explicit Command(const std::vector<std::string_view>& args);

  // The encoded RESP bytes.
  const std::string& payload() const noexcept { return payload_; }
  // Moves the encoded bytes out (the client's submit path: no copy per call).
  std::string take_payload() && noexcept { return std::move(payload_); }
  // The command name as given ("SET"), for errors and metrics.
  const std::string& name() const noexcept { return name_; }

 private:
  template <class It>
  void encode(It first, It last);

  std::string payload_;
  std::string name_;
};

}  // namespace jobguard::redis
