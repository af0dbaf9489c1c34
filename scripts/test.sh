#!/usr/bin/env bash
# The whole test suite, as CI runs it, on a fresh Debian 12 machine:
#  1. installs the Debian packages it needs (as root),
#  2. builds everything (library, CLI, tests, benchmarks) with warnings as
#     errors under AddressSanitizer + UndefinedBehaviorSanitizer, and runs every
#     test there: unit, integration against private redis-server/PostgreSQL
#     processes the fixtures start, CLI tests against the real binary, the
#     fault and interop tests,
#  3. rebuilds what the concurrency tests need under ThreadSanitizer, as a
#     Redis-only build (no PostgreSQL), and runs them (label tsan),
#  4. builds the libFuzzer harnesses with clang (fuzz/, only the sources they
#     exercise) and runs each for 30 s, two at a time (scripts/fuzz.sh),
#  5. builds the Debian package (scripts/package.sh: Release, no debug
#     information, no tests), installs it with dpkg -i, checks it and builds
#     the consumer projects (tests/consumer/) against the installed files,
#     runs them, then removes it (scripts/package-test.sh).
# The builds of 3 and 4, and all of 5, run in the background, niced, while
# 2's tests run.
# One sanitized build serves the whole suite. A second, unsanitized build ran
# the same tests again and cost a third of CI's time; it is still here as
# JOBGUARD_TEST_QUICK=1, and the optimized build is what `scripts/demo.sh` and
# the benchmarks use.
# Set JOBGUARD_TEST_QUICK=1 for a plain (unsanitized, -Werror) build and run
# of the suite only.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/deps.sh
jobs=$(nproc)
status=0

run_suite() {  # dir [ctest args...]
  local dir=$1; shift
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 300 "$@" || { digest+=("$dir"); return 1; }
}

# The failed tests' own words again, at the end of the output: a CI log is
# often read from its tail, and the suite's later stages push a failure's
# output far up.
digest=()
print_digest() {
  local dir name
  for dir in "${digest[@]}"; do
    [ -f "$dir/Testing/Temporary/LastTestsFailed.log" ] || continue
    while IFS=: read -r _ name; do
      echo "-- failed: $name ($dir)"
      awk -v t="Testing: $name" '$0 ~ t"$" {on=1; next} on && /^<end of output>/ {exit} on' \
        "$dir/Testing/Temporary/LastTest.log" |
        grep -E -A8 "Failure|ERROR|runtime error|Sanitizer|Timeout|terminate" | head -n 80 || true
    done <"$dir/Testing/Temporary/LastTestsFailed.log"
  done
}

if [ "${JOBGUARD_TEST_QUICK:-0}" = 1 ]; then
  echo "== build (RelWithDebInfo, -Werror) ($(date +%T))"
  bash scripts/build.sh "$root/build"
  echo "== test ($(date +%T))"
  run_suite "$root/build" || status=1
  print_digest
  echo "== done ($(date +%T))"
  exit $status
fi

# The sanitized trees link ~100 test binaries: lld links them in half
# ld.bfd's time, and with the library's parts as shared libraries
# (BUILD_SHARED_LIBS) each binary is its own objects, not the whole library
# again (tens of MB written per binary, not hundreds). The package and the
# user's builds keep the default: static libraries, ld.bfd. The consumer
# tests build against what the package ships, static libraries, so a shared
# tree leaves them to scripts/package-test.sh (tests/CMakeLists.txt).
# Both also compile the library, the CLI and the bench harness as unity
# batches (JOBGUARD_UNITY_BUILD): half the compile time of those parts.
sanitized_tree=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld -DJOBGUARD_UNITY_BUILD=ON
                -DBUILD_SHARED_LIBS=ON)
# Line tables only (-g1): sanitizer reports keep file:line, and the build
# writes a fraction of the debug information.
echo "== build (Debug, ASan+UBSan, -Werror) ($(date +%T))"
bash scripts/build.sh "$root/build-asan" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 \
  "-DJOBGUARD_SANITIZE=address;undefined" "${sanitized_tree[@]}"
