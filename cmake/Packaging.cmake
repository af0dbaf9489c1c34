# The Debian package (`cpack -G DEB` in a build tree; scripts/package.sh makes
# it from a Release build): the CLI and its man page, the libraries, headers
# and CMake package files, the Prometheus alert rules, the Grafana dashboard
# and a systemd unit for `jobguard serve`. docs/packaging.md says what goes
# where and how it is tested (scripts/package-test.sh).

# The man page is `jobguard --help` (and --version) run through help2man at
# build time, from the binary just built, so it cannot drift from the CLI.
# Off by default: only the package needs it, and a sanitized build would run
# an instrumented binary for it.
option(JOBGUARD_BUILD_MAN "Generate the jobguard(1) man page with help2man (Debian: help2man)" OFF)
if(JOBGUARD_BUILD_MAN)
  if(NOT JOBGUARD_BUILD_CLI)
    message(FATAL_ERROR "JOBGUARD_BUILD_MAN=ON needs the CLI (JOBGUARD_BUILD_CLI=ON)")
  endif()
  find_program(HELP2MAN help2man)
  find_program(GZIP gzip)
  if(NOT HELP2MAN OR NOT GZIP)
    message(FATAL_ERROR "JOBGUARD_BUILD_MAN=ON needs help2man and gzip (Debian: help2man, gzip)")
  endif()
  set(_jg_man ${PROJECT_BINARY_DIR}/man/jobguard.1)
  add_custom_command(
    OUTPUT ${_jg_man}.gz
    COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/man
    # --no-discard-stderr: CLI11 prints --help on stdout, but a failing
    # binary must fail the build rather than leave an empty page.
    COMMAND ${HELP2MAN} --no-info --no-discard-stderr --section 1 --source "jobguard ${PROJECT_VERSION}"
            --name "guard background jobs with Redis locks, leases and fencing tokens"
            --output ${_jg_man} $<TARGET_FILE:jobguard_cli>
    # -n: no name or time stamp in the gzip header, so the same binary gives
    # the same package.
    COMMAND ${GZIP} -9nf ${_jg_man}
    DEPENDS jobguard_cli
    COMMENT "help2man: jobguard.1 from jobguard --help"
    VERBATIM)
  add_custom_target(jobguard_man ALL DEPENDS ${_jg_man}.gz)
  install(FILES ${_jg_man}.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
endif()

# What runs the service and what watches it. The alert rules' unit tests
# (jobguard-alerts.test.yml) stay in the repository: they test the rules, a
# Prometheus server does not load them.
install(FILES deploy/prometheus/jobguard-alerts.yml DESTINATION ${CMAKE_INSTALL_DATADIR}/jobguard/prometheus)
install(FILES deploy/grafana/jobguard-dashboard.json DESTINATION ${CMAKE_INSTALL_DATADIR}/jobguard/grafana)
if(JOBGUARD_BUILD_CLI)
  # /usr/lib/systemd/system: where Debian 12 (merged /usr) keeps packaged units.
  install(FILES deploy/systemd/jobguard-serve.service DESTINATION lib/systemd/system)
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME jobguard)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "jobguard")
set(CPACK_PACKAGE_CONTACT "jobguard maintainers <jobguard@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Redis locks done right for background jobs: CLI, C++20 library, alerts")
set(CPACK_PACKAGE_DESCRIPTION
    "jobguard guards the side effects of background jobs with Redis locks (owner tokens, leases, fencing tokens,\n"
    "idempotency keys, completion records) and PostgreSQL where the guard must be durable. This package holds the\n"
    "jobguard command-line tool and its man page, a systemd unit for `jobguard serve`, the C++20 static libraries\n"
    "with headers and CMake package files, Prometheus alert rules and a Grafana dashboard.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# The CLI's shared libraries, as dpkg-shlibdeps reads them off the binary
# (libhiredis, libpqxx, libssl, libyaml-cpp, libjemalloc, libstdc++...).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The headers, static libraries and CMake package files are usable only with
# what jobguardConfig.cmake finds: the development packages of the libraries
# the parts link (src/CMakeLists.txt), and pkg-config for hiredis and libpqxx.
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libboost1.81-dev, libhiredis-dev, libssl-dev, libfmt-dev, nlohmann-json3-dev, pkg-config")
if(JOBGUARD_WITH_POSTGRES)
  string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS ", libpqxx-dev, libpq-dev, libyaml-cpp-dev")
endif()
# The embedded servers of `jobguard demo` and of the jobguard::testing
# fixtures; a production host needs neither.
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "redis-server, postgresql-15, cmake")
include(CPack)
