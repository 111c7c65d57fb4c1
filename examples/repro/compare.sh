#!/usr/bin/env bash
# Runs the two-control-plane reproduction in every mode, side by side, and prints a table per
# scenario: convergence time, NACKs and retry rounds.
#   A. Mesh refused for an outage (the zone's database then refuses its policies too), swept over
#      outages of 1, 3, 10 and 30 s: how long a new MeshTimeout takes once the Mesh can land.
#   B. Three policy kinds refused for 60 s, MeshTimeout healthy: how long a valid MeshTimeout
#      waits behind the failing kinds on the same stream (the Kuma 2.3-2.7 stall).
#
#   examples/repro/compare.sh [--quick] [--outage 5s]... [--runs 3] [--only-a] [--svg DIR]
#
# --quick sweeps 1 s and 3 s only; --outage (repeatable) sweeps the outages given instead;
# --runs N runs each row N times and prints the medians; --only-a skips scenario B.
# --svg DIR (default bench-results/repro) is where each scenario's timeline goes, beside its
# table: one SVG per scenario and outage (A-mesh-3s.svg, B-three-kinds-60s.svg), a panel per
# mode (its first run) with the zone's NACKs, the retry rounds, the outage and the moment of
# convergence (examples/repro/timeline draws them from two-cp.sh --timeline), and compare.md
# with the tables and the SVGs.
# "rounds/s after 5 s" is the retry rounds the global fired from 5 s after the apply until the
# zone had ACKed everything, per second: what a zone in a long outage is sent by the timer alone.
set -euo pipefail
cd "$(dirname "$0")/../.."

outages=() runs=1 only_a=0 svg_dir=bench-results/repro
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) outages=(1s 3s); shift ;;
    --outage) outages+=("$2"); shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --only-a) only_a=1; shift ;;
    --svg) svg_dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#outages[@]} -gt 0 ] || outages=(1s 3s 10s 30s)
make -s build >/dev/null

# median of the numbers on stdin ("-" when there are none)
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
field() { printf '%s\n' "$1" | sed -n "s/.* $2=\([^ ]*\).*/\1/p"; }

