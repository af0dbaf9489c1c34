#!/usr/bin/env bash
# The whole test suite, as CI runs it, on a fresh Debian 12 machine:
#  1. installs the Debian packages it needs (as root),
#  2. builds with warnings as errors and runs every test (unit, integration
#     against private redis-server/PostgreSQL processes the fixtures start,
#     CLI tests against the real binary, the installed-package consumer),
#  3. rebuilds under AddressSanitizer + UndefinedBehaviorSanitizer and runs
#     the suite again,
#  4. rebuilds under ThreadSanitizer and runs the concurrency tests (label tsan),
#  5. builds the libFuzzer harnesses with clang (fuzz/, only the sources they
#     exercise) and runs each for 30 s, two at a time (scripts/fuzz.sh).
# Set JOBGUARD_TEST_QUICK=1 to skip 3, 4 and 5.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/deps.sh
jobs=$(nproc)
status=0

run_suite() {  # dir label-regex
  local dir=$1; shift
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 300 "$@"
}

echo "== build (RelWithDebInfo, -Werror) ($(date +%T))"
bash scripts/build.sh "$root/build"
echo "== test ($(date +%T))"
run_suite "$root/build" || status=1

if [ "${JOBGUARD_TEST_QUICK:-0}" != 1 ]; then
  echo "== build (ASan+UBSan) ($(date +%T))"
  bash scripts/build.sh "$root/build-asan" -DCMAKE_BUILD_TYPE=Debug "-DJOBGUARD_SANITIZE=address;undefined" -DJOBGUARD_BUILD_BENCH=OFF
  echo "== test (ASan+UBSan) ($(date +%T))"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_suite "$root/build-asan" -LE nosan || status=1
  echo "== build (TSan) ($(date +%T))"
  cmake -S "$root" -B "$root/build-tsan" -G Ninja -DJOBGUARD_WERROR=ON -DCMAKE_BUILD_TYPE=Debug \
    -DJOBGUARD_SANITIZE=thread -DJOBGUARD_BUILD_BENCH=OFF >/dev/null
  ninja -C "$root/build-tsan" jobguard_tsan_tests
  echo "== test (TSan, concurrency tests) ($(date +%T))"
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 run_suite "$root/build-tsan" -L tsan || status=1
  echo "== fuzz (30 s per harness, two at a time) ($(date +%T))"
  bash scripts/fuzz.sh 30 || status=1
fi
echo "== done ($(date +%T))"
exit $status
