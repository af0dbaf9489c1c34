#!/usr/bin/env bash
# Installs the Node.js peers (ioredis, node-redlock) into bench/peers/node_modules
# from the committed package-lock.json (npm ci): scripts/npm-ci.sh, shared
# with the browser tests. Idempotent and quick when node_modules matches the lock.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "$here/../../scripts/npm-ci.sh" "$here"
