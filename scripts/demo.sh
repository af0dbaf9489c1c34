#!/usr/bin/env bash
# Runs the jobguard demo on a fresh Debian 12 machine: installs only what the
# demo needs (as root: the compiler, the libraries jobguard builds with,
# redis-server and PostgreSQL 15), builds the CLI alone (no tests, no
# benchmarks) in build-demo/, and runs `jobguard demo`, which starts its own
# redis-server and PostgreSQL in temporary directories and removes them when
# it ends. Extra arguments go to `jobguard demo` (e.g. --json).
# scripts/deps.sh installs what the whole test suite needs instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pkgs=(build-essential cmake ninja-build pkg-config
      libhiredis-dev libboost1.81-dev libssl-dev libpq-dev libpqxx-dev
      libfmt-dev nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libjemalloc-dev
      redis-server postgresql-15)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "jobguard demo: missing Debian packages: ${missing[*]} (run as root or install them)" >&2
    exit 69
  fi
  echo "jobguard demo: installing ${missing[*]}" >&2
  # The demo starts its own servers: Debian's redis-server and postgresql
  # packages must not start system ones that would keep running after it.
  # A policy-rc.d that denies every start does that for the install only;
  # one already there (a container's) is left alone.
  policy=/usr/sbin/policy-rc.d
  made_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod +x "$policy"
    made_policy=1
    trap 'rm -f "$policy"' EXIT
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [ "$made_policy" = 1 ]; then
    rm -f "$policy"
    trap - EXIT
  fi
fi
cmake -S "$root" -B "$root/build-demo" -G Ninja -DCMAKE_BUILD_TYPE=Release -DJOBGUARD_WERROR=ON \
  -DJOBGUARD_BUILD_TESTS=OFF -DJOBGUARD_BUILD_BENCH=OFF >/dev/null
ninja -C "$root/build-demo" jobguard_cli >/dev/null
exec "$root/build-demo/apps/jobguard/jobguard" demo "$@"
