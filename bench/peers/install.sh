#!/usr/bin/env bash
# Installs the Node.js peers (ioredis, node-redlock) into bench/peers/node_modules
# from the npm registry with the machine's npm. Reproducible from the committed
# package-lock.json (npm ci); falls back to npm install only when no lock exists.
# Idempotent and quick when node_modules already matches the lock.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

command -v node >/dev/null || { echo "bench/peers/install.sh: node not found on PATH (Debian: apt-get install nodejs npm)" >&2; exit 69; }
command -v npm >/dev/null || { echo "bench/peers/install.sh: npm not found on PATH (Debian: apt-get install npm)" >&2; exit 69; }
major="$(node -p 'process.versions.node.split(".")[0]')"
if (( major < 20 )); then
  echo "bench/peers/install.sh: node $(node --version) is too old, need >= 20" >&2
  exit 69
fi

# npm ci wipes and reinstalls; skip it when the installed tree already matches
# the lock file (npm writes node_modules/.package-lock.json on every install).
if [[ -f package-lock.json && -f node_modules/.package-lock.json ]] &&
   node -e '
     const a = require("./package-lock.json").packages, b = require("./node_modules/.package-lock.json").packages;
     for (const [k, v] of Object.entries(a)) { if (k && (!b[k] || b[k].version !== v.version)) process.exit(1); }
   ' 2>/dev/null; then
  exit 0
fi

if [[ -f package-lock.json ]]; then
  npm ci --no-audit --no-fund --loglevel=error
else
  npm install --no-audit --no-fund --loglevel=error
fi
