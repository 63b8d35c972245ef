#!/bin/sh
# Read the agent's bootstrap data from Firecracker's MMDS, then exec the agent with it.
#
# Keys (``latest/meta-data/`` as the Firecracker backend PUTs them, the reference's names):
# kici-orchestrator-url, kici-agent-id, kici-agent-token, kici-labels, kici-scaler-managed,
# kici-backpressure-mode, and kici-env (a map: each entry becomes an environment variable of the
# agent). Which agent runs follows from the orchestrator URL:
# - http(s)://: the console's agent (KICI_AGENT_SCRIPT), with the environment it was started with
#   plus KICI_ORCHESTRATOR_URL, KICI_AGENT_ID, KICI_AGENT_TOKEN, KICI_LABELS and kici-env;
# - ws(s)://: the real KiCI agent (KICI_REAL_AGENT, default /usr/local/bin/kici-agent, where the
#   reference's rootfs holds it), with exactly HOME, PATH, TMPDIR and the variables MMDS names
#   (each key above as its KICI_* variable, and kici-env): it refuses any KICI_* variable it does
#   not know, so nothing of this script's environment reaches it. Exit status 127 when it is not
#   installed.
# Works with MMDS V1 and V2: a session token is asked for
# (PUT /latest/api/token) and sent as X-metadata-token when MMDS gives one; every request is raw
# HTTP through nc (busybox wget cannot PUT, and takes headers only on its command line). The VM
# boots before the backend fills MMDS, so the keys are polled once a second for
# KICI_MMDS_WAIT_SECONDS (default 120).
#
# Environment (for tests): KICI_MMDS_ADDRESS (default 169.254.169.254), KICI_AGENT_SCRIPT
# (default /kici_agent.sh), KICI_REAL_AGENT (default /usr/local/bin/kici-agent). Exit status 1 when
# MMDS never held the keys; else the agent's.
mmds="${KICI_MMDS_ADDRESS:-169.254.169.254}"
agent_script="${KICI_AGENT_SCRIPT:-/kici_agent.sh}"
real_agent="${KICI_REAL_AGENT:-/usr/local/bin/kici-agent}"
#: The real KiCI agent's PATH in the guest (node, git, bash and npm are looked up there).
REAL_AGENT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
wait_s="${KICI_MMDS_WAIT_SECONDS:-120}"
session=""

log() { echo "kici-mmds: $*"; }

new_session() { # MMDS V2 session token into $session (empty when MMDS answers no token)
    resp=$(printf 'PUT /latest/api/token HTTP/1.1\r\nHost: %s\r\nX-metadata-token-ttl-seconds: 21600\r\nContent-Length: 0\r\nConnection: close\r\n\r\n' \
        "$mmds" | timeout 5 nc "$mmds" 80 2>/dev/null | tr -d '\r')
    case "$resp" in
        "HTTP/1.1 200"* | "HTTP/1.0 200"*) session=$(printf '%s\n' "$resp" | sed '1,/^$/d' | tr -d '\n') ;;
        *) session="" ;;
    esac
}

errors="${TMPDIR:-/tmp}/kici-mmds.$$"
trap 'rm -f "$errors"' EXIT

get() { # get KEY: the value of latest/meta-data/KEY (a string, or a map's key list); fails on
    # HTTP errors, whose status line is appended to $errors (a 401 means the session ended).
    # Raw HTTP through nc, written by the shell's builtin printf: the session token (which reads
    # the agent's token) is never on a command line, where any local user would read it.
    if [ -n "$session" ]; then
        answer=$(printf 'GET /latest/meta-data/%s HTTP/1.1\r\nHost: %s\r\nX-metadata-token: %s\r\nConnection: close\r\n\r\n' \
            "$1" "$mmds" "$session" | timeout 5 nc "$mmds" 80 2>/dev/null | tr -d '\r')
    else
        answer=$(printf 'GET /latest/meta-data/%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' \
            "$1" "$mmds" | timeout 5 nc "$mmds" 80 2>/dev/null | tr -d '\r')
    fi
    case "$answer" in
        "HTTP/1."?" 200"*) printf '%s\n' "$answer" | sed '1,/^$/d' ;;
        *) echo "${answer%%"$(printf '\n')"*} (GET $1)" >>"$errors"; return 1 ;;
    esac
}

n=0
while :; do
    [ -n "$session" ] || new_session
    : > "$errors"
    url=$(get kici-orchestrator-url)
    id=$(get kici-agent-id)
    token=$(get kici-agent-token)
    [ -n "$url" ] && [ -n "$id" ] && [ -n "$token" ] && break
    grep -q ' 401' "$errors" && session=""
    n=$((n + 1))
    if [ "$n" -ge "$wait_s" ]; then
        log "MMDS at $mmds held no kici-orchestrator-url, kici-agent-id and kici-agent-token after ${wait_s}s"
        exit 1
    fi
    sleep 1
done
labels=$(get kici-labels)
case "$url" in
    ws://* | wss://*)
        # The real KiCI agent: its environment is exactly what MMDS names.
        [ -x "$real_agent" ] || {
            log "MMDS names the WebSocket orchestrator $url (the real KiCI agent), but $real_agent is not installed in this guest"
            exit 127
        }
        # The agent's variables as positional parameters, "NAME=value" each: they outlive the
        # clearing of the environment below, whatever names it held.
        set -- "$real_agent" "KICI_ORCHESTRATOR_URL=$url" "KICI_AGENT_ID=$id" "KICI_AGENT_TOKEN=$token" \
            "KICI_LABELS=$labels"
        value=$(get kici-scaler-managed) && set -- "$@" "KICI_SCALER_MANAGED=$value"
        value=$(get kici-backpressure-mode) && set -- "$@" "KICI_BACKPRESSURE_MODE=$value"
        for key in $(get kici-env); do
            case "$key" in
                */ | [!A-Za-z_]* | *[!A-Za-z0-9_]*) log "kici-env: skipping $key" ;;
                *) value=$(get "kici-env/$key") && set -- "$@" "$key=$value" ;;
            esac
        done
        how="without a session"
        [ -n "$session" ] && how="with a session token"
        log "real KiCI agent $id, orchestrator $url (MMDS read $how)"
        rm -f "$errors"
        trap - EXIT
        # Every inherited variable leaves the environment (unset: the token never goes on a command
        # line, as env -i would put it), then only the agent's are exported.
        for name in $(env | sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p'); do
            unset "$name" 2>/dev/null
        done
        real_agent="$1"
        shift
        export HOME=/root PATH="$REAL_AGENT_PATH" TMPDIR=/tmp
        for pair in "$@"; do
            export "$pair"
        done
        exec "$real_agent"
        ;;
esac
for key in $(get kici-env); do
    case "$key" in
        */ | [!A-Za-z_]* | *[!A-Za-z0-9_]*) log "kici-env: skipping $key" ;;
        *) value=$(get "kici-env/$key") && export "$key=$value" ;;
    esac
done
how="without a session"
[ -n "$session" ] && how="with a session token"
log "agent $id, console $url (MMDS read $how)"
export KICI_ORCHESTRATOR_URL="$url" KICI_AGENT_ID="$id" KICI_AGENT_TOKEN="$token" KICI_LABELS="$labels"
rm -f "$errors"
trap - EXIT
exec sh "$agent_script"
