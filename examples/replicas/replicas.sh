#!/usr/bin/env bash
# Three global replicas on one PostgreSQL, two zones that list all three, and a replica killed
# under a zone. The script starts a throwaway PostgreSQL (initdb into a temp dir as the postgres
# user when run as root, a port of its own), three replicas sharing it and one token signing key,
# two zones with minted zone tokens, applies a Mesh and 10 MeshTimeouts through replica r1, then
# kill -9s the replica zone-1 is on, changes one policy and adds one through a surviving replica,
# and shows the zones moving, how long that took, and a table of what each replica sent (from
# kds_resources_sent_total): the replica a zone moved to sends it what changed, nothing else.
#
#   examples/replicas/replicas.sh [--port-base 27000] [--no-build] [--keep]
#
# Needs the PostgreSQL server binaries (KDS_POSTGRES_BIN, default /usr/lib/postgresql/15/bin or
# pg_config --bindir), curl and jq. KDS_BIN names the folder of kds-host (default ./bin). Last, it
# kills every replica's listener connection (pg_terminate_backend) and shows that a write still
# reaches both zones. Twice it waits for the changes relay to settle, one replica its hub (the
# one LISTEN) and the others following it: at the start, and among the survivors at the end. It
# ends with a line `RESULT moved=yes|no failover_ms=... resent=... changed=2 listen_killed=N
# relay_hubs=N` and exits 1 when a zone did not move, missed a write, or was sent
# anything unchanged. --keep leaves everything running until Ctrl-C. Every process it started is
# stopped on exit (and on Ctrl-C), PostgreSQL included.
set -euo pipefail
cd "$(dirname "$0")/../.."

