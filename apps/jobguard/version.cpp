// `jobguard --version`: what was built, and with which client libraries (the
// first thing to ask for in a bug report). Compile-time versions for the
// header-defined ones, the loaded library's own answer for libpq and OpenSSL.
#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <libpq-fe.h>
#include <openssl/crypto.h>

#include <boost/version.hpp>
#include <pqxx/version.hxx>

#include "cli.hpp"
#include "jobguard/version.hpp"

#ifndef JOBGUARD_BUILD_TYPE
#define JOBGUARD_BUILD_TYPE "unspecified"
#endif

namespace jobguard::cli {

std::string version_text() {
  const int pq = PQlibVersion();  // 150018 for 15.18 (major * 10000 + minor since 10)
  return fmt::format(
      "jobguard {} ({} build)\n"
      "hiredis {}.{}.{}\n"
      "libpqxx {}\n"
      "libpq {}.{}\n"
      "{}\n"
      "Boost {}.{}.{}",
      jobguard::version_string, JOBGUARD_BUILD_TYPE, HIREDIS_MAJOR, HIREDIS_MINOR, HIREDIS_PATCH, PQXX_VERSION,
      pq / 10000, pq % 10000, OpenSSL_version(OPENSSL_VERSION), BOOST_VERSION / 100000, BOOST_VERSION / 100 % 1000,
      BOOST_VERSION % 100);
}

}  // namespace jobguard::cli
