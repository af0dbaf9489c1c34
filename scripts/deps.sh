#!/usr/bin/env bash
# Installs the Debian packages jobguard needs to build, test and run its demo.
# As root it installs what is missing; otherwise it only reports what is.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config git
      libhiredis-dev libboost1.81-dev libssl-dev libpq-dev libpqxx-dev
      libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev libyaml-cpp-dev
      libgtest-dev libgmock-dev libbenchmark-dev
      libjemalloc-dev   # the jobguard executable's malloc (CMakeLists.txt, JOBGUARD_JEMALLOC)
      help2man          # the man page in the Debian package (cmake/Packaging.cmake)
      redis-server redis-tools postgresql-15 openssl
      chromium   # the dashboard's browser test drives Debian's chromium (tests/browser)
      prometheus # promtool checks and unit-tests deploy/prometheus/; the alerts test runs the server
      clang libclang-rt-14-dev   # the fuzz harnesses: clang++ -fsanitize=fuzzer (libFuzzer is in libclang-rt)
      lld        # links the suite's sanitized test binaries in half the time of ld.bfd (scripts/test.sh)
      # Laravel's Cache::lock and redis-py's Lock as peers on jobguard's keys
      # (tests/cli/run/interop_peers_test.cpp)
      php-cli php-redis php-illuminate-cache php-illuminate-redis python3-redis)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run the peer benchmarks and the interop test. Machines that
# already have them (often from outside Debian, with npm bundled) keep theirs:
# Debian's npm package conflicts with such installs.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "jobguard: missing Debian packages: ${missing[*]} (run as root or install them)" >&2
    exit 69
  fi
  echo "jobguard: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The browser test's playwright-core, from its committed lock (no browser
# download: it drives the chromium above).
bash "$(dirname "${BASH_SOURCE[0]}")/npm-ci.sh" "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/browser"