port_base=27000 build=1 keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --port-base) port_base="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "replicas.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
BIN=${KDS_BIN:-./bin}
[ "$build" = 1 ] && make -s build
for tool in curl jq; do command -v $tool >/dev/null || { echo "replicas.sh needs $tool" >&2; exit 2; }; done
PGBIN=${KDS_POSTGRES_BIN:-/usr/lib/postgresql/15/bin}
[ -x "$PGBIN/initdb" ] || PGBIN=$(pg_config --bindir 2>/dev/null || true)
[ -x "$PGBIN/initdb" ] || { echo "replicas.sh: no PostgreSQL server binaries (set KDS_POSTGRES_BIN; Debian: apt-get install postgresql-15)" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kds-replicas-XXXXXX")
chmod 755 "$WORK"
pids=()
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
stop() {
  trap - INT TERM EXIT
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -f "$WORK/pg/data/postmaster.pid" ] && as_pg "$PGBIN/pg_ctl" stop -D "$WORK/pg/data" -m immediate -w >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap "stop; exit 130" INT TERM
trap stop EXIT

now_ms() { date +%s%3N; }
wait_ready() { # url name log
  for _ in $(seq 1 200); do
    if curl -fsS -m 1 "$1" >/dev/null 2>&1; then return 0; fi
    sleep 0.05
  done
  echo "$2 did not become ready at $1; its log:" >&2
  tail -n 30 "$3" >&2
  exit 1
}

# PostgreSQL, as the tests start it: initdb into a temp dir, on a port of its own.
PGPORT=$((port_base + 99))
mkdir -p "$WORK/pg"
[ "$(id -u)" = 0 ] && chown postgres "$WORK/pg"
as_pg "$PGBIN/initdb" -D "$WORK/pg/data" --username=postgres --auth=trust --encoding=UTF8 --locale=C --no-sync >"$WORK/pg/initdb.log" 2>&1
as_pg "$PGBIN/pg_ctl" start -D "$WORK/pg/data" -w -l "$WORK/pg/postgres.log" \
  -o "-p $PGPORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$WORK/pg -c fsync=off -c synchronous_commit=off" >/dev/null
DSN="postgres://postgres@127.0.0.1:$PGPORT/postgres?sslmode=disable"
echo "PostgreSQL on 127.0.0.1:$PGPORT ($WORK/pg)"

# Replica i: KDS port_base+10i+5, API +1, diagnostics +0.
kds() { echo $((port_base + 10 * $1 + 5)); }
api() { echo $((port_base + 10 * $1 + 1)); }
diag() { echo $((port_base + 10 * $1)); }
start_replica() { # i [more flags]
  local i=$1; shift
  "$BIN/kds-host" --mode global --store "$DSN" --data-dir "$WORK/r$i" --replica-id "r$i" \
    --kds-plaintext --kds-addr "127.0.0.1:$(kds "$i")" --api-addr "127.0.0.1:$(api "$i")" --diag-addr "127.0.0.1:$(diag "$i")" \
    "$@" >"$WORK/r$i.log" 2>&1 &
  pids+=($!)
  eval "pid_r$i=$!"
  wait_ready "http://127.0.0.1:$(diag "$i")/readyz" "r$i" "$WORK/r$i.log"
}
# The replicas share one signing key, as key files: r1 makes it at first start, r2 and r3 are
# given it (--token-signing-key), so a token any of them mints is valid on every one.
start_replica 1
KEY="$WORK/r1/keys/token-signing.key"
start_replica 2 --token-signing-key "$KEY"
start_replica 3 --token-signing-key "$KEY"
ALL="grpc://127.0.0.1:$(kds 1),grpc://127.0.0.1:$(kds 2),grpc://127.0.0.1:$(kds 3)"
echo "replicas r1 r2 r3: KDS $ALL"

# Zone j: API port_base+100+10j+1, diagnostics +0. zone-1 lists r1 first, zone-2 r2 first.
zapi() { echo $((port_base + 100 + 10 * $1 + 1)); }
zdiag() { echo $((port_base + 100 + 10 * $1)); }
start_zone() { # j addresses
  local j=$1
  "$BIN/kds-host" token zone --name "zone-$j" --cp "http://127.0.0.1:$(api 1)" --data-dir "$WORK/r1" >"$WORK/zone-$j.token"
  chmod 600 "$WORK/zone-$j.token"
  "$BIN/kds-host" --mode zone --zone-name "zone-$j" --data-dir "$WORK/zone-$j" --zone-token-file "$WORK/zone-$j.token" \
    --global-address "$2" --api-addr "127.0.0.1:$(zapi "$j")" --diag-addr "127.0.0.1:$(zdiag "$j")" >"$WORK/zone-$j.log" 2>&1 &
  pids+=($!)
  wait_ready "http://127.0.0.1:$(zdiag "$j")/readyz" "zone-$j" "$WORK/zone-$j.log"
}
start_zone 1 "$ALL"
start_zone 2 "grpc://127.0.0.1:$(kds 2),grpc://127.0.0.1:$(kds 3),grpc://127.0.0.1:$(kds 1)"

cli() { "$BIN/kds-host" "$@"; }
timeout_yaml() { # name duration
  printf 'type: MeshTimeout\nmesh: default\nname: %s\nspec:\n  targetRef: {kind: Mesh}\n  default: {connectionTimeout: %s}\n' "$1" "$2"
}
{
  printf 'type: Mesh\nname: default\n'
  for n in $(seq -w 1 10); do printf -- '---\n'; timeout_yaml "t-$n" 1s; done
} >"$WORK/resources.yaml"
cli apply -f "$WORK/resources.yaml" --cp "http://127.0.0.1:$(api 1)" --data-dir "$WORK/r1" >/dev/null

zone_count() { # j: MeshTimeouts the zone holds
  curl -fsS -m 2 "http://127.0.0.1:$(zapi "$1")/meshes/default/meshtimeouts" 2>/dev/null | jq '.items | length' 2>/dev/null || echo 0
}
zone_spec() { # j name
  curl -fsS -m 2 "http://127.0.0.1:$(zapi "$1")/meshes/default/meshtimeouts/$2" 2>/dev/null | jq -c '.spec' 2>/dev/null || echo null
}
zone_global() { # j: the replica address the zone is connected to, "" when it is not
  curl -fsS -m 2 "http://127.0.0.1:$(zapi "$1")/api/zone" 2>/dev/null | jq -r 'if .connected then .global else "" end' 2>/dev/null || true
}
wait_for() { # seconds description command...
  local until=$(( $(now_ms) + $1 * 1000 )) what=$2; shift 2
  until "$@"; do
    if [ "$(now_ms)" -gt "$until" ]; then echo "timed out waiting for $what" >&2; exit 1; fi
    sleep 0.02
  done
}
synced() { [ "$(zone_count 1)" = 12 ] && [ "$(zone_count 2)" = 12 ]; } # 10 + the Mesh's 2 defaults
wait_for 30 "both zones to hold 12 MeshTimeouts" synced

replica_of() { # address -> r1|r2|r3
  local i; for i in 1 2 3; do [ "$1" = "grpc://127.0.0.1:$(kds "$i")" ] && { echo "r$i"; return; }; done; echo "?"
}
sent() { # i zone: resources replica i sent the zone (0 when the replica is gone)
  curl -fsS -m 2 "http://127.0.0.1:$(diag "$1")/metrics" 2>/dev/null |
    awk -v z="zone=\"$2\"" '/^kds_resources_sent_total/ && index($0, z) { s += $NF } END { print s + 0 }'
}
relay_role() { # i: the replica's part in the changes relay: hub, follower, or alone (it LISTENs itself)
  curl -fsS -m 2 "http://127.0.0.1:$(diag "$1")/metrics" 2>/dev/null |
    awk '/^kds_store_relay\{/ && $NF == 1 && match($0, /role="[a-z]+"/) { r = substr($0, RSTART + 6, RLENGTH - 7) } END { print (r == "" ? "alone" : r) }'
}
relay_roles() { # i...: "r1=hub r2=follower ..."
  local i out=""; for i in "$@"; do out+="r$i=$(relay_role "$i") "; done; echo "${out% }"
}
relay_settled() { # i...: one of the replicas is the hub and every other follows it
  local roles; roles=" $(relay_roles "$@") "
  [ "$(grep -o '=hub ' <<<"$roles" | wc -l)" = 1 ] && [ "$(grep -o '=follower ' <<<"$roles" | wc -l)" = $(( $# - 1 )) ]
}
show_zones() { # i: /api/zones as replica i sees it
  curl -fsS -m 2 -H "Authorization: Bearer $(cat "$WORK/r$1/admin.token")" "http://127.0.0.1:$(api "$1")/api/zones" |
    jq -r '(.items // [])[] | "  \(.zone) -> \(.replica // "?") (\(.replicaAddress // "")) connected=\(.connected)"'
}

for j in 1 2; do eval "on$j=$(replica_of "$(zone_global $j)")"; done
declare -A before
for i in 1 2 3; do for j in 1 2; do before[$i,$j]=$(sent "$i" "zone-$j"); done; done
echo "synced: zone-1 on $on1, zone-2 on $on2; /api/zones on r3 says:"
wait_for 10 "r3 to see both zones" bash -c "[ \$(curl -fsS -m 2 -H 'Authorization: Bearer $(cat "$WORK/r3/admin.token")' http://127.0.0.1:$(api 3)/api/zones | jq '[(.items // [])[] | select(.replica != null)] | length') = 2 ]"
show_zones 3
wait_for 10 "one replica to be the changes relay's hub and the others to follow it" relay_settled 1 2 3
echo "changes relay (one LISTEN for the three): $(relay_roles 1 2 3)"

# Kill the replica zone-1 is on; change one policy and add one through another replica.
victim=${on1#r}
survivor=$(( victim % 3 + 1 ))
t0=$(now_ms)
vpid=$(eval echo "\$pid_r$victim")
kill -9 "$vpid"
wait "$vpid" 2>/dev/null || true
echo "kill -9 r$victim"
timeout_yaml t-01 7s >"$WORK/change.yaml"
printf -- '---\n' >>"$WORK/change.yaml"
timeout_yaml t-new 1s >>"$WORK/change.yaml"
cli apply -f "$WORK/change.yaml" --cp "http://127.0.0.1:$(api "$survivor")" --data-dir "$WORK/r$survivor" >/dev/null
echo "applied t-01 (changed) and t-new (added) through r$survivor"

moved() { local g; g=$(zone_global 1); [ -n "$g" ] && [ "$(replica_of "$g")" != "r$victim" ]; }
wait_for 10 "zone-1 to move" moved
t1=$(now_ms)
has_writes() { # j
  [ "$(zone_count "$1")" = 13 ] && [ "$(zone_spec "$1" t-01 | jq -r '.default.connectionTimeout')" = 7s ]
}
wait_for 10 "zone-1 to hold the writes" has_writes 1
wait_for 10 "zone-2 to hold the writes" has_writes 2
t2=$(now_ms)
for j in 1 2; do eval "after$j=$(replica_of "$(zone_global $j)")"; done
sleep 0.5 # let the counters settle

echo
echo "zone-1 moved from r$victim to $after1 in $((t1 - t0)) ms; both zones had ACKed the 2 writes $((t2 - t0)) ms after the kill"
echo
printf '%-8s %-8s %-8s %-9s %-8s %s\n' zone replica before after resent note
ok=1 resent1=0
for j in 1 2; do
  for i in 1 2 3; do
    if [ "$i" = "$victim" ]; then
      printf '%-8s %-8s %-8s %-9s %-8s %s\n' "zone-$j" "r$i" "${before[$i,$j]}" "-" "-" "killed"
      continue
    fi
    a=$(sent "$i" "zone-$j"); d=$((a - before[$i,$j]))
    on_var=after$j; note=""
    [ "r$i" = "${!on_var}" ] && note="the zone is here now"
    printf '%-8s %-8s %-8s %-9s %-8s %s\n' "zone-$j" "r$i" "${before[$i,$j]}" "$a" "$d" "$note"
    if [ "r$i" = "${!on_var}" ]; then
      [ "$j" = 1 ] && resent1=$d
      # 2 changed resources: anything more is an unchanged one sent again.
      [ "$d" -le 2 ] || ok=0
    fi
  done
done
echo
echo "/api/zones on r$survivor now says:"
wait_for 10 "r$survivor to see zone-1 on $after1" bash -c "curl -fsS -m 2 -H 'Authorization: Bearer $(cat "$WORK/r$survivor/admin.token")' http://127.0.0.1:$(api "$survivor")/api/zones | jq -e '(.items // [])[] | select(.zone == \"zone-1\" and .replica == \"$after1\")' >/dev/null"
show_zones "$survivor"
[ "$resent1" = 2 ] || ok=0

# Kill every replica's listener connection (the hub's LISTEN, the followers' idle one): a write
# still reaches both zones (the replicas poll until they hear writes again).
killed=$(as_pg "$PGBIN/psql" -h 127.0.0.1 -p "$PGPORT" -U postgres -d postgres -Atqc \
  "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'kds-host listen'")
third=$(( survivor % 3 + 1 )); [ "$third" = "$victim" ] && third=$(( third % 3 + 1 ))
t3=$(now_ms)
timeout_yaml t-02 5s >"$WORK/change2.yaml"
cli apply -f "$WORK/change2.yaml" --cp "http://127.0.0.1:$(api "$third")" --data-dir "$WORK/r$third" >/dev/null
has_t02() { [ "$(zone_spec 1 t-02 | jq -r '.default.connectionTimeout')" = 5s ] && [ "$(zone_spec 2 t-02 | jq -r '.default.connectionTimeout')" = 5s ]; }
wait_for 10 "the zones to hold t-02 with the listener connections killed" has_t02
echo "killed $killed listener connections; t-02 applied through r$third reached both zones in $(( $(now_ms) - t3 )) ms"
wait_for 10 "one survivor to be the changes relay's hub and the other to follow it" relay_settled "$survivor" "$third"
echo "changes relay after the kill and the killed connections: $(relay_roles "$survivor" "$third")"
hubs=$(relay_roles "$survivor" "$third" | grep -o '=hub' | wc -l)
echo "RESULT moved=$([ "$after1" != "r$victim" ] && echo yes || echo no) failover_ms=$((t1 - t0)) resent=$resent1 changed=2 listen_killed=$killed relay_hubs=$hubs"
if [ "$keep" = 1 ]; then
  echo "running on (logs in $WORK); Ctrl-C stops everything"
  wait
fi
[ "$ok" = 1 ]
