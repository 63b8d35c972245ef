#!/usr/bin/env bash
# `make run`: set up everything this machine lacks, then run the console with its workers.
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

apt_install nftables libnftables1 iproute2 busybox-static e2fsprogs ca-certificates curl
trap stop_started_services EXIT
echo $$ > "$RUN_DIR/run.pid"  # `make stop-agents` leaves the agent network alone while this runs
ensure_venv
ensure_postgres
stop_test_dockerd
ensure_dockerd
load_env
ensure_console_redis
ensure_database
ensure_api_token
ensure_secrets_key

export KICI_SCALER_CONFIG_PATH="${KICI_SCALER_CONFIG_PATH:-$ROOT/examples/scalers.yaml}"
PORT="${KICI_PORT:-8000}"
export KICI_CONSOLE_URL="${KICI_CONSOLE_URL:-http://172.30.0.1:$PORT}"
export KICI_OPERATOR_LISTEN="${KICI_OPERATOR_LISTEN:-127.0.0.1:$PORT}"
# The orchestrator's API on a listener of its own (uvicorn processes); set it empty for none.
export KICI_API_LISTEN="${KICI_API_LISTEN-127.0.0.1:$((PORT + 1))}"
PY="$VENV/bin/python"
M="$PY manage.py"

say "migrating the database"
$M migrate --noinput -v0
say "building the agent image"
bash sandbox_agent/build_image.sh
if config_uses_firecracker "$KICI_SCALER_CONFIG_PATH" "${KICI_SCALER_CONFIG_DIR:-}"; then
  # The guest the scaler's kernelPath, initrdPath and rootfsPath point at (README "Firecracker guest").
  apt_install lz4 e2fsprogs
  say "building the Firecracker guest in var/guest"
  sh sandbox_agent/build_guest.sh "$ROOT/var/guest"
fi
say "creating the isolated agent network"
$M ensure_agent_network
$M ensure_admin
say "importing $KICI_SCALER_CONFIG_PATH"
$M import_scalers "$KICI_SCALER_CONFIG_PATH" ${KICI_SCALER_CONFIG_DIR:+--dir "$KICI_SCALER_CONFIG_DIR"}

# The console's processes under supervisord (operations/supervision.py, its configuration written
# to var/run/supervisord.conf): KICI_SERVERS daphne processes on the operator listeners, as many
# gateway processes on the agents' gateway and as many API processes on KICI_API_LISTEN
# (docs/serving.md), KICI_WORKERS rq workers and the
# sweeper, each restarted when it exits (a start that keeps failing is retried with a back-off,
# then given up), every exit recorded as a console.* event and in
# kici_scaler_process_restarts_total. One crash stops nothing else.
WORKERS="${KICI_WORKERS:-$(nproc)}"
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] || die "KICI_WORKERS=$WORKERS is not a positive whole number"
[ "$WORKERS" -ge 2 ] || [ -n "${KICI_WORKERS:-}" ] || WORKERS=2
SERVERS="${KICI_SERVERS:-$(nproc)}"
[[ "$SERVERS" =~ ^[1-9][0-9]*$ ]] || die "KICI_SERVERS=$SERVERS is not a positive whole number"
DJANGO='import django,os;os.environ.setdefault("DJANGO_SETTINGS_MODULE","kici_site.settings");django.setup()'
# The agents' gateway (the address of KICI_CONSOLE_URL), unless it is an operator listener.
GATEWAY="$($PY -c "$DJANGO"'
from kici_site.listeners import gateway_address;g=gateway_address();print(f"[{g[0]}]:{g[1]}" if g and ":" in g[0] else f"{g[0]}:{g[1]}" if g else "")')"
# The orchestrator's API listeners (KICI_API_LISTEN), checked: none may be an operator listener or
# the gateway; one --api HOST:PORT each.
API_ARGS="$($PY -c "$DJANGO"'
import sys
from django.core.exceptions import ImproperlyConfigured
from kici_site.listeners import api_addresses
try:
    print(" ".join(f"--api [{h}]:{p}" if ":" in h else f"--api {h}:{p}" for h, p in api_addresses()))
except ImproperlyConfigured as exc:
    sys.exit(str(exc))')" || die "the orchestrator's API listeners: see above"
# shellcheck disable=SC2086 # API_ARGS is words of options and addresses, none with a space
$M supervisor_config --workers "$WORKERS" --servers "$SERVERS" ${GATEWAY:+--gateway "$GATEWAY"} $API_ARGS \
  --out "$RUN_DIR/supervisord.conf" --log-dir "$LOG_DIR"

SUPERVISOR=""
stop() {
  trap - INT TERM EXIT
  say "stopping"
  # supervisord stops the sweeper, the workers (each finishes its job), then daphne, and exits.
  if [ -n "$SUPERVISOR" ]; then kill -TERM "$SUPERVISOR" 2>/dev/null || true; wait "$SUPERVISOR" 2>/dev/null || true; fi
  stop_started_services
  exit 0
}
trap stop INT TERM EXIT

# In its own session: a Ctrl-C reaches only this script, whose stop() ends it and then the services.
setsid "$VENV/bin/supervisord" -c "$RUN_DIR/supervisord.conf" &
SUPERVISOR=$!

for _ in $(seq 1 60); do curl -fsS -o /dev/null "http://127.0.0.1:$PORT/healthz" 2>/dev/null && break; sleep 0.5; done
say "KiCI Scaler Console: http://127.0.0.1:$PORT/   (logs in var/log/, Ctrl-C stops;" \
  "\`.venv/bin/supervisorctl -c var/run/supervisord.conf status\` shows the processes)"
[ -z "$KICI_API_LISTEN" ] || say "the orchestrator's API: $KICI_API_LISTEN (KICI_API_LISTEN)"
wait "$SUPERVISOR" || true
warn "supervisord exited; see var/log/supervisord.log"
stop
