#!/usr/bin/env bash
# Runs the two-control-plane reproduction in every mode, one after the other, and prints a table
# of convergence time, NACKs and retry rounds. Options are passed to every run (e.g. --outage 5s).
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s build >/dev/null
results=()
run() { # label, then two-cp.sh options
  local label=$1; shift
  local out
  if out=$(examples/repro/two-cp.sh --no-build --label "$label" "$@" "${extra[@]}" 2>&1); then :; fi
  printf '%s\n' "$out" | grep -v '^RESULT' | grep -v '^[0-9TZ:.-]* \[' || true
  results+=("$(printf '%s\n' "$out" | grep '^RESULT' || echo "RESULT label=$label converged=error seconds=- nacks=- rounds=-")")
  echo
}
extra=("$@")
run "blocking per type (Kuma 2.3-2.7)" --emulate blocking-per-type
run "blocking per stream (upstream fix)" --emulate blocking-per-stream
run "async retry, built-in policy" 
run "async retry, retry-forcer plugin" --plugin ./bin/retry-forcer
run "async retry + owner-check" --owner-holds

field() { printf '%s\n' "$1" | sed -n "s/.* $2=\([^ ]*\).*/\1/p"; }
printf '| %-36s | %-9s | %-12s | %-5s | %-6s |\n' "mode" "converged" "time (s)" "NACKs" "rounds"
printf '|%s|%s|%s|%s|%s|\n' "--------------------------------------" "-----------" "--------------" "-------" "--------"
failed=0
for r in "${results[@]}"; do
  label=$(printf '%s\n' "$r" | sed -n 's/^RESULT label=\(.*\) converged=.*/\1/p')
  conv=$(field "$r" converged)
  [ "$conv" = yes ] || failed=1
  printf '| %-36s | %-9s | %-12s | %-5s | %-6s |\n' "$label" "$conv" "$(field "$r" seconds)" "$(field "$r" nacks)" "$(field "$r" rounds)"
done
exit $failed