# row LABEL OUTAGE two-cp.sh-options...: runs the mode $runs times, appends one table row; the
# first run's timeline joins the SVG of the current group (timelines GROUP TITLE).
row() {
  local label=$1 outage=$2; shift 2
  local out results=() conv=yes tl_args=()
  group_n=$((group_n + 1))
  tl_args=(--timeline "$tl_dir/$group/$(printf '%02d' "$group_n").txt")
  for _ in $(seq 1 "$runs"); do
    if out=$(examples/repro/two-cp.sh --no-build --label "$label" "$@" ${tl_args[@]+"${tl_args[@]}"} 2>&1); then :; fi
    tl_args=()
    printf '%s\n' "$out" | grep -v '^RESULT' | grep -v '^[0-9TZ:.-]* \[' >&2 || true
    local r
    r=$(printf '%s\n' "$out" | grep '^RESULT' || echo "RESULT label=$label converged=error")
    results+=("$r")
    [ "$(field "$r" converged)" = yes ] || conv=no
  done
  [ "$conv" = yes ] || failed=1
  col() { for r in "${results[@]}"; do field "$r" "$1"; done | grep -v '^$' | median; }
  local rate
  rate=$(for r in "${results[@]}"; do
    awk -v n="$(field "$r" late_rounds)" -v s="$(field "$r" late_seconds)" 'BEGIN { if (s > 0) printf "%.2f\n", n / s }'
  done | median)
  printf '| %-6s | %-36s | %-9s | %-8s | %-5s | %-12s | %-6s | %-18s |\n' "$outage" "$label" "$conv" "$(col seconds)" \
    "$(col nacks)" "$(col policy_nacks)" "$(col rounds)" "$rate"
}
header() {
  printf '| %-6s | %-36s | %-9s | %-8s | %-5s | %-12s | %-6s | %-18s |\n' "outage" "mode" "converged" "time (s)" "NACKs" "policy NACKs" "rounds" "rounds/s after 5 s"
  printf '|%s|%s|%s|%s|%s|%s|%s|%s|\n' "--------" "--------------------------------------" "-----------" "----------" "-------" "--------------" "--------" "--------------------"
}
failed=0
tables=$(mktemp -d "${TMPDIR:-/tmp}/kds-compare.XXXXXX")
trap 'rm -rf "$tables"' EXIT
tl_dir="$tables/timelines" group="" group_n=0 svgs_a=() svgs_b=()
mkdir -p "$svg_dir"
svg_dir=$(cd "$svg_dir" && pwd)
# timelines GROUP: the rows that follow draw their timelines into GROUP's SVG (draw GROUP TITLE)
timelines() { group=$1 group_n=0; mkdir -p "$tl_dir/$group"; }
draw() {
  if ${GO:-go} run ./examples/repro/timeline -o "$svg_dir/$1.svg" -title "$2" "$tl_dir/$1"/*.txt; then
    echo "$svg_dir/$1.svg"
  else
    echo "compare.sh: no timeline SVG for $1" >&2
  fi
}

header >"$tables/a"
for o in "${outages[@]}"; do
  echo "#### A. Mesh refused for $o" >&2
  timelines "A-mesh-$o"
  row "blocking per type (Kuma 2.3-2.7)" "$o" --outage "$o" --emulate blocking-per-type >>"$tables/a"
  row "blocking per stream (upstream fix)" "$o" --outage "$o" --emulate blocking-per-stream >>"$tables/a"
  row "async retry, built-in policy" "$o" --outage "$o" >>"$tables/a"
  row "async retry, retry-forcer plugin" "$o" --outage "$o" --plugin ./bin/retry-forcer >>"$tables/a"
  row "async retry + owner-check" "$o" --outage "$o" --owner-holds >>"$tables/a"
  row "async retry, plain xDS zone (Kuma's)" "$o" --outage "$o" --zone-flag --plain-xds >>"$tables/a"
  svg=$(draw "A-mesh-$o" "A. Mesh refused for $o: time from the apply until the zone holds 3 MeshTimeouts")
  [ -z "$svg" ] || svgs_a+=("$svg")
done
table_a=$(cat "$tables/a")

if [ "$only_a" = 0 ]; then
  echo "#### B. Three policy kinds refused, MeshTimeout healthy: does a valid update wait?" >&2
  b=(--outage MeshRetry=60s --outage MeshCircuitBreaker=60s --outage MeshHealthCheck=60s --apply examples/resources/meshhealthcheck.yaml)
  header >"$tables/b"
  timelines "B-three-kinds-60s"
  row "blocking per type (Kuma 2.3-2.7)" "60s x3" "${b[@]}" --emulate blocking-per-type >>"$tables/b"
  row "blocking per stream (upstream fix)" "60s x3" "${b[@]}" --emulate blocking-per-stream >>"$tables/b"
  row "async retry, built-in policy" "60s x3" "${b[@]}" >>"$tables/b"
  row "async retry, retry-forcer plugin" "60s x3" "${b[@]}" --plugin ./bin/retry-forcer >>"$tables/b"
  table_b=$(cat "$tables/b")
  svg=$(draw "B-three-kinds-60s" "B. MeshRetry, MeshCircuitBreaker and MeshHealthCheck refused for 60 s, MeshTimeout healthy")
  [ -z "$svg" ] || svgs_b+=("$svg")
fi

runs_note=""
[ "$runs" -gt 1 ] && runs_note=" (medians of $runs runs; the timelines are each mode's first run)"
report() { # the tables, and the timeline SVGs beside them (as Markdown images with --md)
  echo "A. Mesh refused for ${outages[*]}; time from applying the MeshTimeout until the zone holds 3$runs_note:"
  echo "$table_a"
  for f in ${svgs_a[@]+"${svgs_a[@]}"}; do
    if [ "${1:-}" = --md ]; then echo; echo "![timeline: $(basename "$f" .svg)]($(basename "$f"))"; else echo "timeline: $f"; fi
  done
  if [ "$only_a" = 0 ]; then
    echo
    echo "B. MeshRetry, MeshCircuitBreaker and MeshHealthCheck refused for 60 s; time from applying the MeshTimeout until the zone holds 3$runs_note:"
    echo "$table_b"
    for f in ${svgs_b[@]+"${svgs_b[@]}"}; do
      if [ "${1:-}" = --md ]; then echo; echo "![timeline: $(basename "$f" .svg)]($(basename "$f"))"; else echo "timeline: $f"; fi
    done
  fi
}
report --md >"$svg_dir/compare.md"
report
echo "(tables and timelines also in $svg_dir/compare.md)"
exit $failed
