#!/usr/bin/env bash
# Installs what `make test` needs and a fresh machine lacks: protoc (protobuf-compiler), the
# PostgreSQL 15 server binaries (postgresql-15) and, as root, the postgres user initdb insists
# on, Node.js and npm, Chromium (the status page test), curl, runuser (util-linux), promtool
# (prometheus: the alerting rules' tests in deploy/; the package also installs, and on a machine
# run by systemd starts, a Prometheus server on :9090: `systemctl disable --now prometheus`).
#
#   scripts/setup-test-deps.sh [--check]
#
# As root it installs what is missing from Debian (apt-get update once, then one apt-get
# install); as another user it prints the one command to run and exits 1. When everything is
# there it changes nothing and returns at once; `make test` runs it first, .ci/run through
# `make test`. --check only reports (exit 1 when something is missing).
# KDS_SKIP_TEST_DEPS=1 skips it: the tests that need a missing tool then skip (or fail under
# CI=true). KDS_TEST_POSTGRES_BIN, KDS_TEST_POSTGRES_DSN and KDS_SKIP_POSTGRES (host/store/pgtest)
# and KDS_CHROMIUM (the status page test) count as having that tool.
set -euo pipefail

check=0
case "${1:-}" in
  --check) check=1 ;;
  -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "setup-test-deps.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
esac
if [ "${KDS_SKIP_TEST_DEPS:-}" = 1 ]; then
  echo "setup-test-deps: skipped (KDS_SKIP_TEST_DEPS=1)"
  exit 0
fi

have() { command -v "$1" >/dev/null 2>&1; }
postgres_found() {
  [ "${KDS_SKIP_POSTGRES:-}" = 1 ] || [ -n "${KDS_TEST_POSTGRES_DSN:-}" ] && return 0
  local d
  for d in "${KDS_TEST_POSTGRES_BIN:-}" /usr/lib/postgresql/15/bin; do
    [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ] && return 0
  done
  have initdb && have pg_ctl && have postgres && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
}
chromium_found() {
  [ -n "${KDS_CHROMIUM:-}" ] && [ -x "$KDS_CHROMIUM" ] && return 0
  have chromium || have chromium-browser || have google-chrome
}

root=0
[ "$(id -u)" = 0 ] && root=1
missing=() # Debian packages
have protoc || missing+=(protobuf-compiler)
postgres_found || missing+=(postgresql-15)
have node || missing+=(nodejs)
have npm || missing+=(npm)
chromium_found || missing+=(chromium)
have curl || missing+=(curl) # examples/repro/two-cp.sh and the replicas example poll the APIs with it
# deploy/: promtool checks and unit-tests the rules and lints /metrics; the prometheus server runs
# the mixin's rules against a real global and zones (TestARealPrometheusFiresOneAlertPerFault)
have promtool && have prometheus || missing+=(prometheus)
# runuser: as root, examples/replicas runs initdb and psql as the postgres user with it
[ "$root" = 0 ] || have runuser || [ -x /usr/sbin/runuser ] || [ -x /sbin/runuser ] || missing+=(util-linux)
need_user=0 # initdb refuses root: as root the PostgreSQL tests run it as the postgres user
[ "$root" = 1 ] && ! id postgres >/dev/null 2>&1 && need_user=1

if [ ${#missing[@]} -eq 0 ] && [ "$need_user" = 0 ]; then
  exit 0
fi
what="${missing[*]}"
[ "$need_user" = 1 ] && what="${what:+$what, }the postgres user"
if [ "$check" = 1 ]; then
  echo "setup-test-deps: missing: $what" >&2
  exit 1
fi
if [ "$root" = 0 ]; then
  echo "setup-test-deps: the tests need $what; install with:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  echo "(or run 'sudo $0'; KDS_SKIP_TEST_DEPS=1 make test runs without them, skipping what needs them)" >&2
  exit 1
fi
if [ ${#missing[@]} -gt 0 ]; then
  if ! have apt-get; then
    echo "setup-test-deps: the tests need ${missing[*]} (Debian package names) and this machine has no apt-get: install them by hand" >&2
    exit 1
  fi
  echo "setup-test-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "$root" = 1 ] && ! id postgres >/dev/null 2>&1; then # postgresql-15 may have made it
  echo "setup-test-deps: creating the postgres user (initdb refuses root)"
  useradd --system --no-create-home --shell /usr/sbin/nologin postgres
fi
