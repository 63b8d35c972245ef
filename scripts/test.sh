#!/usr/bin/env bash
# `make test`: install what the suite needs, start PostgreSQL and Redis when stopped, run pytest.
. "$(dirname "$0")/lib.sh"
cd "$ROOT"

apt_install nftables iproute2 busybox-static e2fsprogs docker.io chromium ca-certificates curl
ensure_postgres
ensure_redis
ensure_venv
load_env
ensure_database
bash "$ROOT/scripts/lint.sh"
export SECRET_KEY="${SECRET_KEY:-test-only-not-secret}"
set +e
"$VENV/bin/pytest" "$@"
rc=$?
set -e
# The suite's private dockerd: stop it (and remove its networks) unless asked to keep it, so no
# bridge is left holding 172.30.0.1 for `make run`'s own kici-agent-net (tests/support/docker.py).
if [ -z "${KICI_TEST_KEEP_DOCKERD:-}" ]; then "$VENV/bin/python" -m tests.support.docker stop || true; fi
[ $rc -eq 5 ] && { warn "pytest collected no tests"; exit 1; }
exit $rc
