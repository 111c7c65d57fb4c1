#!/usr/bin/env bash
# Runs the two-control-plane reproduction in every mode, one after the other, in two scenarios,
# and prints a table for each: convergence time, NACKs and retry rounds.
#   A. Mesh refused for 3 s (the zone's database then refuses its policies too): how long a new
#      MeshTimeout takes once the Mesh can land.
#   B. Three policy kinds refused for 60 s, MeshTimeout healthy: how long a valid MeshTimeout
#      waits behind the failing kinds on the same stream (the Kuma 2.3-2.7 stall).
# Options are passed to every run of scenario A (e.g. --outage 5s).
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s build >/dev/null
run() { # label, then two-cp.sh options
  local label=$1; shift
  local out
  if out=$(examples/repro/two-cp.sh --no-build --label "$label" "$@" "${extra[@]}" 2>&1); then :; fi
  printf '%s\n' "$out" | grep -v '^RESULT' | grep -v '^[0-9TZ:.-]* \[' || true
  results+=("$(printf '%s\n' "$out" | grep '^RESULT' || echo "RESULT label=$label converged=error seconds=- nacks=- rounds=-")")
  echo
}
table() { # the results so far, as a Markdown table
  printf '| %-36s | %-9s | %-8s | %-5s | %-12s | %-6s |\n' "mode" "converged" "time (s)" "NACKs" "policy NACKs" "rounds"
  printf '|%s|%s|%s|%s|%s|%s|\n' "--------------------------------------" "-----------" "----------" "-------" "--------------" "--------"
  for r in "${results[@]}"; do
    label=$(printf '%s\n' "$r" | sed -n 's/^RESULT label=\(.*\) converged=.*/\1/p')
    conv=$(field "$r" converged)
    [ "$conv" = yes ] || failed=1
    printf '| %-36s | %-9s | %-8s | %-5s | %-12s | %-6s |\n' "$label" "$conv" "$(field "$r" seconds)" "$(field "$r" nacks)" "$(field "$r" policy_nacks)" "$(field "$r" rounds)"
  done
}
field() { printf '%s\n' "$1" | sed -n "s/.* $2=\([^ ]*\).*/\1/p"; }
failed=0

echo "#### A. Mesh refused for a while: a new MeshTimeout cannot land before its Mesh"
extra=("$@")
results=()
run "blocking per type (Kuma 2.3-2.7)" --emulate blocking-per-type
run "blocking per stream (upstream fix)" --emulate blocking-per-stream
run "async retry, built-in policy"
run "async retry, retry-forcer plugin" --plugin ./bin/retry-forcer
run "async retry + owner-check" --owner-holds
table_a=$(table)

echo "#### B. Three policy kinds refused, MeshTimeout healthy: does a valid update wait?"
extra=(--outage MeshRetry=60s --outage MeshCircuitBreaker=60s --outage MeshHealthCheck=60s
  --apply examples/resources/meshhealthcheck.yaml)
results=()
run "blocking per type (Kuma 2.3-2.7)" --emulate blocking-per-type
run "blocking per stream (upstream fix)" --emulate blocking-per-stream
run "async retry, built-in policy"
run "async retry, retry-forcer plugin" --plugin ./bin/retry-forcer
table_b=$(table)

echo "A. Mesh refused for ${A_OUTAGE:-3s}; time from applying the MeshTimeout until the zone holds 3:"
echo "$table_a"
echo
echo "B. MeshRetry, MeshCircuitBreaker and MeshHealthCheck refused; time from applying the MeshTimeout until the zone holds 3:"
echo "$table_b"
exit $failed
