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
# Speaks HTTP/1.0 through busybox nc, the request written by the shell's builtin printf: no token
# is ever on a command line (/proc/<pid>/cmdline is readable by every local user, and wget takes
# headers only as arguments). So the console URL must be http:// (the agents' gateway).

url="${KICI_ORCHESTRATOR_URL%/}"
agent="$KICI_AGENT_ID"
token="$KICI_AGENT_TOKEN"
interval="${KICI_HEARTBEAT_SECONDS:-5}"
# Seconds without an answered heartbeat before giving up: a console restart, however slow, is not
# the end of its agents.
patience="${KICI_CONSOLE_PATIENCE_SECONDS:-300}"

log() { echo "kici-agent: $*"; }

if [ -z "$url" ] || [ -z "$agent" ] || [ -z "$token" ]; then
    log "KICI_ORCHESTRATOR_URL, KICI_AGENT_ID and KICI_AGENT_TOKEN are required"
    exit 2
fi

case "$url" in
    http://*) ;;
    *) log "KICI_ORCHESTRATOR_URL must be an http:// URL, got $url"; exit 2 ;;
esac
hostport="${url#http://}"
base="/${hostport#*/}"
[ "$base" = "/$hostport" ] && base=""
base="${base%/}"
hostport="${hostport%%/*}"
case "$hostport" in
    \[*\]:*) host="${hostport%]:*}"; host="${host#[}"; port="${hostport##*]:}" ;;
    \[*\]) host="${hostport#[}"; host="${host%]}"; port=80 ;;
    *:*) host="${hostport%:*}"; port="${hostport##*:}" ;;
    *) host="$hostport"; port=80 ;;
esac

post() { # post PATH BEARER BODY -> prints the response body; fails unless the answer is 2xx
    # printf is the shell's builtin: the bearer goes from this shell to nc's stdin, never to argv.
    # nc reads the request from a fifo this shell keeps open until nc has read the whole answer:
    # busybox nc half-closes the connection at the end of its input, and the console (Twisted)
    # drops a request whose client half-closed before it answered.
    dir="${TMPDIR:-/tmp}"
    [ -d "$dir" ] || mkdir -p -m 1777 "$dir" || return 1  # a job's own image may have no /tmp
    fifo="$dir/kici-agent.$$.fifo"
    rm -f "$fifo"
    mkfifo -m 600 "$fifo" || return 1
    timeout 15 nc "$host" "$port" < "$fifo" > "$fifo.out" 2>/dev/null &
    ncpid=$!
    exec 4> "$fifo"
    printf 'POST %s%s HTTP/1.0\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %s\r\n\r\n%s' \
        "$base" "$1" "$hostport" "$2" "${#3}" "$3" >&4
    wait "$ncpid"
    exec 4>&-
    answer=$(tr -d '\r' < "$fifo.out")
    rm -f "$fifo" "$fifo.out"
    case "$answer" in
        "HTTP/1."?" 2"*) printf '%s\n' "$answer" | sed '1,/^$/d' ;;
        *) return 1 ;;
    esac
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
last_answer=$(date +%s)
while :; do
    sleep "$interval"
    if resp=$(post "/api/v1/agents/$agent/heartbeat" "$session" "{\"activeJobs\":0}"); then
        [ "$misses" -gt 0 ] && log "heartbeat answered again after $misses failed"
        misses=0
        last_answer=$(date +%s)
        case "$resp" in
            *'"stop": true'*|*'"stop":true'*) log "console asked us to stop"; exit 0 ;;
        esac
    else
        misses=$((misses + 1))
        log "heartbeat failed ($misses)"
        if [ $(($(date +%s) - last_answer)) -ge "$patience" ]; then
            log "console unreachable for ${patience}s; exiting"
            exit 1
        fi
    fi
done
