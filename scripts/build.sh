#!/usr/bin/env bash
# scripts/build.sh [BUILD_DIR] [extra cmake args...]: configure and build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build}; shift || true
cmake -S "$root" -B "$dir" -G Ninja -DJOBGUARD_WERROR=ON "$@" >/dev/null
ninja -C "$dir"
