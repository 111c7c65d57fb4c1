#!/usr/bin/env bash
# Starts a global and a zone control plane on this machine (SQLite under .data/), prints what to
# try next, and stops both on Ctrl-C. Run it through `make run`, which builds bin/ first.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./bin}
DATA=${DATA:-.data}
ZONE=${KDS_ZONE_NAME:-zone-1}
mkdir -p "$DATA"

pids=()
stop() {
  trap - INT TERM EXIT
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "stopped"
}
trap "stop; exit 0" INT TERM
trap stop EXIT

# The ports must be free; say which process holds one that is not, rather than letting a control
# plane fail and another's log take the blame.
for port in 5680 5681 5685 15680 15681; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    who=""
    if command -v ss >/dev/null; then
      who=$(ss -ltnpH "sport = :$port" 2>/dev/null | sed -n 's/.*users:((\("[^"]*"\),pid=\([0-9]*\).*/\1 (pid \2)/p' | head -1)
    fi
    echo "port $port is taken${who:+ by $who}: stop it (a control plane from an earlier make run?), then run make run again" >&2
    exit 1
  fi
done

wait_ready() { # url name
  for _ in $(seq 1 100); do
    if curl -fsS -m 1 "$1" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "$2 did not become ready at $1; see $DATA/$2.log" >&2
  exit 1
}

# The global keeps its data (and its admin token, which the CLI finds there) in the default
# --data-dir, so the commands below need no token flag.
GLOBAL_DATA=$DATA/kds-host
"$BIN/kds-host" --mode global --data-dir "$GLOBAL_DATA" "$@" >"$DATA/global.log" 2>&1 &
pids+=($!)
wait_ready http://127.0.0.1:5680/readyz global

# The zone proves its name with a zone token that the global signs.
"$BIN/kds-host" token zone --name "$ZONE" --data-dir "$GLOBAL_DATA" >"$DATA/$ZONE.token"
chmod 600 "$DATA/$ZONE.token"
"$BIN/kds-host" --mode zone --zone-name "$ZONE" --data-dir "$DATA/$ZONE" --zone-token-file "$DATA/$ZONE.token" \
  --global-address grpcs://127.0.0.1:5685 --kds-tls-ca "$GLOBAL_DATA/tls/kds.crt" >"$DATA/$ZONE.log" 2>&1 &
pids+=($!)
wait_ready http://127.0.0.1:15680/readyz "$ZONE"

cat <<MSG
kds-host is running:
  global  API http://127.0.0.1:5681   KDS grpcs://127.0.0.1:5685   metrics http://127.0.0.1:5680/metrics   log $DATA/global.log
          admin token $GLOBAL_DATA/admin.token (the CLI reads it by itself on this machine)
  $ZONE  API http://127.0.0.1:15681  (read-only)                    metrics http://127.0.0.1:15680/metrics  log $DATA/$ZONE.log

Try:
  $BIN/kds-host apply -f examples/resources/mesh.yaml
  $BIN/kds-host apply -f examples/resources/meshtimeout.yaml
  $BIN/kds-host get meshtimeouts -m default --cp http://127.0.0.1:15681   # the zone has 3
  $BIN/kds-host inspect zones
  $BIN/kds-host token user --name me --group read-only      # a token for someone else

Ctrl-C stops both.
MSG
wait -n "${pids[@]}" || true
echo "a control plane exited; see the logs in $DATA" >&2
exit 1
