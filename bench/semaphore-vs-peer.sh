#!/usr/bin/env bash
# Semaphore acquire+release throughput, jobguard vs redis-semaphore (npm), on
# ONE private redis-server, alternating rounds so both see the same machine:
#   bench/semaphore-vs-peer.sh JOBGUARD_BINARY [--permits 64] [--workers 64]
#                              [--seconds 3] [--rounds 3]
# One JSON object per round on stdout, then a summary line with the median
# ratio jobguard/redis-semaphore. Node peers come from bench/peers (npm ci).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=peers/lib/embedded-redis.sh
source "$here/peers/lib/embedded-redis.sh"
[[ $# -ge 1 && -x "$1" ]] || { echo "semaphore-vs-peer.sh: usage: semaphore-vs-peer.sh JOBGUARD_BINARY [--permits N] [--workers W] [--seconds S] [--rounds R]" >&2; exit 64; }
jobguard="$1"; shift
permits=64 workers=64 seconds=3 rounds=3
while (( $# )); do
  case "$1" in
    --permits) permits="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    *) echo "semaphore-vs-peer.sh: unknown argument '$1'" >&2; exit 64 ;;
  esac
done
"$here/peers/install.sh"
trap embedded_redis_stop EXIT
trap 'exit 130' INT TERM
embedded_redis_start
url="$EMBEDDED_REDIS_URL"
# Started empty here: its lock state is trusted (what trust_new_server does,
# with the library's own script), or the first grants wait out the quarantine.
"${JOBGUARD:-$here/../build/apps/jobguard/jobguard}" --redis "$url" server trust --reason "bench: a server it started" >/dev/null
ratios=()
for (( r = 1; r <= rounds; r++ )); do
  jg="$("$jobguard" --redis "$url" --json bench --permits "$permits" --workers "$workers" --seconds "$seconds")"
  peer="$(node "$here/peers/semaphore-bench.js" --redis "$url" --permits "$permits" --workers "$workers" --seconds "$seconds" --json)"
  ratio="$(node -e 'const a=JSON.parse(process.argv[1]).permits.ops_per_s, b=JSON.parse(process.argv[2]).ops_per_s; console.log((a/b).toFixed(3))' "$jg" "$peer")"
  ratios+=("$ratio")
  echo "{\"round\":$r,\"jobguard\":$jg,\"peer\":$peer,\"ratio\":$ratio}"
done
median="$(printf '%s\n' "${ratios[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"
echo "{\"permits\":$permits,\"workers\":$workers,\"seconds\":$seconds,\"rounds\":$rounds,\"ratio_median\":$median}"
