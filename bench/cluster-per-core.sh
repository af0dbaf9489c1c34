#!/bin/bash
# Lock throughput per server core: three cluster primaries (no replicas) and
# one single server, all four pinned to core 0, `jobguard bench --only lock`
# pinned to core 1, cluster and single alternating, twice. Each run's JSON
# carries lock_ops_per_server_cpu_s (INFO cpu of every server it used).
#   bench/cluster-per-core.sh [OUT_DIR]   env: J=jobguard binary, SECS, ROUNDS,
#   CW (the cluster's workers; the single server always has 64),
#   ONE_NODE=1: also a one-node cluster (every slot on one primary, on core 0
#   too), 64 workers: the cluster mode's own cost per command, apart from
#   what three servers sharing one core cost each other.
set -u
cd "$(dirname "$0")/.."
J=${J:-build/apps/jobguard/jobguard}
OUT=${1:-/tmp/jobguard-cluster-per-core}; mkdir -p "$OUT"
SECS=${SECS:-3}; ROUNDS=${ROUNDS:-5}; CW=${CW:-64}
B=${BASE_PORT:-37101}; S=$((B + 9)); O=$((B + 8)); ONE_NODE=${ONE_NODE:-0}
D=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$D"
}
trap cleanup EXIT
ports=($B $((B + 1)) $((B + 2)) $S)
[ "$ONE_NODE" = 1 ] && ports+=($O)
for p in "${ports[@]}"; do
  mkdir -p "$D/$p"
  extra=()
  [ "$p" = "$S" ] || extra=(--cluster-enabled yes --cluster-port $((p + 10000)) --cluster-config-file "$D/$p/nodes.conf")
  taskset -c 0 redis-server --port "$p" --save '' --appendonly no --dir "$D/$p" "${extra[@]}" >"$D/$p/log" 2>&1 &
  PIDS+=($!)
done
sleep 1
redis-cli --cluster create 127.0.0.1:$B 127.0.0.1:$((B + 1)) 127.0.0.1:$((B + 2)) --cluster-replicas 0 --cluster-yes \
  >"$D/create.log" 2>&1
for _ in $(seq 50); do
  [ "$(redis-cli -p $B cluster info | tr -d '\r' | grep cluster_state)" = "cluster_state:ok" ] && break
  sleep 0.2
done
# Servers started empty here: exempt from the first-contact quarantine. Each
# cluster primary keeps its own record, on jobguard:epoch:{n} for the smallest
# n whose slot it serves (a node answers MOVED for the others); the single
# server on jobguard:epoch.
if [ "$ONE_NODE" = 1 ]; then
  redis-cli -p $O cluster addslotsrange 0 16383 >/dev/null
  for _ in $(seq 50); do
    [ "$(redis-cli -p $O cluster info | tr -d '\r' | grep cluster_state)" = "cluster_state:ok" ] && break
    sleep 0.2
  done
fi
# Servers just started empty: recorded as intact, every primary's record.
why="bench/cluster-per-core.sh: servers it started"
"$J" --redis "redis://127.0.0.1:$B/0?cluster=yes" server trust --reason "$why" >/dev/null
[ "$ONE_NODE" = 1 ] && "$J" --redis "redis://127.0.0.1:$O/0?cluster=yes" server trust --reason "$why" >/dev/null
"$J" --redis "redis://127.0.0.1:$S/0" server trust --reason "$why" >/dev/null
echo "start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/log"
for _ in 1 2; do
  taskset -c 1 "$J" --redis "redis://127.0.0.1:$B/0?cluster=yes" --json bench --workers "$CW" --seconds "$SECS" \
    --rounds "$ROUNDS" --only lock | sed "s|^|cluster |" >>"$OUT/runs.jsonl"
  taskset -c 1 "$J" --redis "redis://127.0.0.1:$S/0" --json bench --workers 64 --seconds "$SECS" --rounds "$ROUNDS" \
    --only lock | sed "s|^|single |" >>"$OUT/runs.jsonl"
  [ "$ONE_NODE" = 1 ] && taskset -c 1 "$J" --redis "redis://127.0.0.1:$O/0?cluster=yes" --json bench --workers 64 \
    --seconds "$SECS" --rounds "$ROUNDS" --only lock | sed "s|^|one-node |" >>"$OUT/runs.jsonl"
done
echo "end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log"
