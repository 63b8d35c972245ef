#!/bin/sh
# KiCI reference agent for busybox sh (the agent image `kici-agent:local`).
#
# Reads the environment a backend gives every agent (SPEC (e) "Env"):
#   KICI_ORCHESTRATOR_URL  console base URL, e.g. http://172.30.0.1:8000
#   KICI_AGENT_ID          this agent's id (scaler-<type>-<8 hex>)
#   KICI_AGENT_TOKEN       single-use registration token
#   KICI_LABELS            comma-separated full labels (informational)
# Registers once (POST /api/v1/agents/register, bearer = the ephemeral token), then heartbeats
# (POST /api/v1/agents/<id>/heartbeat, bearer = the session token the register answer carries)
# every few seconds until the console answers "stop" or stops answering for long.
# Uses busybox wget only (--post-data/--header). No -T: busybox 1.35 static wget segfaults with it.

url="${KICI_ORCHESTRATOR_URL%/}"
agent="$KICI_AGENT_ID"
token="$KICI_AGENT_TOKEN"
interval="${KICI_HEARTBEAT_SECONDS:-5}"

log() { echo "kici-agent: $*"; }

if [ -z "$url" ] || [ -z "$agent" ] || [ -z "$token" ]; then
    log "KICI_ORCHESTRATOR_URL, KICI_AGENT_ID and KICI_AGENT_TOKEN are required"
    exit 2
fi

post() { # post PATH BEARER BODY -> prints the response body; exit status of wget
    wget -q -O - \
        --header "Authorization: Bearer $2" \
        --header "Content-Type: application/json" \
        --post-data "$3" "$url$1"
}

json_field() { # json_field NAME  (string or number value of a flat JSON object on stdin)
    sed -n "s/.*\"$1\": *\"\{0,1\}\([^\",}]*\)\"\{0,1\}.*/\1/p"
}

log "registering $agent with $url (labels: $KICI_LABELS)"
# Every 2 s for up to 2 minutes: a console restarting (its workers finish their jobs first) must not
# cost the agents that were booting meanwhile their one registration.
attempt=0
while :; do
    attempt=$((attempt + 1))
    resp=$(post /api/v1/agents/register "$token" "{\"agentId\":\"$agent\",\"labels\":\"$KICI_LABELS\"}") && break
    if [ "$attempt" -ge 60 ]; then
        log "registration failed after $attempt attempts"
        exit 1
    fi
    sleep 2
done
session=$(echo "$resp" | json_field sessionToken)
every=$(echo "$resp" | json_field heartbeatIntervalSeconds)
[ -n "$every" ] && interval="$every"
if [ -z "$session" ]; then
    log "registration answer carried no session token: $resp"
    exit 1
fi
log "registered; heartbeat every ${interval}s"

misses=0
while :; do
    sleep "$interval"
    if resp=$(post "/api/v1/agents/$agent/heartbeat" "$session" "{\"activeJobs\":0}"); then
        misses=0
        case "$resp" in
            *'"stop": true'*|*'"stop":true'*) log "console asked us to stop"; exit 0 ;;
        esac
    else
        misses=$((misses + 1))
        log "heartbeat failed ($misses)"
        [ "$misses" -ge 12 ] && { log "console unreachable; exiting"; exit 1; }
    fi
done
