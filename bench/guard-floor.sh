#!/usr/bin/env bash
# bench/guard-floor.sh [--jobs N] [--rounds R] [--bin JOBGUARD]
# What the Redis server alone spends on a job's commands, against what
# `jobguard bench --jobs` measures, in one run on one private server.
# bench/guard-floor.py writes N jobs' commands as RESP and `redis-cli --pipe`
# sends them with no client work in between (the deepest pipeline there is),
# so each figure is a floor: the server's CPU per job (INFO cpu, before and
# after) for the bare stream commands, for the moderate class's five commands
# sent plain (no script, no check: less than a correct guard does), and for
# two writes (the fewest a lock that leaves a record could make). Then,
# with --bin, `jobguard bench --jobs N --concurrency 64` on the same server.
# The server runs on core 0 and the clients on core 1 when there are two.
# Prints one JSON object: server_us_per_job by mode, the bench's guarded and
# bare jobs/s, and the most jobs/s a guard with the class's writes could reach
# at the floor with the server 100 % busy, over the bench's bare ceiling.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=200000 rounds=3 bin=""
while [ $# -gt 0 ]; do
  case $1 in
    --jobs) jobs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    *) echo "guard-floor.sh: unknown argument $1" >&2; exit 64 ;;
  esac
done
[[ $jobs =~ ^[0-9]+$ && $jobs -ge 1000 ]] || { echo "guard-floor.sh: --jobs $jobs is not a count of at least 1000" >&2; exit 64; }
[[ $rounds =~ ^[0-9]+$ && $rounds -ge 1 ]] || { echo "guard-floor.sh: --rounds $rounds is not a count of at least 1" >&2; exit 64; }
[ -z "$bin" ] || [ -x "$bin" ] || { echo "guard-floor.sh: --bin $bin is not an executable" >&2; exit 64; }
command -v redis-server >/dev/null || { echo "guard-floor.sh: redis-server not found (apt-get install redis-server)" >&2; exit 69; }
server_cpu="" client_cpu=""
if [ "$(nproc)" -ge 2 ]; then server_cpu="taskset -c 0" client_cpu="taskset -c 1"; fi
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
$server_cpu redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >"$dir/server.log" 2>&1 &
pid=$!
for _ in $(seq 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$port" PING >/dev/null 2>&1 ||
  { echo "guard-floor.sh: redis-server on 127.0.0.1:$port did not answer within 10 s: $(tail -1 "$dir/server.log")" >&2; exit 70; }
cli() { redis-cli -p "$port" "$@"; }
cpu() { cli INFO cpu | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.6f", s}'; }
# One mode's server CPU per job, in µs, on an emptied server.
floor() {
  local mode=$1 tag=$2 a b
  cli FLUSHALL >/dev/null
  python3 "$root/bench/guard-floor.py" enqueue "$jobs" "$tag" | cli --pipe >/dev/null
  python3 "$root/bench/guard-floor.py" "$mode" "$jobs" "$tag" >"$dir/$mode.resp"
  a=$(cpu)
  $client_cpu redis-cli -p "$port" --pipe <"$dir/$mode.resp" >"$dir/$mode.out" ||
    { echo "guard-floor.sh: redis-cli --pipe failed in mode $mode: $(tail -1 "$dir/$mode.out")" >&2; exit 70; }
  b=$(cpu)
  grep -q 'errors: 0,' "$dir/$mode.out" || { echo "guard-floor.sh: mode $mode: $(tail -1 "$dir/$mode.out")" >&2; exit 70; }
  python3 -c "print(round(($b - $a) / $jobs * 1e6, 3))"
}
results=()
for r in $(seq "$rounds"); do
  s=$(floor stream "s$r"); c=$(floor class "c$r"); t=$(floor two "t$r")
  bench="null"
  if [ -n "$bin" ]; then
    cli FLUSHALL >/dev/null
    "$bin" --redis "redis://127.0.0.1:$port/0" server trust --force --reason "bench/guard-floor.sh: a server it started and emptied" >/dev/null
    bench=$($client_cpu "$bin" --redis "redis://127.0.0.1:$port/0" --json bench --jobs "$jobs" --concurrency 64) ||
      { echo "guard-floor.sh: $bin bench failed" >&2; exit 70; }
  fi
  results+=("{\"stream\": $s, \"class\": $c, \"two\": $t, \"bench\": $bench}")
done
python3 - "${results[@]}" <<'PY'
import json, sys
rounds = []
for raw in sys.argv[1:]:
    r = json.loads(raw)
    row = {"server_us_per_job": {k: r[k] for k in ("stream", "class", "two")}}
    b = r["bench"]
    if b:
        g, bare = b["guarded"], b["bare"]
        row["bench"] = {"guarded_jobs_per_s": round(g["jobs_per_s"]), "guarded_server_us_per_job": round(g["server_us_per_job"], 2),
                        "bare_jobs_per_s": round(bare["jobs_per_s"]), "bare_server_us_per_job": round(bare["server_us_per_job"], 2),
                        "guarded_over_bare": round(b["guarded_over_bare"], 3)}
        # The most a guard making the class's writes could do: the server
        # 100 % busy at the floor's cost a job.
        row["class_floor_jobs_per_s"] = round(1e6 / r["class"])
        row["class_floor_over_bare"] = round(1e6 / r["class"] / bare["jobs_per_s"], 3)
        row["guarded_over_class_floor"] = round(g["jobs_per_s"] / (1e6 / r["class"]), 3)
    rounds.append(row)
print(json.dumps({"rounds": rounds}, indent=1))
PY
