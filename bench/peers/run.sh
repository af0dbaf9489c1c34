#!/usr/bin/env bash
# Runs the Node.js peer measurements: lock-bench (plain, redlock) and
# contention (plain, redlock). Starts nothing unless asked:
#   run.sh --redis URL [options]      against a server you run
#   run.sh --embedded [--pin]         against a private redis-server it starts
#                                     (with --pin: server on core 0, node on core 1)
# Options: --workers N (lock-bench, default 64) --seconds S (default 3)
#          --contention-workers W (default 8) --json (JSON lines on stdout)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/embedded-redis.sh
source "$here/lib/embedded-redis.sh"

usage() { sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

url="" embedded=0 pin=0 workers=64 seconds=3 cworkers=8 json=0
while (( $# )); do
  case "$1" in
    --redis) [[ $# -ge 2 ]] || { echo "run.sh: --redis needs a URL" >&2; exit 64; }; url="$2"; shift 2 ;;
    --redis=*) url="${1#*=}"; shift ;;
    --embedded) embedded=1; shift ;;
    --pin) pin=1; shift ;;
    --workers) [[ $# -ge 2 ]] || { echo "run.sh: --workers needs a number" >&2; exit 64; }; workers="$2"; shift 2 ;;
    --seconds) [[ $# -ge 2 ]] || { echo "run.sh: --seconds needs a number" >&2; exit 64; }; seconds="$2"; shift 2 ;;
    --contention-workers) [[ $# -ge 2 ]] || { echo "run.sh: --contention-workers needs a number" >&2; exit 64; }; cworkers="$2"; shift 2 ;;
    --json) json=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 64 ;;
  esac
done
if [[ -n "$url" && $embedded == 1 ]]; then echo "run.sh: give --redis URL or --embedded, not both" >&2; exit 64; fi
if [[ -z "$url" && $embedded == 0 ]]; then echo "run.sh: give --redis URL or --embedded (see --help)" >&2; exit 64; fi
if (( pin )) && ! command -v taskset >/dev/null; then echo "run.sh: --pin needs taskset (Debian: util-linux)" >&2; exit 69; fi

"$here/install.sh"

trap embedded_redis_stop EXIT
trap 'exit 130' INT TERM
if (( embedded )); then
  if (( pin )); then embedded_redis_start 0; else embedded_redis_start; fi
  url="$EMBEDDED_REDIS_URL"
fi

node_cmd=(node)
(( pin )) && node_cmd=(taskset -c 1 node)
fmt=()
(( json )) && fmt=(--json)

for mode in plain redlock; do
  "${node_cmd[@]}" "$here/lock-bench.js" --redis "$url" --mode "$mode" --workers "$workers" --seconds "$seconds" "${fmt[@]}"
done
for mode in plain redlock; do
  "${node_cmd[@]}" "$here/contention.js" --redis "$url" --mode "$mode" --workers "$cworkers" --seconds "$seconds" "${fmt[@]}"
done
