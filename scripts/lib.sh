# Shared shell helpers for scripts/*.sh (sourced, not run).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
RUN_DIR="$ROOT/var/run"
LOG_DIR="$ROOT/var/log"
mkdir -p "$RUN_DIR" "$LOG_DIR"

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
warn() { printf '\033[33mwarning:\033[0m %s\n' "$*" >&2; }
die() { printf '\033[31merror:\033[0m %s\n' "$*" >&2; exit 1; }

STARTED_POSTGRES=0
STARTED_REDIS=0
STARTED_DOCKERD=0
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || die "run as root or install sudo"
  SUDO="sudo"
fi

APT_UPDATED=0
apt_install() {  # apt_install pkg...: install only the packages that are missing
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "apt-get install ${missing[*]}"
  # Another apt (a second make run or make test, unattended-upgrades) waits its turn, not fails.
  local lock=(-o DPkg::Lock::Timeout=600)
  if [ "$APT_UPDATED" -eq 0 ]; then $SUDO apt-get "${lock[@]}" update -qq; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get "${lock[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

config_uses_firecracker() {  # config_uses_firecracker FILE [DIR]: a scaler of type firecracker in FILE or DIR/*.y(a)ml
  local files=("$1")
  if [ -n "${2:-}" ]; then files+=("$2"/*.yaml "$2"/*.yml); fi
  grep -Eqs "^[[:space:]-]*type:[[:space:]]*[\"']?firecracker[\"']?[[:space:]]*(#.*)?$" "${files[@]}"
}

find_python() {  # prints a python >= 3.12, installing Debian's python3 when none is found
  local c
  for c in python3.13 python3.12 python3 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3 /root/.pyenv/versions/3.1[2-9]*/bin/python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null \
       && "$c" -c 'import venv, ensurepip' 2>/dev/null; then
      command -v "$c"; return 0
    fi
  done
  apt_install python3 python3-venv
  if python3 -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then command -v python3; return 0; fi
  die "Django 6 needs Python >= 3.12; this system's python3 is $(python3 --version 2>&1). Install python3.12+ (e.g. pyenv) and retry."
}

ensure_venv() {  # the venv with the exact pins of requirements.lock; re-installed when the lock changes
  local stamp="$VENV/.lock-sha"
  local want; want="$(sha256sum "$ROOT/requirements.lock" | cut -d' ' -f1)"
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then return 0; fi
  local py; py="$(find_python)"
  say "creating the virtualenv with $py"
  [ -x "$VENV/bin/python" ] || "$py" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$ROOT/requirements.lock"
  echo "$want" > "$stamp"
}

ensure_postgres() {
  if ! command -v pg_ctlcluster >/dev/null 2>&1 && ! command -v psql >/dev/null 2>&1; then apt_install postgresql; fi
  if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    say "starting PostgreSQL"
    STARTED_POSTGRES=1
    local v
    for v in $(ls /etc/postgresql 2>/dev/null); do
      $SUDO pg_ctlcluster --skip-systemctl-redirect "$v" main start 2>/dev/null || $SUDO pg_ctlcluster "$v" main start || true
    done
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.5; done
    pg_isready -q -h 127.0.0.1 -p 5432 || die "PostgreSQL did not start on 127.0.0.1:5432"
  fi
}

# Make sure DATABASE_URL names a database we can use; on a fresh install (password auth on TCP)
# create a role with a generated password and remember the URL in var/env.
ensure_database() {
  local url="${DATABASE_URL:-postgres://127.0.0.1:5432/kici}"
  local db="${url##*/}"
  if psql "${url%/*}/postgres" -Atqc 'select 1' >/dev/null 2>&1; then
    psql "${url%/*}/postgres" -Atqc "select 1 from pg_database where datname='$db'" | grep -q 1 \
      || psql "${url%/*}/postgres" -qc "create database \"$db\"" >/dev/null
    export DATABASE_URL="$url"; return 0
  fi
  [ -n "${DATABASE_URL:-}" ] && die "cannot connect with DATABASE_URL=$DATABASE_URL"
  say "creating PostgreSQL role and database 'kici' (password auth)"
  local pw; pw="$(head -c 18 /dev/urandom | base64 | tr -d '/+=')"
  $SUDO -u postgres psql -qc "do \$\$ begin if not exists (select from pg_roles where rolname='kici') then create role kici login createdb password '$pw'; else alter role kici password '$pw'; end if; end \$\$;" >/dev/null
  $SUDO -u postgres psql -Atqc "select 1 from pg_database where datname='kici'" | grep -q 1 || $SUDO -u postgres createdb -O kici kici
  export DATABASE_URL="postgres://kici:$pw@127.0.0.1:5432/kici"
  (umask 077; echo "export DATABASE_URL=$DATABASE_URL" >> "$ROOT/var/env")
}

SUITE_REDIS_DIR="$RUN_DIR/test-redis"

# The test suite's own Redis (make test): a redis-server on 127.0.0.1 only (TCP, so the multi-host
# tests can relay it into their namespaces), refusing every client without a password generated
# into $SUITE_REDIS_DIR/password (the directory 0700, the file 0600): another local user cannot
# queue jobs for the suite's workers, which run as root. Its port is KICI_TEST_REDIS_PORT, else the
# first free one from 6390 (another checkout's suite Redis may hold 6390), kept in
# $SUITE_REDIS_DIR/port. Sets SUITE_REDIS_PASSWORD and SUITE_REDIS_PORT. A server of this checkout
# still answering with its password is reused.
ensure_suite_redis() {
  command -v redis-server >/dev/null 2>&1 || apt_install redis-server
  (umask 077; mkdir -p "$SUITE_REDIS_DIR")
  chmod 0700 "$SUITE_REDIS_DIR"
  local pwfile="$SUITE_REDIS_DIR/password"
  [ -s "$pwfile" ] || (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$pwfile")
  SUITE_REDIS_PASSWORD="$(cat "$pwfile")"
  SUITE_REDIS_PORT="${KICI_TEST_REDIS_PORT:-$(cat "$SUITE_REDIS_DIR/port" 2>/dev/null || echo 6390)}"
  if suite_redis_answers; then return 0; fi
  if [ -z "${KICI_TEST_REDIS_PORT:-}" ]; then
    while port_in_use "$SUITE_REDIS_PORT"; do
      SUITE_REDIS_PORT=$((SUITE_REDIS_PORT + 1))
      [ "$SUITE_REDIS_PORT" -le 6499 ] || die "no free port for the suite's Redis in 6390..6499"
    done
  fi
  echo "$SUITE_REDIS_PORT" > "$SUITE_REDIS_DIR/port"
  say "starting the suite's Redis on 127.0.0.1:$SUITE_REDIS_PORT"
  (umask 077; printf '%s\n' "port $SUITE_REDIS_PORT" "bind 127.0.0.1" "requirepass $SUITE_REDIS_PASSWORD" \
    "daemonize yes" "pidfile $SUITE_REDIS_DIR/redis.pid" "logfile $LOG_DIR/test-redis.log" "dir $SUITE_REDIS_DIR" \
    'save ""' "appendonly no" > "$SUITE_REDIS_DIR/redis.conf")
  redis-server "$SUITE_REDIS_DIR/redis.conf" 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&-  # keeps no descriptor of its caller (a held lock)
  for _ in $(seq 1 40); do
    suite_redis_answers && return 0
    sleep 0.25
  done
  die "the suite's Redis did not start on 127.0.0.1:$SUITE_REDIS_PORT; see $LOG_DIR/test-redis.log"
}

suite_redis_answers() {  # whether the suite's Redis answers on its port with its password
  REDISCLI_AUTH="$SUITE_REDIS_PASSWORD" redis-cli -h 127.0.0.1 -p "$SUITE_REDIS_PORT" ping 2>/dev/null | grep -q PONG
}

port_in_use() {  # port_in_use PORT: something listens on 127.0.0.1:PORT
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

CONSOLE_REDIS_DIR="$RUN_DIR/redis"

# The console's own Redis (make run, make stop-agents; after load_env): a redis-server of this
# console alone, on the unix socket var/run/redis/redis.sock and no TCP port, in a directory only
# the console's user (root) can open, with a password generated once into var/env as part of
# REDIS_URL (unix://...?db=0&password=...). Anyone else reaching it could queue jobs the workers
# run as root. A REDIS_URL of the operator's own (a shared Redis of several hosts,
# docs/multi-host.md) is used as it is. Restarts reuse the URL; the data is not kept.
ensure_console_redis() {
  local sock="$CONSOLE_REDIS_DIR/redis.sock"
  if [ -n "${REDIS_URL:-}" ] && [[ "$REDIS_URL" != "unix://$sock?"* ]]; then return 0; fi
  command -v redis-server >/dev/null 2>&1 || apt_install redis-server
  if [ -z "${REDIS_URL:-}" ]; then
    REDIS_URL="unix://$sock?db=0&password=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    (umask 077; echo "export REDIS_URL='$REDIS_URL'" >> "$ROOT/var/env")
    chmod 0600 "$ROOT/var/env"  # also when an older set-up created it readable
    say "generated the password of the console's Redis, kept in var/env (REDIS_URL)"
  fi
  export REDIS_URL
  local password="${REDIS_URL##*password=}"
  if REDISCLI_AUTH="$password" redis-cli -s "$sock" ping 2>/dev/null | grep -q PONG; then return 0; fi
  say "starting the console's Redis on $sock"
  start_private_redis "$CONSOLE_REDIS_DIR" "$password" "$LOG_DIR/redis.log"
  STARTED_REDIS=1
}

# start_private_redis DIR PASSWORD LOG: a redis-server listening only on DIR/redis.sock (port 0,
# socket mode 0700) in DIR (made 0700), refusing every client without PASSWORD; its configuration
# (holding the password) is DIR/redis.conf, mode 0600, never the command line.
start_private_redis() {
  local dir="$1" password="$2" log="$3"
  (umask 077; mkdir -p "$dir")
  chmod 0700 "$dir"
  (umask 077; printf '%s\n' "port 0" "unixsocket $dir/redis.sock" "unixsocketperm 700" "requirepass $password" \
    "daemonize yes" "pidfile $dir/redis.pid" "logfile $log" "dir $dir" 'save ""' "appendonly no" > "$dir/redis.conf")
  redis-server "$dir/redis.conf" 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&-  # keeps no descriptor of its caller (a held lock)
  for _ in $(seq 1 40); do
    REDISCLI_AUTH="$password" redis-cli -s "$dir/redis.sock" ping 2>/dev/null | grep -q PONG && return 0
    sleep 0.25
  done
  die "Redis did not start on $dir/redis.sock; see $log"
}

stop_console_redis() {  # shut down the console's Redis (its queued jobs go with it)
  REDISCLI_AUTH="${REDIS_URL##*password=}" redis-cli -s "$CONSOLE_REDIS_DIR/redis.sock" shutdown nosave >/dev/null 2>&1 || true
}

# The dockerd an earlier `make run` started and left running (its agents outlived that run): its
# pid, from var/run/dockerd.pid, when that process is still a dockerd; empty otherwise.
our_dockerd_pid() {
  local pid; pid="$(cat "$RUN_DIR/dockerd.pid" 2>/dev/null || true)"
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] && echo "$pid"
  return 0
}

ensure_dockerd() {  # started with --live-restore: its containers outlive a dockerd stop or restart
  command -v dockerd >/dev/null 2>&1 || apt_install docker.io
  if docker info >/dev/null 2>&1; then
    if [ -n "$(our_dockerd_pid)" ]; then STARTED_DOCKERD=1; say "reusing the dockerd an earlier make run left running (pid $(our_dockerd_pid))"; fi
    return 0
  fi
  say "starting dockerd"
  if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
    $SUDO systemctl start docker
  else
    $SUDO setsid sh -c "nohup dockerd --live-restore --pidfile '$RUN_DIR/dockerd.pid' ${KICI_DOCKERD_FLAGS:-} >>'$LOG_DIR/dockerd.log' 2>&1 &"
    STARTED_DOCKERD=1
  fi
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || die "dockerd did not start; see $LOG_DIR/dockerd.log"
}

load_env() {  # var/env holds what set-up generated (DATABASE_URL for password auth, KICI_API_TOKEN); SECRET_KEY lives in .secret_key
  if [ -f "$ROOT/var/env" ]; then set -a; . "$ROOT/var/env"; set +a; fi
  if [ -z "${SECRET_KEY:-}" ] && [ ! -s "$ROOT/.secret_key" ]; then
    (umask 077; head -c 48 /dev/urandom | base64 | tr -d '\n' > "$ROOT/.secret_key")
  fi
}

ensure_api_token() {  # the orchestrator's bearer token for /api/v1/scale, generated once into var/env
  if [ -n "${KICI_API_TOKEN:-}" ]; then return 0; fi
  KICI_API_TOKEN="kici_$(head -c 24 /dev/urandom | base64 | tr -d '/+=' | head -c 32)"
  export KICI_API_TOKEN
  (umask 077; echo "export KICI_API_TOKEN=$KICI_API_TOKEN" >> "$ROOT/var/env")
  say "generated the orchestrator API token, kept in var/env (${KICI_API_TOKEN:0:9}…; \`. var/env\` exports it)"
}

ensure_secrets_key() {  # the key of the registry credentials' secrets, generated once into var/env
  if [ -n "${KICI_SECRETS_KEY:-}" ]; then return 0; fi
  KICI_SECRETS_KEY="$(head -c 32 /dev/urandom | base64 | tr '+/' '-_')"  # url-safe base64 of 32 bytes (Fernet)
  export KICI_SECRETS_KEY
  (umask 077; echo "export KICI_SECRETS_KEY=$KICI_SECRETS_KEY" >> "$ROOT/var/env")
  say "generated the registry credentials key, kept in var/env (losing it makes stored credentials unreadable)"
}

make_run_pid() {  # the pid of a running `make run` (scripts/run.sh, var/run/run.pid), else empty
  local pid; pid="$(cat "$RUN_DIR/run.pid" 2>/dev/null || true)"
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "scripts/run.sh" \
    && echo "$pid"
  return 0
}

running_agent_containers() {  # ids of the running agent containers: kici-managed, on kici-agent-net
  docker ps -q --filter label=kici-managed=true --filter network=kici-agent-net 2>/dev/null || true
}

# What a stopped make run may have left running, one line each, found without starting anything
# (read-only): the dockerd it started (var/run/dockerd.pid), kici-managed containers and
# kici-agent-net on a docker that answers, this console's isolation tables, a process-mode agent
# writing into this checkout's agent logs (KICI_AGENT_LOG_DIR), a Firecracker VM. Nothing printed:
# none of its agents can be running, and nothing needs starting to end them.
agent_plane_traces() {
  local dpid; dpid="$(our_dockerd_pid)"
  if [ -n "$dpid" ]; then echo "the dockerd make run started (pid $dpid)"; fi
  if docker info >/dev/null 2>&1; then
    local n; n="$(docker ps -aq --filter label=kici-managed=true 2>/dev/null | wc -l)"
    if [ "$n" -gt 0 ]; then echo "$n kici-managed container(s)"; fi
    if docker network inspect kici-agent-net >/dev/null 2>&1; then echo "the network kici-agent-net"; fi
  fi
  local family table="${KICI_NFT_TABLE:-kici}"
  for family in inet bridge netdev; do
    if $SUDO nft list table "$family" "$table" >/dev/null 2>&1; then echo "the nft table $family $table"; fi
  done
  local logs; logs="$(realpath -m "${KICI_AGENT_LOG_DIR:-$ROOT/var/agents}")"
  if $SUDO find /proc/[0-9]*/fd -maxdepth 1 -lname "$logs/*" -print -quit 2>/dev/null | grep -q .; then
    echo "a process-mode agent writing into $logs"
  fi
  if pgrep -x firecracker >/dev/null 2>&1; then echo "a Firecracker VM (firecracker process)"; fi
  return 0
}

# End the data plane of a console that is not running: every kici-managed container on kici-agent-net,
# the network, this console's two isolation tables, then the dockerd make run started. Without their
# containers the tables' map elements and port bindings would judge the next sandbox that reuses one
# of their addresses or veth names. (The agent rows are closed by `manage.py stop_agents` first, or
# by the lost-agents sweep on the next start.)
remove_agent_plane() {
  docker ps -aq --filter label=kici-managed=true --filter network=kici-agent-net | xargs -r docker rm -f >/dev/null 2>&1 || true
  docker network rm kici-agent-net >/dev/null 2>&1 || true
  $SUDO nft delete table inet "${KICI_NFT_TABLE:-kici}" 2>/dev/null || true
  $SUDO nft delete table bridge "${KICI_NFT_TABLE:-kici}" 2>/dev/null || true
  $SUDO nft delete table netdev "${KICI_NFT_TABLE:-kici}" 2>/dev/null || true
  local dpid; dpid="$(our_dockerd_pid)"
  if [ -n "$dpid" ]; then
    $SUDO kill "$dpid" 2>/dev/null || true
    # Wait for it to go (at most 20 s): a make test started right after must not meet its bridge.
    for _ in $(seq 1 40); do kill -0 "$dpid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$dpid" 2>/dev/null; then warn "dockerd (pid $dpid) is still stopping"; fi
  fi
}

# Undo what ensure_* started (make run's Ctrl-C), newest first. A restart is not an outage: while
# agent containers run, they are left running with what they need (dockerd, kici-agent-net, the
# isolation tables) and the next make run re-adopts them; `make stop-agents` ends them.
stop_started_services() {
  local agents; agents="$(running_agent_containers | wc -l)"
  if [ "$agents" -gt 0 ]; then
    local daemon="the system dockerd"
    if [ "$STARTED_DOCKERD" = 1 ]; then daemon="dockerd (pid $(our_dockerd_pid))"; fi
    say "left running: $daemon with $agents agent container(s) on kici-agent-net and their isolation rules" \
      "(nft tables inet/bridge/netdev ${KICI_NFT_TABLE:-kici}); the next make run re-adopts them; \`make stop-agents\` ends them"
  elif [ "$STARTED_DOCKERD" = 1 ]; then
    say "stopping the dockerd make run started (no agent runs; kici-agent-net and the isolation tables go too)"
    remove_agent_plane
  fi
  if [ "$STARTED_REDIS" = 1 ]; then say "stopping the console's Redis"; stop_console_redis; fi
  if [ "$STARTED_POSTGRES" = 1 ]; then
    say "stopping PostgreSQL"
    for v in $(ls /etc/postgresql 2>/dev/null); do $SUDO pg_ctlcluster --skip-systemctl-redirect "$v" main stop 2>/dev/null || true; done
  fi
  # make run's pid file goes with it (a `make stop-agents` beside a running make run leaves that one's).
  if [ "$(cat "$RUN_DIR/run.pid" 2>/dev/null)" = "$$" ]; then rm -f "$RUN_DIR/run.pid"; fi
}

# `make test` beside agents a `make run` left running: the suite's private dockerd needs the agent
# gateway 172.30.0.1 that their kici-agent-net holds. Refuse up front, naming what ends them.
refuse_beside_left_agents() {
  local agents; agents="$(running_agent_containers | wc -l)"
  [ "$agents" -gt 0 ] || return 0
  ip -4 -o addr show 2>/dev/null | grep -q ' inet 172\.30\.0\.1/' || return 0
  die "$agents agent container(s) of make run still run on kici-agent-net (172.30.0.1), which the suite's own dockerd needs; end them with \`make stop-agents\` (stop make run first if it runs), then run make test again"
}

stop_test_dockerd() {  # the test suite's private dockerd would hold 172.30.0.1 too
  if [ -S /run/kici-test-docker.sock ] && [ -x "$VENV/bin/python" ]; then
    say "stopping the test suite's private dockerd (its agent network collides with kici-agent-net)"
    local rc=0
    (cd "$ROOT" && "$VENV/bin/python" -m tests.support.docker stop) || rc=$?
    # 3: a test session or bench still uses it; stopping it would break that run.
    [ "$rc" -eq 3 ] && die "a test session (make test or pytest) is using the suite's private dockerd, which holds 172.30.0.1 like kici-agent-net; run make run again once it has ended"
  fi
  return 0
}
