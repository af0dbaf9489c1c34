#!/usr/bin/env bash
# bench/jobs-sitting.sh [--jobs M] [--concurrency C] [--runs N] BIN [BIN...]
# Builds side by side on the job path, in one sitting: one private
# redis-server pinned to core 0 (no persistence), `BIN bench --jobs M
# --concurrency C` pinned to core 1, the binaries alternating, N rounds. Before
# each run the server is emptied (FLUSHALL: the keyspace's size moves the
# figure, docs/bench.md) and its lock state trusted, its counters reset.
# Prints one JSON object a line: the binary, the server's CPU seconds for the
# whole run (INFO cpu), the bench's JSON, and the server's INFO commandstats
# for that run (calls and usec per command, the
# commands scripts call counted too: where the server's time goes).
# The server is stopped on exit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=20000 concurrency=64 runs=3 bins=()
while [ $# -gt 0 ]; do
  case $1 in
    --jobs) jobs=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    -*) echo "jobs-sitting.sh: unknown option $1" >&2; exit 64 ;;
    *) bins+=("$1"); shift ;;
  esac
done
[ ${#bins[@]} -gt 0 ] || { echo "jobs-sitting.sh: name at least one jobguard binary" >&2; exit 64; }
for b in "${bins[@]}"; do [ -x "$b" ] || { echo "jobs-sitting.sh: $b is not an executable" >&2; exit 64; }; done
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
taskset -c 0 redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >/dev/null 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
for round in $(seq "$runs"); do
  for b in "${bins[@]}"; do
    redis-cli -p "$port" FLUSHALL >/dev/null
    "${JOBGUARD:-$root/build/apps/jobguard/jobguard}" --redis "redis://127.0.0.1:$port/0" server trust --force --reason "bench: a server it started and emptied" >/dev/null
    redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
    cpu0=$(redis-cli -p "$port" INFO cpu)
    out=$(taskset -c 1 "$b" --redis "redis://127.0.0.1:$port/0" --json bench --jobs "$jobs" --concurrency "$concurrency")
    cpu1=$(redis-cli -p "$port" INFO cpu)
    stats=$(redis-cli -p "$port" INFO commandstats)
    python3 - "$b" "$round" "$out" "$stats" "$cpu0" "$cpu1" <<'PY'
import json, sys
b, rnd, out, stats = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
def cpu(info):
    return sum(float(l.split(":")[1]) for l in info.splitlines() if l.startswith(("used_cpu_sys:", "used_cpu_user:")))
# The whole run: enqueueing, the guarded phase and the bare phase.
server_cpu_s = cpu(sys.argv[6]) - cpu(sys.argv[5])
cmds = {}
for line in stats.splitlines():
    if not line.startswith("cmdstat_"):
        continue
    name, fields = line[len("cmdstat_"):].split(":", 1)
    kv = dict(f.split("=") for f in fields.split(","))
    cmds[name] = {"calls": int(kv["calls"]), "usec": int(kv["usec"])}
print(json.dumps({"binary": b, "round": rnd, "server_cpu_s": server_cpu_s, "bench": out, "commandstats": cmds}))
PY
  done
done
