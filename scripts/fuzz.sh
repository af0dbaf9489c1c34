#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/) with clang in their own build dir and
# runs each for SECONDS (default 30) on its committed seed corpus, two at a
# time. A finding (crash, leak, timeout, out-of-memory) fails the script and
# leaves the reproducer in build-fuzz/findings/<harness>/.
#   scripts/fuzz.sh 30               # all harnesses, 30 s each
#   scripts/fuzz.sh 600 url_fuzzer   # one harness, 10 minutes
# New inputs that grow coverage go to build-fuzz/corpus/<harness>/ (not to
# the committed seeds; copy interesting ones to fuzz/corpus/ by hand).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-30}
shift || true
build=${JOBGUARD_FUZZ_BUILD:-$root/build-fuzz}
all=(url_fuzzer duration_fuzzer resp_fuzzer http_fuzzer)
[ $# -gt 0 ] && harnesses=("$@") || harnesses=("${all[@]}")
parallel=${JOBGUARD_FUZZ_PARALLEL:-2}

launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
CC=clang CXX=clang++ cmake -S "$root/fuzz" -B "$build" -G Ninja "${launcher[@]}" >/dev/null
ninja -C "$build" -j "$(nproc)" "${harnesses[@]}"
# JOBGUARD_FUZZ_BUILD_ONLY=1: build the harnesses and stop (scripts/test.sh
# builds them while the sanitized suite runs).
[ "${JOBGUARD_FUZZ_BUILD_ONLY:-0}" = 1 ] && exit 0

run_one() {  # harness
  local h=$1 seeds=$root/fuzz/corpus/${1%_fuzzer}
  local corpus=$build/corpus/$h findings=$build/findings/$h
  mkdir -p "$corpus" "$findings"
  # -rss_limit_mb/-malloc_limit_mb: a reply or request that makes us
  # allocate gigabytes is a finding, not a slow run.
  if "$build/$h" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
       -print_final_stats=1 -artifact_prefix="$findings/" "$corpus" "$seeds" >"$build/$h.log" 2>&1; then
    echo "fuzz: $h ok: $(grep -E '^stat::number_of_executed_units|^stat::average_exec_per_sec' "$build/$h.log" |
      tr '\n' ' ') corpus $(find "$corpus" -type f | wc -l) files"
  else
    echo "fuzz: $h FOUND A PROBLEM (log: $build/$h.log, reproducer in $findings/):"
    grep -E 'ERROR|SUMMARY|invariant|==[0-9]+==' "$build/$h.log" | head -5
    return 1
  fi
}

status=0
pids=()
for h in "${harnesses[@]}"; do
  run_one "$h" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$parallel" ]; then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
