#!/usr/bin/env bash
# `make test`: install what the suite needs, start PostgreSQL and Redis when stopped, run pytest.
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
# The suite's Redis as the caller names it (taken before load_env: var/env's REDIS_URL is the console's).
SUITE_REDIS_URL="${KICI_TEST_REDIS_URL:-${REDIS_URL:-}}"

apt_install nftables libnftables1 iproute2 busybox-static e2fsprogs docker.io chromium ca-certificates curl \
  docker-registry apache2-utils lz4 qemu-system-x86 prometheus
ensure_postgres
ensure_suite_redis
ensure_venv
load_env
ensure_database
refuse_beside_left_agents
bash "$ROOT/scripts/lint.sh"
export SECRET_KEY="${SECRET_KEY:-test-only-not-secret}"
# The suite's own Redis database (kici_site/settings_test.py refuses a console's), by default db 15
# of the suite's password-protected Redis (ensure_suite_redis), emptied before and after: no test
# job or key reaches a console's queues.
OWN_REDIS=0
if [ -z "$SUITE_REDIS_URL" ]; then
  SUITE_REDIS_URL="redis://:$SUITE_REDIS_PASSWORD@127.0.0.1:$SUITE_REDIS_PORT/15"
  OWN_REDIS=1
  REDISCLI_AUTH="$SUITE_REDIS_PASSWORD" redis-cli -h 127.0.0.1 -p "$SUITE_REDIS_PORT" -n 15 flushdb >/dev/null
fi
export KICI_TEST_REDIS_URL="$SUITE_REDIS_URL"
set +e
"$VENV/bin/pytest" "$@"
rc=$?
set -e
# The suite's private dockerd: stop it (and remove its networks) unless asked to keep it, so no
# bridge is left holding 172.30.0.1 for `make run`'s own kici-agent-net (tests/support/docker.py).
# Left running while another session still uses it (exit 3 and a line saying so).
if [ -z "${KICI_TEST_KEEP_DOCKERD:-}" ]; then "$VENV/bin/python" -m tests.support.docker stop || true; fi
[ "$OWN_REDIS" = 1 ] && REDISCLI_AUTH="$SUITE_REDIS_PASSWORD" redis-cli -h 127.0.0.1 -p "$SUITE_REDIS_PORT" -n 15 flushdb >/dev/null
[ $rc -eq 5 ] && { warn "pytest collected no tests"; exit 1; }
exit $rc
