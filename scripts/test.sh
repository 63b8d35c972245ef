#!/usr/bin/env bash
# `make test`: install what the suite needs, start PostgreSQL and Redis when stopped, run pytest.
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

apt_install nftables libnftables1 iproute2 busybox-static e2fsprogs docker.io chromium ca-certificates curl \
  docker-registry apache2-utils lz4 qemu-system-x86 prometheus
ensure_postgres
ensure_redis
ensure_venv
load_env
ensure_database
refuse_beside_left_agents
bash "$ROOT/scripts/lint.sh"
export SECRET_KEY="${SECRET_KEY:-test-only-not-secret}"
# The suite's own Redis database, emptied before and after: no test job or key reaches the
# database 0 that `make run`'s workers serve.
if [ -z "${REDIS_URL:-}" ]; then
  export REDIS_URL="redis://127.0.0.1:6379/15"
  redis-cli -h 127.0.0.1 -p 6379 -n 15 flushdb >/dev/null
fi
set +e
"$VENV/bin/pytest" "$@"
rc=$?
set -e
# The suite's private dockerd: stop it (and remove its networks) unless asked to keep it, so no
# bridge is left holding 172.30.0.1 for `make run`'s own kici-agent-net (tests/support/docker.py).
if [ -z "${KICI_TEST_KEEP_DOCKERD:-}" ]; then "$VENV/bin/python" -m tests.support.docker stop || true; fi
[ "${REDIS_URL}" = "redis://127.0.0.1:6379/15" ] && redis-cli -h 127.0.0.1 -p 6379 -n 15 flushdb >/dev/null
[ $rc -eq 5 ] && { warn "pytest collected no tests"; exit 1; }
exit $rc
