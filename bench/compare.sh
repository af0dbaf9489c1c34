#!/usr/bin/env bash
# bench/compare.sh [--seconds S] [--workers N] [--rounds R] [--connections "1 2"] [--peers]
# bench/compare.sh --jobs M [--concurrency 1,64] [--rounds R] [--unique | --rate N/PERIOD [--seconds W]]
# One sitting, one private redis-server pinned to core 0, every client pinned to
# core 1, measured back to back:
#   1. redis-benchmark -c N -P 1 SET (the single-client-core wall),
#   2. jobguard bench (raw SET NX PX, raw pair, lock pair through the library;
#      the pair and lock halves alternate R rounds), once per connection count
#      (1 = what the Node peers use; 2 lets the server work on one connection's
#      batch while the client handles the other's),
#   3. with --peers: the Node.js plain ioredis pattern and node-redlock.
# With --jobs M instead: the job path in one sitting, same pinning: jobguard
# bench --jobs (the stream worker, guarded, beside bare XREADGROUP + XACK) and
# the BullMQ peer (bench/peers/bullmq-bench.js) on the same M jobs per
# concurrency, and the ratios guarded/BullMQ and guarded/bare. With --rounds R
# the two alternate R times (the server emptied before each), and the ratios
# of every round are printed with their median: on a shared 2-core host one
# pair's ratio moves by half either way within minutes (docs/bench.md).
# With --unique: every job enqueued unique on both sides (jobguard's
# until-executed unique jobs, BullMQ's deduplication ids), one id per job.
# With --rate N/PERIOD: the rate limiters instead (jobguard bench --jobs
# --rate: the stream worker's GCRA limit; bullmq-bench.js --rate: the
# Worker's limiter). Each side drains M jobs unlimited and under a limit far
# above what it reaches (the limiter's own cost), then a backlog under N per
# PERIOD over the whole periods in W seconds (default 10): the starts' rate
# against the limit, and the most starts in any one period and any tenth.
# The 1-minute load average before each round is in the output.
# Prints one JSON object with every figure and the ratios docs/bench.md quotes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=3 seconds_set=0 workers=64 peers=0 rounds=3 rounds_set=0 conns="1 2" jobs=0 concurrency=1,64 unique=() rate=
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; seconds_set=1; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --rounds) rounds=$2; rounds_set=1; shift 2 ;;
    --connections) conns=$2; shift 2 ;;
    --peers) peers=1; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    --unique) unique=(--unique); shift ;;
    --rate) rate=$2; shift 2 ;;
    *) echo "compare.sh: unknown option $1" >&2; exit 64 ;;
  esac
