#include "jobguard/redis/command.hpp"

#include <hiredis/hiredis.h>

#include <cstdlib>
#include <new>

#include "jobguard/error.hpp"

namespace jobguard::redis {

template <class It>
void Command::encode(It first, It last) {
  const auto argc = static_cast<std::size_t>(std::distance(first, last));
  if (argc == 0) throw Error(errc::invalid_argument, "empty Redis command");
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  argv.reserve(argc);
  lens.reserve(argc);
  for (auto it = first; it != last; ++it) {
    argv.push_back(it->data());
    lens.push_back(it->size());
  }
  name_.assign(first->data(), first->size());
  char* out = nullptr;
  const int n = redisFormatCommandArgv(&out, static_cast<int>(argc), argv.data(), lens.data());
  if (n < 0 || out == nullptr) throw std::bad_alloc();
  payload_.assign(out, static_cast<std::size_t>(n));
  redisFreeCommand(out);
}

Command::Command(std::initializer_list<std::string_view> args) { encode(args.begin(), args.end()); }
Command::Command(const std::vector<std::string>& args) { encode(args.begin(), args.end()); }
Command::Command(const std::vector<std::string_view>& args) { encode(args.begin(), args.end()); }

}  // namespace jobguard::redis
