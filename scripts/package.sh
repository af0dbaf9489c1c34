#!/usr/bin/env bash
# scripts/package.sh [BUILD_DIR]: builds the Debian package (cmake/Packaging.cmake)
# from a Release build of its own (default build-package/): -O2 without debug
# information, only what the package holds (the libraries, the CLI and its
# man page; no tests, no benchmarks), warnings as errors. Prints the .deb's
# path as its last line. scripts/package-test.sh installs and tests it.
# Unity batches (JOBGUARD_UNITY_BUILD), as CI's other trees: at -O2 too they
# halve the build's CPU time, most of what CI waits for after its tests. A
# source that forgets an include its batch happens to provide still fails
# the one-unit build (scripts/build.sh's default, scripts/demo.sh's).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-package}
# Prefix /usr: GNUInstallDirs then picks Debian's multiarch libdir (lib/x86_64-linux-gnu).
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" \
  -DCMAKE_INSTALL_PREFIX=/usr \
  -DJOBGUARD_WERROR=ON -DJOBGUARD_BUILD_TESTS=OFF -DJOBGUARD_BUILD_BENCH=OFF -DJOBGUARD_BUILD_MAN=ON \
  -DJOBGUARD_UNITY_BUILD=ON >/dev/null
ninja -C "$build" -j "$(nproc)"
rm -rf "$build/package"
(cd "$build" && cpack -G DEB -B "$build/package" >/dev/null)
deb=$(ls "$build"/package/jobguard_*.deb)
dpkg-deb --info "$deb" | sed -n '/Package:/,$p' | grep -E '^ (Package|Version|Architecture|Depends|Installed-Size):'
echo "$deb"