done
if [ -n "$rate" ] && { [ "$jobs" -le 0 ] || [ ${#unique[@]} -gt 0 ]; }; then
  echo "compare.sh: --rate goes with --jobs M, without --unique" >&2; exit 64
fi
jg=$root/build/apps/jobguard/jobguard
[ -x "$jg" ] || { echo "compare.sh: build first (scripts/build.sh)" >&2; exit 69; }
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
taskset -c 0 redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >/dev/null 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null; wait $srv 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
url=redis://127.0.0.1:$port/0
# A server this script has just started empty: recorded as having kept its
# lock state (`jobguard server trust`, what trust_new_server does), or
# its first grants would wait out the data-loss quarantine (docs/lock-safety.md).
# Emptied between runs (a FLUSHALL is lost lock state too), then trusted again,
# forced: trust refuses a server whose command stats show a FLUSHALL.
fresh() {
  redis-cli -p "$port" flushall >/dev/null
  "$jg" --redis "redis://127.0.0.1:$port/0" server trust --force --reason "bench/compare.sh: a server it started and emptied" >/dev/null
}
fresh
if [ "$jobs" -gt 0 ]; then
  bash "$root/bench/peers/install.sh" >/dev/null
  [ "$rounds_set" = 1 ] || rounds=1
  pairs=()
  if [ -n "$rate" ]; then
    window=''
    [ "$seconds_set" = 0 ] || window=$seconds
    for _ in $(seq "$rounds"); do
      load=$(cut -d' ' -f1 /proc/loadavg)
      jg_rate=$(taskset -c 1 "$jg" --redis "$url" --json bench --jobs "$jobs" --concurrency "$concurrency" --rate "$rate" \
                ${window:+--seconds "$window"})
      fresh
      bull=$(cd "$root/bench/peers" && taskset -c 1 node bullmq-bench.js --redis "$url" --jobs "$jobs" \
             --concurrency "$concurrency" --rate "$rate" ${window:+--window "$window"} --json)
      fresh
      pairs+=("$load" "$jg_rate" "$bull")
    done
    python3 "$root/bench/rate-summary.py" "${pairs[@]}"
    exit 0
  fi
  for _ in $(seq "$rounds"); do
    jg_jobs=$(taskset -c 1 "$jg" --redis "$url" --json bench --jobs "$jobs" --concurrency "$concurrency" "${unique[@]}")
    fresh
    bull=$(cd "$root/bench/peers" && taskset -c 1 node bullmq-bench.js --redis "$url" --jobs "$jobs" --concurrency "$concurrency" ${unique:+--dedup} --json)
    fresh
    pairs+=("$jg_jobs" "$bull")
  done
  python3 - "${pairs[@]}" <<'PY'
import json, statistics, sys
def sitting(jg, bull):
    ratios = {}
    for g, b, bm in zip(jg["runs"], jg["bare_runs"], bull["runs"]):
        c = g["concurrency"]
        ratios[f"concurrency_{c}"] = {"guarded_vs_bullmq": g["jobs_per_s"] / bm["jobs_per_s"],
                                      "guarded_vs_bare": g["jobs_per_s"] / b["jobs_per_s"]}
        # The server's CPU per job, BullMQ's over guarded: what jobs/s come to
        # when the server is the bottleneck, without the run-to-run noise.
        if g.get("server_us_per_job") and bm.get("server_us_per_job"):
            ratios[f"concurrency_{c}"]["bullmq_vs_guarded_server_us_per_job"] = bm["server_us_per_job"] / g["server_us_per_job"]
    return {"jobguard": jg, "bullmq": bull, "ratios": ratios}
args = [json.loads(a) for a in sys.argv[1:]]
rounds = [sitting(args[i], args[i + 1]) for i in range(0, len(args), 2)]
if len(rounds) == 1:
    print(json.dumps(rounds[0], indent=1))
    sys.exit(0)
median = {}
for c, r in rounds[0]["ratios"].items():
    median[c] = {k: statistics.median(x["ratios"][c][k] for x in rounds) for k in r}
print(json.dumps({"rounds": rounds, "ratios_by_round": [x["ratios"] for x in rounds], "ratios_median": median},
                 indent=1))
PY
  exit 0
fi
requests=$(( seconds * 100000 ))
rb=$(taskset -c 1 redis-benchmark -p "$port" -c "$workers" -P 1 -n "$requests" -r 10000000 -t set --csv 2>/dev/null \
     | awk -F'","' '/"SET"/ {gsub(/"/,"",$2); print $2}')
jgjson='{'
sep=''
for c in $conns; do
  fresh
  one=$(taskset -c 1 "$jg" --redis "$url" --json bench --workers "$workers" --seconds "$seconds" --rounds "$rounds" --connections "$c")
  jgjson="$jgjson$sep\"$c\":$one"
  sep=','
done
jgjson="$jgjson}"
peerjson='null'
if [ "$peers" = 1 ]; then
  bash "$root/bench/peers/install.sh" >/dev/null
  fresh
  plain=$(cd "$root/bench/peers" && taskset -c 1 node lock-bench.js --redis "$url" --workers "$workers" --seconds "$seconds" --mode plain --json)
  # The plain pattern over 2 connections too, so the 2-connection jobguard
  # figure is not compared with a peer denied the same setting.
  plain2=$(cd "$root/bench/peers" && taskset -c 1 node lock-bench.js --redis "$url" --workers "$workers" --seconds "$seconds" --mode plain --connections 2 --json)
  redlock=$(cd "$root/bench/peers" && taskset -c 1 node lock-bench.js --redis "$url" --workers "$workers" --seconds "$seconds" --mode redlock --json)
  peerjson="{\"plain\":$plain,\"plain_2_connections\":$plain2,\"redlock\":$redlock}"
fi
python3 - "$rb" "$jgjson" "$peerjson" <<'PY'
import json, sys
rb = float(sys.argv[1] or 0)
jg = json.loads(sys.argv[2])
peers = json.loads(sys.argv[3])
# Keyed by connection count.
out = {"redis_benchmark_set_per_s": rb, "jobguard": jg, "ratios": {}}
for c, j in jg.items():
    r = {"raw_vs_redis_benchmark": j["raw"]["ops_per_s"] / rb if rb else None,
         "lock_vs_raw_pair": j.get("ratio"),
         "lock_vs_raw_pair_rounds": [x["ratio"] for x in j.get("rounds", [])]}
    if peers:
        best = max(peers["plain"]["ops_per_s"], peers["plain_2_connections"]["ops_per_s"])
        r["lock_vs_ioredis_plain"] = j["lock"]["ops_per_s"] / peers["plain"]["ops_per_s"]
        r["lock_vs_ioredis_plain_best"] = j["lock"]["ops_per_s"] / best
        r["lock_vs_node_redlock"] = j["lock"]["ops_per_s"] / peers["redlock"]["ops_per_s"]
    out["ratios"][c + "_connection" + ("s" if c != "1" else "")] = r
if peers:
    out["peers"] = peers
print(json.dumps(out, indent=1))
PY
