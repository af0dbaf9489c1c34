#!/bin/bash
# Default-mode contention, two builds alternating on one server: a private
# redis-server pinned to core 0 (trusted: started empty here), each
# `jobguard bench --contention` pinned to core 1, RUNS runs per build, then
# one --fair run per build. One JSON line per run, with the build's name.
#   bench/contention-sitting.sh BASE_BINARY NEW_BINARY [OUT.jsonl]
#   env: RUNS (default 5), SECS (default 5), PORT (default 37310)
set -eu
cd "$(dirname "$0")/.."
BASE=$1; NEW=$2; OUT=${3:-/tmp/jobguard-contention-sitting.jsonl}
RUNS=${RUNS:-5}; SECS=${SECS:-5}; PORT=${PORT:-37310}
D=$(mktemp -d)
taskset -c 0 redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$D" >"$D/log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait 2>/dev/null; rm -rf "$D"' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.1; done
"${JOBGUARD:-build/apps/jobguard/jobguard}" --redis "redis://127.0.0.1:$PORT/0" server trust --reason "bench: a server it started" >/dev/null
: >"$OUT"
run() {  # name binary [--fair]
  local name=$1 bin=$2; shift 2
  taskset -c 1 "$bin" --redis "redis://127.0.0.1:$PORT/0" --json bench --contention --seconds "$SECS" "$@" |
    sed "s|^{|{\"build\":\"$name\",\"at\":\"$(date -u +%T)\",|" >>"$OUT"
}
echo "start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for _ in $(seq "$RUNS"); do
  run base "$BASE"
  run new "$NEW"
done
run base "$BASE" --fair
run new "$NEW" --fair
echo "end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$OUT" <<'PY'
import json, sys
keys = ['cs_per_s', 'handoff_p50_us', 'handoff_p99_us', 'self_handoff_pct', 'wait_p50_ms', 'wait_p99_ms',
        'wait_max_ms', 'max_share_deviation_pct']
print('build fair ' + ' '.join(keys))
for line in open(sys.argv[1]):
    d = json.loads(line)
    c = d['contention']
    print(d['build'], c['fair'], *(c[k] for k in keys))
PY
