// `jobguard --version`: what was built, and with which client libraries (the
// first thing to ask for in a bug report), PostgreSQL's or that it is not
// built in. Compile-time versions for the header-defined ones, the loaded
// library's own answer for libpq and OpenSSL and for the allocator.
#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <openssl/crypto.h>

#include <boost/version.hpp>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cli.hpp"
#include "postgres.hpp"
#include "jobguard/version.hpp"

#if JOBGUARD_WITH_JEMALLOC
#include <jemalloc/jemalloc.h>
#else
#include <gnu/libc-version.h>
#endif

#ifndef JOBGUARD_BUILD_TYPE
#define JOBGUARD_BUILD_TYPE "unspecified"
#endif

namespace jobguard::cli {

namespace {

#if JOBGUARD_WITH_JEMALLOC
std::uint64_t thread_allocated() {
  std::uint64_t n = 0;
  std::size_t size = sizeof n;
  return mallctl("thread.allocated", &n, &size, nullptr, 0) == 0 ? n : 0;
}
#endif

// Which malloc this process runs on, asked of the process: a build that
// links jemalloc could still end up on libc's malloc if the link order put
// libc first, and the benchmarks' client figures depend on it.
std::string allocator_text() {
#if JOBGUARD_WITH_JEMALLOC
  const char* version = nullptr;
  std::size_t size = sizeof version;
  if (mallctl("version", static_cast<void*>(&version), &size, nullptr, 0) != 0 || version == nullptr)
    return "malloc: jemalloc (it does not answer)";
  // jemalloc counts this thread's bytes only when it is the malloc in use.
  // The volatile pointer keeps the compiler from dropping the pair.
  const std::uint64_t before = thread_allocated();
  void* volatile block = std::malloc(4096);
  const std::uint64_t after = thread_allocated();
  std::free(block);
  const bool in_use = after - before >= 4096;
  return fmt::format("malloc: jemalloc {}{}", version, in_use ? "" : " (linked, but not the malloc in use)");
#elif defined(__SANITIZE_ADDRESS__)
  return "malloc: AddressSanitizer's";
#elif defined(__SANITIZE_THREAD__)
  return "malloc: ThreadSanitizer's";
#else
  return fmt::format("malloc: glibc {}", gnu_get_libc_version());
#endif
}

}  // namespace

std::string version_text() {
  return fmt::format(
      "jobguard {} ({} build)\n"
      "hiredis {}.{}.{}\n"
      "{}\n"
      "{}\n"
      "Boost {}.{}.{}\n"
      "{}",
      jobguard::version_string, JOBGUARD_BUILD_TYPE, HIREDIS_MAJOR, HIREDIS_MINOR, HIREDIS_PATCH, pg::version_lines(),
      OpenSSL_version(OPENSSL_VERSION), BOOST_VERSION / 100000, BOOST_VERSION / 100 % 1000, BOOST_VERSION % 100,
      allocator_text());
}

}  // namespace jobguard::cli
