#!/usr/bin/env bash
# `make stop-agents`: end the agents a `make run` left running (a console restart keeps them).
# Each agent is torn down through the console's own teardown (manage.py stop_agents: sandbox and
# rules removed, row destroyed, reservation released). When no make run is running, what served
# them goes too: every kici-managed container left, kici-agent-net, the console's isolation
# tables and the dockerd make run started; PostgreSQL, Redis and dockerd are started for the
# teardown when stopped, and stopped again, but only when something of make run's agents is left
# (agent_plane_traces): with nothing running, nothing is started (agent rows a crash left active
# are released by the lost-agents sweep of the next make run).
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
ensure_venv
load_env
run_pid="$(make_run_pid)"
if [ -n "$run_pid" ]; then
  docker info >/dev/null 2>&1 || die "make run (pid $run_pid) is running but docker does not answer"
else
  traces="$(agent_plane_traces)"
  if [ -z "$traces" ]; then
    say "no make run runs and nothing of its agents is left (no dockerd of its own, kici-managed container, kici-agent-net, isolation table, process-mode agent or VM): nothing to stop, nothing started"
    exit 0
  fi
  say "left by make run: ${traces//$'\n'/; }"
  trap stop_started_services EXIT
  ensure_postgres
  ensure_console_redis
  ensure_dockerd
fi
ensure_database
say "tearing down this console's agents"
"$VENV/bin/python" manage.py stop_agents
if [ -n "$run_pid" ]; then
  say "make run (pid $run_pid) is running: its dockerd and kici-agent-net stay for its next agents"
else
  say "removing what served them: kici-managed containers, kici-agent-net, the isolation tables, make run's dockerd"
  remove_agent_plane
  STARTED_DOCKERD=0
fi
