#!/usr/bin/env bash
# Semaphore acquire+release throughput, jobguard vs redis-semaphore (npm), on
# ONE private redis-server, alternating rounds so both see the same machine:
#   bench/semaphore-vs-peer.sh JOBGUARD_BINARY [--permits 64] [--workers 64]
#                              [--seconds 3] [--rounds 3] [--busy-poll 300us]
# Each round runs jobguard as it comes, jobguard with the URL option
# busy_poll (its I/O thread polls that long before it sleeps: CPU traded for
# wake-ups; `--busy-poll 0us` leaves that run out), then redis-semaphore.
# One JSON object per round on stdout, then a summary line with the median
# ratios jobguard/redis-semaphore. Each run says its client's CPU per pair
# (client_cpu_us_per_pair): the peer's Node process keeps one core busy.
# Node peers come from bench/peers (npm ci).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=peers/lib/embedded-redis.sh
source "$here/peers/lib/embedded-redis.sh"
[[ $# -ge 1 && -x "$1" ]] || { echo "semaphore-vs-peer.sh: usage: semaphore-vs-peer.sh JOBGUARD_BINARY [--permits N] [--workers W] [--seconds S] [--rounds R] [--busy-poll DURATION]" >&2; exit 64; }
jobguard="$1"; shift
permits=64 workers=64 seconds=3 rounds=3 busy_poll=300us
while (( $# )); do
  case "$1" in
    --permits) permits="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --busy-poll) busy_poll="$2"; shift 2 ;;
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
# A run's output with its client's CPU per pair added: utime+stime of the
# process over the whole run (its setup included, a few ms) / pairs.
tick="$(getconf CLK_TCK)"
with_cpu() {  # RESULT_FILE STAT_FILE OPS_PATH
  node -e '
    const fs = require("fs");
    const r = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
    const [u, s] = fs.readFileSync(process.argv[2], "utf8").trim().split(" ").map(Number);
    const box = process.argv[3] === "permits" ? r.permits : r;
    box.client_cpu_us_per_pair = +((u + s) / Number(process.argv[4]) * 1e6 / box.ops).toFixed(2);
    console.log(JSON.stringify(r));' "$1" "$2" "$3" "$tick"
}
# Runs a command, leaving its stdout in $out/res and its children's CPU ticks
# (utime stime) in $out/cpu.
out="$(mktemp -d)"
trap 'rm -rf "$out"; embedded_redis_stop' EXIT
timed() {
  bash -c '"$@" > "$0/res"; t=( $(cat /proc/$$/stat | sed "s/.*) //") ); echo "${t[13]} ${t[14]}" > "$0/cpu"' "$out" "$@"
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ratios=() spun=()
for (( r = 1; r <= rounds; r++ )); do
  timed "$jobguard" --redis "$url" --json bench --permits "$permits" --workers "$workers" --seconds "$seconds"
  jg="$(with_cpu "$out/res" "$out/cpu" permits)"
  jgs=null
  if [[ "$busy_poll" != 0* ]]; then
    timed "$jobguard" --redis "$url?busy_poll=$busy_poll" --json bench --permits "$permits" --workers "$workers" --seconds "$seconds"
    jgs="$(with_cpu "$out/res" "$out/cpu" permits)"
  fi
  timed node "$here/peers/semaphore-bench.js" --redis "$url" --permits "$permits" --workers "$workers" --seconds "$seconds" --json
  peer="$(with_cpu "$out/res" "$out/cpu" peer)"
  read -r ratio ratio_spun < <(node -e '
    const a = JSON.parse(process.argv[1]), s = JSON.parse(process.argv[2]), b = JSON.parse(process.argv[3]);
    console.log((a.permits.ops_per_s / b.ops_per_s).toFixed(3), s ? (s.permits.ops_per_s / b.ops_per_s).toFixed(3) : "null");' "$jg" "$jgs" "$peer")
  ratios+=("$ratio")
  [[ "$ratio_spun" == null ]] || spun+=("$ratio_spun")
  echo "{\"round\":$r,\"jobguard\":$jg,\"jobguard_busy_poll\":$jgs,\"peer\":$peer,\"ratio\":$ratio,\"ratio_busy_poll\":$ratio_spun}"
done
spun_median=null
(( ${#spun[@]} )) && spun_median="$(median "${spun[@]}")"
echo "{\"permits\":$permits,\"workers\":$workers,\"seconds\":$seconds,\"rounds\":$rounds,\"busy_poll\":\"$busy_poll\",\"ratio_median\":$(median "${ratios[@]}"),\"ratio_busy_poll_median\":$spun_median}"
