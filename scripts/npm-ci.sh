#!/usr/bin/env bash
# Installs the npm packages of DIR (its package.json) into DIR/node_modules
# from the npm registry with the machine's npm, reproducibly from the
# committed package-lock.json (npm ci; npm install only when no lock exists).
# Idempotent and quick when node_modules already matches the lock.
#   scripts/npm-ci.sh DIR
# Exit status: 0 installed or already current; 64 usage; 69 no usable node/npm.
set -euo pipefail
[[ $# -eq 1 && -f "$1/package.json" ]] || { echo "npm-ci.sh: usage: npm-ci.sh DIR (a directory with a package.json)" >&2; exit 64; }
cd "$1"
me="scripts/npm-ci.sh $1"

command -v node >/dev/null || { echo "$me: node not found on PATH (Debian: apt-get install nodejs npm)" >&2; exit 69; }
command -v npm >/dev/null || { echo "$me: npm not found on PATH (Debian: apt-get install npm)" >&2; exit 69; }
major="$(node -p 'process.versions.node.split(".")[0]')"
if (( major < 20 )); then
  echo "$me: node $(node --version) is too old, need >= 20" >&2
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

# A package that would fetch a browser build of its own must not (none may be
# downloaded here: the tests drive Debian's chromium).
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 PUPPETEER_SKIP_DOWNLOAD=1
if [[ -f package-lock.json ]]; then
  npm ci --no-audit --no-fund --loglevel=error
else
  npm install --no-audit --no-fund --loglevel=error
fi
