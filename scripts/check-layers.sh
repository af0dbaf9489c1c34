#!/usr/bin/env bash
# scripts/check-layers.sh [ROOT]: fails when a part of the library includes a
# header of a part above it (docs/architecture.md, "Layers and targets").
#
# The order, lowest first:
#   common < redis < observe < lock < guard < pg < job < ops < the CLI
# and testing (the EmbeddedRedis fixture), which may include common only and
# which no library part may include.
#
# Folder = part: src/<part>/ builds into jobguard_<part> and nothing else, its
# public headers are include/jobguard/<part>/ (common's and lock's also
# directly in include/jobguard/, listed below). A .cpp in src/<part>/ that
# src/<part>/CMakeLists.txt does not build into jobguard_<part>, or a
# target_sources() there for another part, is a problem. Every #include "…"
# in src/ and include/jobguard/ is checked: the includer's part must not be
# below the included header's.
#
# Exit 0: no upward include. Exit 1: each upward include on one line (file,
# its part, the header, its part), or a file the script cannot place (a .cpp
# in no target_sources(), a header it cannot resolve, a new top-level public
# header it has no part for): add it here, in the part it belongs to.
set -euo pipefail
root=$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}" && pwd)
cd "$root"

declare -A level=([common]=0 [redis]=1 [observe]=2 [lock]=3 [guard]=4 [pg]=5 [job]=6 [ops]=7 [testing]=0)

# Public headers directly under include/jobguard/, by part. jobguard.hpp is
# the umbrella header: it may include anything, and nothing may include it.
declare -A top=([error.hpp]=common [duration.hpp]=common [clock.hpp]=common [text.hpp]=common
                [version.hpp]=common [lock.hpp]=lock [lease.hpp]=lock [admin.hpp]=lock [semaphore.hpp]=lock [rwlock.hpp]=lock
                [async.hpp]=lock [quorum.hpp]=lock [multilock.hpp]=lock)

# The contracts between parts (include/jobguard/detail/), by the part that
# defines them.
declare -A detail=([identity.hpp]=common [lock_compose.hpp]=lock [guard_scripts.hpp]=guard
                   [completion_parts.hpp]=guard)

# Known edges that look upward and are not: pg's public header sits in the
# guard folder and declares the value types (PgOptions, FenceCompare,
# FenceOutcome) that guard's own headers use; pg's classes declared next to
# guard's (PgCompletionStore, PgIdempotencyStore) are defined only in pg's
# sources. guard does not link pg, so guard code that called into pg would
# fail to link (tests/consumer builds a lock-only program). "includer header".
allowed_edges=" include/jobguard/guard/completion.hpp>include/jobguard/guard/postgres.hpp
 include/jobguard/guard/fence_check.hpp>include/jobguard/guard/postgres.hpp
 include/jobguard/guard/idempotency.hpp>include/jobguard/guard/postgres.hpp "

problems=()

# Which target each source builds into: src/<dir>/<file>.cpp -> part, which
# must be <dir>.
declare -A target_of
for cml in src/*/CMakeLists.txt; do
  dir=${cml%/CMakeLists.txt}
  # Join the file, then take every target_sources(jobguard_<part> ...) call.
  while read -r part files; do
    [[ $part == "${dir#src/}" ]] ||
      problems+=("$cml: target_sources(jobguard_$part ...): src/${dir#src/}/ builds jobguard_${dir#src/} only (folder = part)")
    for f in $files; do
      [[ $f == *.cpp ]] && target_of[$dir/$f]=$part
    done
  done < <(tr '\n' ' ' < "$cml" | grep -oE 'target_sources\(jobguard_[a-z]+[^)]*\)' |
           sed -E 's/^target_sources\(jobguard_([a-z]+) (PRIVATE|PUBLIC|INTERFACE) ?/\1 /; s/\)$//')
done
while IFS= read -r f; do
  [[ -n ${target_of[$f]:-} ]] || problems+=("$f: in no target_sources() of src/*/CMakeLists.txt")
done < <(find src -name '*.cpp' | sort)

# Every file's #include "…" edges, resolved as the compiler does: the
# includer's folder, then src/ and include/ (version.hpp is generated into the
# build tree).
declare -A edges part
files=()
while IFS= read -r file; do
  files+=("$file")
  list=""
  while IFS= read -r name; do
    [[ -n $name ]] || continue
    if [[ $name == jobguard/version.hpp ]]; then path=include/jobguard/version.hpp
    elif [[ -f ${file%/*}/$name ]]; then path=${file%/*}/$name
    elif [[ -f src/$name ]]; then path=src/$name
    elif [[ -f include/$name ]]; then path=include/$name
    else problems+=("$file: #include \"$name\" resolves to no file under src/ or include/"); continue
    fi
    list+=" $path"
  done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/p' "$file")
  edges[$file]="$list "
done < <(find src include/jobguard \( -name '*.cpp' -o -name '*.hpp' \) | sort)

# Each file's part: its folder's (src/<part>/, include/jobguard/<part>/); the
# tables above for include/jobguard/*.hpp and include/jobguard/detail/.
part[include/jobguard/version.hpp]=common
for file in "${files[@]}"; do
  case $file in
    include/jobguard/jobguard.hpp) part[$file]=umbrella ;;
    include/jobguard/detail/*) part[$file]=${detail[${file##*/}]:-?} ;;
    include/jobguard/*/*) dir=${file#include/jobguard/}; part[$file]=${dir%%/*} ;;
    include/jobguard/*) part[$file]=${top[${file##*/}]:-?} ;;
    src/*/*) dir=${file#src/}; part[$file]=${dir%%/*} ;;
    *) part[$file]="?" ;;
  esac
done

for file in "${files[@]}"; do
  from=${part[$file]}
  [[ $from == umbrella ]] && continue
  if [[ -z ${level[$from]:-} ]]; then problems+=("$file: no part for it (add it to scripts/check-layers.sh)"); continue; fi
  for path in ${edges[$file]}; do
    to=${part[$path]:-?}
    name=${path#include/}
    if [[ $to == umbrella ]]; then problems+=("$file ($from) includes the umbrella header $name"); continue; fi
    if [[ -z ${level[$to]:-} ]]; then problems+=("$path: no part for it (add it to scripts/check-layers.sh)"); continue; fi
    [[ $allowed_edges == *" $file>$path"* ]] && continue
    if [[ $to == testing && $from != testing ]]; then
      problems+=("$file ($from) includes $name (testing): no library part may include the test fixture")
    elif [[ $from == testing && $to != testing && $to != common ]]; then
      problems+=("$file (testing) includes $name ($to): testing may include common only")
    elif (( ${level[$to]} > ${level[$from]} )); then
      problems+=("$file ($from) includes $name ($to): $from is below $to")
    fi
  done
done

if ((${#problems[@]})); then
  printf 'check-layers: %s\n' "${problems[@]}" >&2
  echo "check-layers: ${#problems[@]} problem(s); the order is common < redis < observe < lock < guard < pg < job < ops < CLI (docs/architecture.md)" >&2
  exit 1
fi
echo "check-layers: no upward include in src/ and include/jobguard/"