# The suite spends much of its time waiting on servers and child processes:
# the TSan and fuzz builds use the idle cores meanwhile, at the lowest
# priority so the tests keep theirs. They die with this script.
echo "== build (TSan, what the concurrency tests need; fuzz harnesses), in the background ($(date +%T))"
# Its own process group (setsid), so the EXIT trap stops ninja and the
# compilers too, not only the shell that started them.
# A new session (setsid) is a new scheduling autogroup where the kernel has
# them (sched_autogroup_enabled): CPU is then shared between the groups, and
# nice only orders the processes inside one, so a background group at nice 19
# took as much CPU as the tests' own session. Each background group's own
# nice is lowered too (/proc/self/autogroup).
# The TSan tree is also the Redis-only build (no PostgreSQL: no tsan test
# needs it): every part the tsan tests link (lock, guard, job, ops) and the
# CLI's side of its PostgreSQL seam compile without libpq/libpqxx, and no
# object of the tree includes their headers. (The whole CLI is not linked
# there: a tenth of CI's time for what the seam already shows.)
setsid nice -n 19 bash -c '
  set -euo pipefail
  echo 19 >/proc/self/autogroup 2>/dev/null || true  # see above
  cmake -S "$1" -B "$1/build-tsan" -G Ninja -DJOBGUARD_WERROR=ON -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DJOBGUARD_SANITIZE=thread -DJOBGUARD_BUILD_BENCH=OFF \
    -DJOBGUARD_WITH_POSTGRES=OFF "${@:2}" >/dev/null
  ninja -C "$1/build-tsan" jobguard_tsan_tests apps/jobguard/CMakeFiles/jobguard_cli.dir/postgres_off.cpp.o
  if ninja -C "$1/build-tsan" -t deps | grep -E "pqxx|libpq-fe"; then
    echo "the Redis-only (TSan) tree includes a PostgreSQL header"
    exit 1
  fi
  echo "Redis-only build: lock, guard, job, ops and the CLI seam without libpq/libpqxx"
  JOBGUARD_FUZZ_BUILD_ONLY=1 bash "$1/scripts/fuzz.sh"' _ "$root" "${sanitized_tree[@]}" >"$root/build-background.log" 2>&1 &
background=$!
echo "== Debian package: build, install, test, remove; in the background ($(date +%T))"
setsid nice -n 19 bash -c '
  set -euo pipefail
  echo 19 >/proc/self/autogroup 2>/dev/null || true  # see above
  bash "$1/scripts/package.sh"
  bash "$1/scripts/package-test.sh"
' _ "$root" >"$root/build-package.log" 2>&1 &
package=$!
# A group that already ended makes kill fail: nothing to stop. The jobs' own
# results are read by the `wait`s below, not here.
trap 'kill -- "-$background" 2>/dev/null || true; kill -- "-$package" 2>/dev/null || true' EXIT

echo "== test (ASan+UBSan) ($(date +%T))"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  LSAN_OPTIONS="suppressions=$root/tests/lsan.supp" \
  run_suite "$root/build-asan" || status=1

echo "== waiting for the background builds ($(date +%T))"
if ! wait "$background"; then
  cat "$root/build-background.log"
  echo "the TSan/fuzz build failed (log above)"
  exit 1
fi
if ! wait "$package"; then
  cat "$root/build-package.log"
  echo "the Debian package's build or test failed (log above)"
  exit 1
fi
trap - EXIT
tail -n 2 "$root/build-package.log"
tail -n 3 "$root/build-background.log"
echo "== test (TSan, concurrency tests) ($(date +%T))"
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 run_suite "$root/build-tsan" -L tsan || status=1

echo "== fuzz (30 s per harness, two at a time) ($(date +%T))"
bash scripts/fuzz.sh 30 || status=1
print_digest
echo "== done ($(date +%T))"
exit $status
