// Uses only the installed public headers.
#include <jobguard/error.hpp>
#include <jobguard/redis/options.hpp>

#include <iostream>

int main() {
  try {
    jobguard::redis::parse_url("http://example");
  } catch (const jobguard::Error& e) {
    std::cout << e.what() << "\n";
    return 0;
  }
  return 1;
}
