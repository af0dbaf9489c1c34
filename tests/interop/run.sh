#!/usr/bin/env bash
# Interop test: Node.js workers (plain ioredis pattern, node-redlock) and
# `jobguard run` contend on the same lock key of a private redis-server; the
# shared log must show no overlap and every kind of worker getting in.
#
#   tests/interop/run.sh --jobguard BIN     (or JOBGUARD_BIN=BIN in the environment)
#   tests/interop/run.sh --node-only        Node workers only (until `jobguard run` exists)
# Options: --iterations N per worker (default 20), --keep (leave the temp dir)
# Installs ioredis and node-redlock with bench/peers/install.sh (npm ci) first.
# Exit status: 0 ok; 1 overlap or a worker failed; 64 usage; 69 setup impossible.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=../../bench/peers/lib/embedded-redis.sh
source "$root/bench/peers/lib/embedded-redis.sh"

bin="${JOBGUARD_BIN:-}" node_only=0 iterations=20 keep=0
while (( $# )); do
  case "$1" in
    --jobguard) [[ $# -ge 2 ]] || { echo "interop: --jobguard needs the path of the jobguard binary" >&2; exit 64; }; bin="$2"; shift 2 ;;
    --jobguard=*) bin="${1#*=}"; shift ;;
    --node-only) node_only=1; shift ;;
    --iterations) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || { echo "interop: --iterations needs a positive integer" >&2; exit 64; }; iterations="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "interop: unknown argument '$1' (see --help)" >&2; exit 64 ;;
  esac
done
if (( node_only )); then
  bin=""
elif [[ -z "$bin" ]]; then
  echo "interop: give --jobguard BIN (or JOBGUARD_BIN), or --node-only to test the Node workers alone" >&2
  exit 64
elif [[ ! -x "$bin" ]]; then
  echo "interop: --jobguard $bin is not an executable file" >&2
  exit 64
elif ! grep -q -e '--key' <<<"$("$bin" run --help 2>&1)"; then
  # Not the exit status alone: a jobguard without `run` answers `run --help`
  # with its top-level help and status 0. The help is captured before grep
  # reads it: piped, `grep -q` exits at the first match and, under pipefail,
  # the writer's SIGPIPE fails the check whenever the help outgrows the pipe
  # read so far.
  echo "interop: '$bin run --help' shows no --key option: this jobguard has no 'run' subcommand yet (use --node-only until it has)" >&2
  exit 69
fi

"$root/bench/peers/install.sh"

work="$(mktemp -d -t jobguard-interop.XXXXXX)"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  embedded_redis_stop
  if (( keep )); then echo "interop: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 1. The checker must be able to fail: feed it logs with known faults first.
resource="interop:$$"
key="jobguard:lock:{$resource}"
printf 'enter a-1 1 key=%s\nexit a-1 2 holder=ok\nenter b-1 3 key=%s\nexit b-1 4 holder=ok\n' "$key" "$key" > "$work/good.log"
printf 'enter a-1 1 key=%s\nenter b-1 2 key=%s\nexit b-1 3 holder=ok\nexit a-1 4 holder=ok\n' "$key" "$key" > "$work/overlap.log"
printf 'enter a-1 1 key=%s\nexit a-1 2 holder=mismatch:"x"\n' "$key" > "$work/stolen.log"
node "$here/check-log.js" --log "$work/good.log" --key "$key" --kinds a,b >/dev/null ||
  { echo "interop: checker self-test: a clean log was rejected" >&2; exit 1; }
for bad in overlap stolen; do
  if node "$here/check-log.js" --log "$work/$bad.log" --key "$key" >/dev/null 2>&1; then
    echo "interop: checker self-test: the $bad log was accepted" >&2
    exit 1
  fi
done

# 2. The real run.
embedded_redis_start ""
url="$EMBEDDED_REDIS_URL"
log="$work/critical-sections.log"
: > "$log"

kinds="plain,redlock"
names=()
for mode in plain redlock; do
  for n in 1 2; do
    node "$here/worker.js" --redis "$url" --resource "$resource" --mode "$mode" --id "$mode-$n" \
      --log "$log" --iterations "$iterations" 2> "$work/$mode-$n.err" &
    pids+=($!); names+=("$mode-$n")
  done
done

# jobguard side: each iteration is one `jobguard run`; the command checks from
# inside that the key it was told about holds the token it was told about.
jobguard_loop() {
  local loop="$1" i rc
  for (( i = 1; i <= iterations; i++ )); do
    rc=0
    # shellcheck disable=SC2016  # expanded by the inner sh, inside the lock
    # max_ttl=5s: this server is new to jobguard, so its first grants wait
    # out a 5 s quarantine (docs/lock-safety.md) inside the 10 s wait.
    "$bin" --redis "$url?max_ttl=5s" run --key "$resource" --ttl 5s --wait 10s -- sh -c '
      echo "enter jg-$0.$$ $(date +%s%N) key=$JOBGUARD_KEY" >> "$1"
      v="$(redis-cli -u "$2" --no-auth-warning GET "$JOBGUARD_KEY")"
      sleep 0.005
      if [ -n "$JOBGUARD_TOKEN" ] && [ "$v" = "$JOBGUARD_TOKEN" ]; then h=ok; else h="mismatch:$v"; fi
      echo "exit jg-$0.$$ $(date +%s%N) holder=$h" >> "$1"' "$loop" "$log" "$url" || rc=$?
    if (( rc != 0 )); then
      echo "jobguard run (loop $loop, iteration $i) exited $rc" >&2
      return 1
    fi
  done
}
if [[ -n "$bin" ]]; then
  command -v redis-cli >/dev/null || { echo "interop: redis-cli not found (Debian: redis-tools)" >&2; exit 69; }
  kinds="$kinds,jg"
  for n in 1 2; do
    jobguard_loop "$n" 2> "$work/jg-$n.err" &
    pids+=($!); names+=("jg-$n")
  done
fi

failed=0
for idx in "${!pids[@]}"; do
  if ! wait "${pids[$idx]}"; then
    echo "interop: worker ${names[$idx]} failed: $(tail -n 3 "$work/${names[$idx]}.err" | tr '\n' ' ')" >&2
    failed=1
  fi
done
pids=()

workers=${#names[@]}
if ! node "$here/check-log.js" --log "$log" --key "$key" --kinds "$kinds" --pairs $(( workers * iterations )); then
  failed=1
fi
if (( failed )); then
  keep=1
  echo "interop: FAILED (log: $log)" >&2
  exit 1
fi
echo "interop: ok: $workers workers ($kinds) x $iterations critical sections on $key, no overlap"
