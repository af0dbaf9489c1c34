#!/usr/bin/env bash
# bench/server-instructions.sh [--jobs "M1 M2"] [--concurrency C] BIN [BIN...]
# What a guarded job costs the Redis server, in instructions, not seconds: a
# private redis-server runs under valgrind's callgrind while `BIN bench --jobs
# M --concurrency C` runs against it, once for each M; the server's
# instructions per job are the slope between the two (the server's start and
# the scripts' loading cancel out). Instructions do not move with the host's
# load, so two builds compare exactly where a timed sitting on a shared
# machine moves ±20 % (docs/bench.md). The figure covers the whole bench run
# per job: enqueueing, the guarded phase and the bare phase.
# Needs valgrind (apt-get install valgrind). About 10 s a run. Prints one JSON
# object a line per binary: the instructions of each run and the slope.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
sizes="2000 6000" concurrency=64 bins=()
while [ $# -gt 0 ]; do
  case $1 in
    --jobs) sizes=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    -*) echo "server-instructions.sh: unknown option $1" >&2; exit 64 ;;
    *) bins+=("$1"); shift ;;
  esac
done
[ ${#bins[@]} -gt 0 ] || { echo "server-instructions.sh: name at least one jobguard binary" >&2; exit 64; }
for b in "${bins[@]}"; do [ -x "$b" ] || { echo "server-instructions.sh: $b is not an executable" >&2; exit 64; }; done
command -v valgrind >/dev/null || { echo "server-instructions.sh: valgrind not found (apt-get install valgrind)" >&2; exit 69; }
set -- $sizes
[ $# -eq 2 ] && [ "$1" -lt "$2" ] || { echo "server-instructions.sh: --jobs wants two sizes, smaller first" >&2; exit 64; }
dir=$(mktemp -d)
vg=""
trap 'rm -rf "$dir"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# One bench run of `bin` with `jobs` jobs; prints the server's instructions.
# Runs in a command substitution's subshell: its own trap stops its server.
run() {
  local bin=$1 jobs=$2 port out
  trap '[ -n "$vg" ] && kill "$vg" 2>/dev/null; true' EXIT
  port=$(free_port)
  out="$dir/callgrind.$port"
  valgrind --tool=callgrind --callgrind-out-file="$out" \
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >"$dir/valgrind.log" 2>&1 &
  vg=$!
  for _ in $(seq 150); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.2; done
  "${JOBGUARD:-$root/build/apps/jobguard/jobguard}" --redis "redis://127.0.0.1:$port/0" server trust --reason "bench: a server it started" >/dev/null
  "$bin" --redis "redis://127.0.0.1:$port/0" --json bench --jobs "$jobs" --concurrency "$concurrency" >"$dir/bench.json" ||
    { echo "server-instructions.sh: $bin bench failed" >&2; exit 70; }
  # SHUTDOWN closes the connection before it answers (redis-cli reports an
  # error), and valgrind's exit status is the server's: neither is a failure
  # of the run; a missing profile is (awk below).
  redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait "$vg" 2>/dev/null || true
  vg=""
  awk '/^(summary|totals):/ {print $2; exit}' "$out"
}
for b in "${bins[@]}"; do
  small=$(run "$b" "$1")
  large=$(run "$b" "$2")
  python3 - "$b" "$concurrency" "$1" "$small" "$2" "$large" <<'PY'
import json, sys
b, c, m1, i1, m2, i2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
print(json.dumps({"binary": b, "concurrency": c, "runs": {str(m1): i1, str(m2): i2},
                  "server_instructions_per_job": round((i2 - i1) / (m2 - m1))}))
PY
done
