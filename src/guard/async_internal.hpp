// The asynchronous forms of the Redis stores, private to src/guard: a
// redis::Completion that parses the reply on the loop with the same function
// the blocking form uses, and reports the value or the failure.
#pragma once

#include <exception>
#include <string>
#include <functional>
#include <system_error>
#include <utility>

#include "jobguard/error.hpp"
#include "jobguard/redis/client.hpp"

namespace jobguard::guard::detail {

template <class T, class Parse>
redis::Completion reporting(const redis::Client& client, std::function<void(std::exception_ptr, T)> done, Parse parse) {
  return [&client, done = std::move(done), parse = std::move(parse)](std::error_code ec, redis::Reply r) {
    T value{};
    try {
      redis::detail::throw_if_error(client, ec, r);
      value = parse(r);
    } catch (...) {
      return done(std::current_exception(), T{});
    }
    done(nullptr, std::move(value));
  };
}

// Argument checks of an asynchronous form report through `done`, as every
// other failure does; true when `check` passed.
template <class T, class Check>
bool checked(const std::function<void(std::exception_ptr, T)>& done, Check check) {
  try {
    check();
    return true;
  } catch (...) {
    done(std::current_exception(), T{});
    return false;
  }
}

template <class T>
void no_async_form(const std::function<void(std::exception_ptr, T)>& done, const char* what) {
  done(std::make_exception_ptr(Error(errc::invalid_argument, std::string(what) + " has no asynchronous form")), T{});
}

}  // namespace jobguard::guard::detail
