#!/usr/bin/env bash
# Runs the jobguard demo on a fresh Debian 12 machine: installs packages (as
# root), builds, and runs `jobguard demo` on an embedded redis-server that the
# demo starts itself. Extra arguments go to `jobguard demo` (e.g. --json).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/deps.sh"
cmake -S "$root" -B "$root/build" -G Ninja -DJOBGUARD_WERROR=ON >/dev/null
ninja -C "$root/build" jobguard_cli >/dev/null
# The billing demo (BRIEF §3) on an embedded redis-server the demo starts itself.
exec "$root/build/apps/jobguard/jobguard" demo "$@"
