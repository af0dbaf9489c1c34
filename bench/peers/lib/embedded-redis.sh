# shellcheck shell=bash
# Sourced by bench/peers/run.sh and tests/interop/run.sh: a private
# redis-server as our own foreground child, on a free loopback port, in a temp
# dir; killed and its dir removed on exit. (`--daemonize yes` leaves zombies
# here, and a shared server would mix our keys with others'.)
#
#   embedded_redis_start [taskset-cpu-list]   sets EMBEDDED_REDIS_URL, EMBEDDED_REDIS_PID
#   embedded_redis_stop                       also runs from the EXIT trap

EMBEDDED_REDIS_PID=""
EMBEDDED_REDIS_DIR=""
# shellcheck disable=SC2034  # read by the scripts that source this file
EMBEDDED_REDIS_URL=""

embedded_redis_stop() {
  if [[ -n "$EMBEDDED_REDIS_PID" ]]; then
    kill "$EMBEDDED_REDIS_PID" 2>/dev/null || true
    wait "$EMBEDDED_REDIS_PID" 2>/dev/null || true
    EMBEDDED_REDIS_PID=""
  fi
  if [[ -n "$EMBEDDED_REDIS_DIR" ]]; then
    rm -rf "$EMBEDDED_REDIS_DIR"
    EMBEDDED_REDIS_DIR=""
  fi
}

_embedded_redis_free_port() {
  node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

embedded_redis_start() {
  local cpu="${1:-}"
  command -v redis-server >/dev/null || { echo "redis-server not found on PATH (Debian: apt-get install redis-server)" >&2; return 69; }
  EMBEDDED_REDIS_DIR="$(mktemp -d -t jobguard-peers-redis.XXXXXX)"
  local port pid
  local -a pin_cmd=()
  [[ -n "$cpu" ]] && pin_cmd=(taskset -c "$cpu")
  # The port can be taken between picking and binding (other tests pick too):
  # try a few ports, and accept only a server that reports *our* child's pid.
  for _ in 1 2 3 4 5; do
    port="$(_embedded_redis_free_port)"
    "${pin_cmd[@]}" redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
      --dir "$EMBEDDED_REDIS_DIR" --logfile "$EMBEDDED_REDIS_DIR/redis.log" &
    pid=$!
    local _try
    for _try in $(seq 1 100); do
      if ! kill -0 "$pid" 2>/dev/null; then break; fi
      if [[ "$(redis-cli -h 127.0.0.1 -p "$port" --no-auth-warning INFO server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p')" == "$pid" ]]; then
        EMBEDDED_REDIS_PID="$pid"
        # shellcheck disable=SC2034
        EMBEDDED_REDIS_URL="redis://127.0.0.1:$port/0"
        return 0
      fi
      sleep 0.05
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  echo "could not start a private redis-server (log: $EMBEDDED_REDIS_DIR/redis.log)" >&2
  return 69
}
