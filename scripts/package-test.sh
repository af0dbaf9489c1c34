#!/usr/bin/env bash
# scripts/package-test.sh [DEB]: installs the Debian package (default: the one
# scripts/package.sh built) with dpkg -i, checks what a user meets first
# (`jobguard --version`, the man page, the systemd unit, the alert rules),
# builds the consumer projects of tests/consumer/ against the INSTALLED files
# (/usr, not a build tree) and runs them against a private redis-server, then
# removes the package. As root (dpkg); on a machine where scripts/deps.sh has
# installed the package's dependencies. Exit 0: all of it worked.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deb=${1:-$(ls "$root"/build-package/package/jobguard_*.deb)}
if [ "$(id -u)" -ne 0 ]; then
  echo "package-test: must run as root (dpkg -i)" >&2
  exit 77
fi
if dpkg-query -W -f='${Status}' jobguard 2>/dev/null | grep -q "install ok installed"; then
  echo "package-test: a jobguard package is already installed; remove it first (dpkg -r jobguard)" >&2
  exit 1
fi
work=$(mktemp -d /tmp/jobguard-package-test-XXXXXX)
cleanup() {
  # The failure path's removal (the success path removes and checks it below):
  # after a passing run the package is already gone and this one fails, which
  # is expected; a failing run has already reported its own error.
  dpkg -r jobguard >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
# Killed (CI's EXIT trap), it still removes the package: bash runs the EXIT
# trap on exit, not on a fatal signal.
trap 'exit 143' TERM
trap 'exit 130' INT
fail() { echo "package-test: $*" >&2; exit 1; }

echo "== dpkg -i $(basename "$deb")"
dpkg -i "$deb" >/dev/null

echo "== jobguard --version"
[ "$(command -v jobguard)" = /usr/bin/jobguard ] || fail "jobguard on PATH is $(command -v jobguard), not /usr/bin/jobguard"
/usr/bin/jobguard --version | tee "$work/version"
grep -q "^jobguard $(dpkg-query -W -f='${Version}' jobguard)" "$work/version" ||
  fail "jobguard --version does not name the package's version $(dpkg-query -W -f='${Version}' jobguard)"

echo "== man page"
man_page=/usr/share/man/man1/jobguard.1.gz
[ -f "$man_page" ] || fail "no $man_page"
if command -v man >/dev/null; then
  [ "$(man -w jobguard)" = "$man_page" ] || fail "man -w jobguard finds $(man -w jobguard), not $man_page"
fi
# help2man's page carries the subcommands of `jobguard --help`.
zcat "$man_page" > "$work/jobguard.1"
grep -q '^\.TH JOBGUARD "1"' "$work/jobguard.1" || fail "$man_page has no .TH JOBGUARD 1 header"
for cmd in run demo serve; do
  grep -q "^.*\b$cmd\b" "$work/jobguard.1" || fail "$man_page does not mention the $cmd subcommand"
done

echo "== files"
for f in /usr/lib/systemd/system/jobguard-serve.service /usr/share/jobguard/prometheus/jobguard-alerts.yml \
         /usr/share/jobguard/grafana/jobguard-dashboard.json /usr/include/jobguard/jobguard.hpp \
         /usr/include/jobguard/version.hpp; do
  [ -f "$f" ] || fail "the package has no $f"
done
[ -z "$(dpkg -L jobguard | grep -F .test.yml)" ] || fail "the package ships the alert rules' unit tests"
if command -v systemd-analyze >/dev/null; then
  systemd-analyze verify /usr/lib/systemd/system/jobguard-serve.service
fi

echo "== consumers against the installed package"
run_consumer() {  # STEP [SOURCE_DIR]
  cmake -DSTEP="$1" -DSOURCE_DIR="${2:-}" -DPREFIX=/usr -DWORK_DIR="$work/consumer" -DREADME="$root/README.md" \
    -DSANITIZE_FLAGS= -P "$root/tests/consumer/run_consumer.cmake"
}
run_consumer installed "$root/tests/consumer/harness"
run_consumer readme_example
run_consumer lock_only "$root/tests/consumer/lock_only"
run_consumer asio_deprecated "$root/tests/consumer/asio_deprecated"

echo "== dpkg -r jobguard"
dpkg -r jobguard >/dev/null
[ ! -e /usr/bin/jobguard ] || fail "/usr/bin/jobguard is still there after dpkg -r"
echo "package-test: ok"
