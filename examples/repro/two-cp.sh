#!/usr/bin/env bash
# Reproduces the Kuma 2.3-2.7 retry stall with two real control planes on loopback, and shows
# the fix. A global and a zone start with fresh SQLite data; the zone's "admission webhook" for
# Mesh is down for --outage, so the zone refuses Mesh and its database refuses every policy of
# the mesh. Once the rejection shows, a new MeshTimeout is applied on the global, and the script
# times how long the zone takes to hold 3 MeshTimeouts (2 defaults and the new one).
#
#   examples/repro/two-cp.sh [--emulate blocking-per-type|blocking-per-stream] [--plugin PATH]...
#                            [--owner-holds] [--outage 3s|KIND=DURATION]... [--nack-backoff 5s] [--timeout 120]
#                            [--port-base 25680] [--no-build] [--label NAME] [--global-flag ARG]...
#                            [--zone-flag ARG]... [--timeline FILE]
#
# --outage DURATION is an outage of Mesh (the default, 3s); --outage KIND=DURATION, repeatable,
# takes down the admission of other kinds instead, e.g. three policy kinds, which leaves the
# MeshTimeout healthy: then the time measures how long a valid update waits behind the failures.
# --apply FILE applies more resources on the global before the zone starts (repeatable).
# --global-flag passes one more flag to the global (e.g. --global-flag --plugin-config=builtin=FILE),
# --zone-flag one more to the zone (e.g. --zone-flag --plain-xds, a zone that acts as Kuma's).
# KDS_BIN names the folder of the binaries (default ./bin).
# It prints a timeline and a last line `RESULT label=... converged=yes seconds=... nacks=...
# policy_nacks=... rounds=... late_rounds=... late_seconds=...` (policy_nacks: NACKs of every kind
# but Mesh; late_rounds: the retry rounds fired from 5 s after the apply until convergence, over
# late_seconds), stops every process it started (also on Ctrl-C and on failure), and exits 1 when
# the zone did not converge within --timeout seconds.
# --timeline FILE also writes the timeline, machine-readable, to FILE: a line `# label=...
# outage=...`, then `t=SECONDS timeouts=N nacks=X rounds=Y` (seconds since the zone started)
# each time one of them changed, and `t=SECONDS event=zone-up|rejection|applied|converged`;
# examples/repro/timeline draws it (compare.sh does). Sampling costs each poll two more requests.
set -euo pipefail
cd "$(dirname "$0")/../.."

emulate="" outages=() nack_backoff="5s" timeout=120 port_base=25680 build=1 holds=false label=""
plugins=() more=() zmore=() applies=() timeline=""
while [ $# -gt 0 ]; do
  case "$1" in
    --emulate) emulate="$2"; shift 2 ;;
    --plugin) plugins+=("$2"); shift 2 ;;
    --owner-holds) holds=true; shift ;;
    --outage) outages+=("$2"); shift 2 ;;
    --nack-backoff) nack_backoff="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    --port-base) port_base="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --label) label="$2"; shift 2 ;;
    --global-flag) more+=("$2"); shift 2 ;;
    --zone-flag) zmore+=("$2"); shift 2 ;;
    --apply) applies+=("$2"); shift 2 ;;
    --timeline) timeline="$2"; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "two-cp.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#outages[@]} -gt 0 ] || outages=(3s)
outage_args=() outage=""
for o in "${outages[@]}"; do
  case "$o" in *=*) ;; *) o="Mesh=$o" ;; esac
  outage_args+=(--admission-outage "$o")
  outage="${outage:+$outage,}$o"
done
if [ -z "$label" ]; then
  label=${emulate:-async}
  [ ${#plugins[@]} -gt 0 ] && label="$label+plugin"
  [ "$holds" = true ] && label="$label+owner-check"
fi

BIN=${KDS_BIN:-./bin}
if [ "$build" = 1 ]; then make -s build >/dev/null; fi
for b in kds-host; do [ -x "$BIN/$b" ] || { echo "two-cp.sh: $BIN/$b is missing (make build)" >&2; exit 2; }; done

g_diag=$port_base g_api=$((port_base + 1)) g_kds=$((port_base + 5))
z_diag=$((port_base + 100)) z_api=$((port_base + 101))
work=$(mktemp -d "${TMPDIR:-/tmp}/kds-repro.XXXXXX")
pids=()
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  if [ "$code" != 0 ]; then
    echo "--- global log (tail)" >&2; tail -n 15 "$work/global.log" >&2 2>/dev/null || true
    echo "--- zone log (tail)" >&2; tail -n 15 "$work/zone.log" >&2 2>/dev/null || true
  fi
  rm -rf "$work"
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%6.2f", b - a }'; }
wait_ready() { # url what
  for _ in $(seq 1 200); do curl -fsS -m 1 "$1" >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "two-cp.sh: $2 did not become ready ($1)" >&2; exit 1
}
zone_timeouts() {
  "$BIN/kds-host" get meshtimeouts -m default -o json --cp "http://127.0.0.1:$z_api" 2>/dev/null |
    sed -n 's/^  "total": \([0-9]*\).*/\1/p'
}
zone_nacks() { curl -fsS -m 1 "http://127.0.0.1:$z_api/api/zone" 2>/dev/null | sed -n 's/^  "nacks": \([0-9]*\).*/\1/p'; }
policy_nacks() { # NACKs of every kind but Mesh
  curl -fsS -m 1 "http://127.0.0.1:$z_api/api/zone" 2>/dev/null |
    awk '/"nacksByKind"/ { in_map = 1; next } in_map && /}/ { in_map = 0 }
         in_map && !/"Mesh"/ { gsub(/[^0-9]/, "", $2); s += $2 } END { print s + 0 }'
}
retry_rounds() {
  curl -fsS -m 1 "http://127.0.0.1:$g_diag/metrics" 2>/dev/null | awk '/^kds_retry_rounds_total/ { s += $2 } END { print s + 0 }'
}
# The --timeline file: tl_sample [TIMEOUTS] appends a sample when a count changed, tl_event NAME
# an event.
tl_last=""
tl_sample() {
  [ -n "$timeline" ] || return 0
  local c=${1:-} t n r s
  t=$(since "$start" | tr -d ' ')
  [ -n "$c" ] || c=$(zone_timeouts)
  n=$(zone_nacks) r=$(retry_rounds)
  s="timeouts=${c:-0} nacks=${n:-0} rounds=${r:-0}"
  [ "$s" = "$tl_last" ] && return 0
  tl_last=$s
  echo "t=$t $s" >>"$timeline"
}
tl_event() {
  [ -n "$timeline" ] || return 0
  echo "t=$(since "$start" | tr -d ' ') event=$1" >>"$timeline"
}
if [ -n "$timeline" ]; then echo "# label=$label outage=$outage" >"$timeline"; fi

global_args=(--mode global --data-dir "$work/global" --kds-addr "127.0.0.1:$g_kds" --api-addr "127.0.0.1:$g_api"
  --diag-addr "127.0.0.1:$g_diag" --owner-holds="$holds")
[ -n "$emulate" ] && global_args+=(--emulate "$emulate" --nack-backoff "$nack_backoff")
for p in "${plugins[@]}"; do global_args+=(--plugin "$p"); done
global_args+=("${more[@]}")

echo "== $label: global and zone on loopback, zone admission down: $outage"
"$BIN/kds-host" "${global_args[@]}" >"$work/global.log" 2>&1 &
pids+=($!)
wait_ready "http://127.0.0.1:$g_diag/readyz" global
for f in examples/resources/mesh.yaml "${applies[@]}"; do
  "$BIN/kds-host" apply -f "$f" --cp "http://127.0.0.1:$g_api" --data-dir "$work/global" >/dev/null
done

"$BIN/kds-host" token zone --name zone-1 --cp "http://127.0.0.1:$g_api" --data-dir "$work/global" >"$work/zone.token"
start=$(now)
"$BIN/kds-host" --mode zone --zone-name zone-1 --data-dir "$work/zone" --global-address "grpcs://127.0.0.1:$g_kds" \
  --zone-token-file "$work/zone.token" \
  --kds-tls-ca "$work/global/tls/kds.crt" --api-addr "127.0.0.1:$z_api" --diag-addr "127.0.0.1:$z_diag" \
  "${outage_args[@]}" "${zmore[@]}" >"$work/zone.log" 2>&1 &
pids+=($!)
wait_ready "http://127.0.0.1:$z_diag/readyz" zone
echo "t=$(since "$start")s  zone up"
tl_event zone-up

# Wait until the zone has refused something (a NACK), or, with owner holds, until the global
# holds the policies back: either way the outage is biting.
for _ in $(seq 1 200); do
  n=$(zone_nacks); tl_sample; [ "${n:-0}" -gt 0 ] && break
  sleep 0.05
done
echo "t=$(since "$start")s  rejection shows: zone NACKs so far ${n:-0}"
tl_event rejection

applied=$(now)
"$BIN/kds-host" apply -f examples/resources/meshtimeout.yaml --cp "http://127.0.0.1:$g_api" --data-dir "$work/global" >/dev/null
echo "t=$(since "$start")s  applied MeshTimeout timeout-for-backend on the global"
tl_event applied

converged=no last="" late_from="" acked_at=""
deadline=$(awk -v a="$applied" -v t="$timeout" 'BEGIN { printf "%.3f", a + t }')
late=$(awk -v a="$applied" 'BEGIN { printf "%.3f", a + 5 }')
while awk -v d="$deadline" -v n="$(now)" 'BEGIN { exit !(n < d) }'; do
  if [ -z "$late_from" ] && awk -v l="$late" -v n="$(now)" 'BEGIN { exit !(n >= l) }'; then late_from=$(retry_rounds); fi
  c=$(zone_timeouts); c=${c:-0}
  if [ "$c" -ge 3 ]; then acked_at=$(now); fi # before the samples' requests: they are not the zone's time
  tl_sample "$c"
  if [ "$c" != "$last" ]; then echo "t=$(since "$start")s  zone holds $c MeshTimeouts (NACKs $(zone_nacks), rounds $(retry_rounds))"; last=$c; fi
  if [ "$c" -ge 3 ]; then converged=yes; tl_event converged; break; fi
  sleep 0.05
done
seconds=$(since "$applied" | tr -d ' ')
if [ -n "$acked_at" ]; then seconds=$(awk -v a="$applied" -v b="$acked_at" 'BEGIN { printf "%.2f", b - a }'); fi
late_rounds=0 late_seconds=0
if [ -n "$late_from" ]; then
  late_rounds=$(( $(retry_rounds) - late_from ))
  late_seconds=$(awk -v s="$seconds" 'BEGIN { printf "%.2f", s - 5 }')
fi
sleep 0.5 # let the last ACKs land before reading the counters
tl_sample
nacks=$(zone_nacks) rounds=$(retry_rounds) pnacks=$(policy_nacks)
if [ "$converged" = yes ]; then
  echo "converged: the zone had ACKed 3 MeshTimeouts ${seconds}s after the apply; NACKs ${nacks:-?}, retry rounds ${rounds:-?}"
else
  echo "NOT converged within ${timeout}s: the zone holds ${last:-0} MeshTimeouts; NACKs ${nacks:-?}, retry rounds ${rounds:-?}" >&2
fi
echo "RESULT label=$label converged=$converged seconds=$seconds nacks=${nacks:-0} policy_nacks=${pnacks:-0} rounds=${rounds:-0} late_rounds=$late_rounds late_seconds=$late_seconds outage=$outage"
[ "$converged" = yes ]
