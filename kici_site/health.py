"""``/healthz``: ok or fail per check (database, Redis, docker, rq workers).

A failing check answers with a fixed word, never the exception's text (which names hosts, paths
and versions to whoever asks); the exception is logged here instead.
"""

from __future__ import annotations

import logging

import django_rq
import docker
from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from rq import Worker

log = logging.getLogger(__name__)


def _check_database() -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
    return "ok"


def _check_redis() -> str:
    django_rq.get_connection("default").ping()
    return "ok"


def _check_docker() -> str:
    client = docker.DockerClient(base_url=settings.DOCKER_HOST) if settings.DOCKER_HOST else docker.from_env()
    try:
        client.ping()
    finally:
        client.close()
    return "ok"


def _check_workers() -> str:
    """``ok``, or the queues no worker listens on (queue names are this console's own settings)."""
    conn = django_rq.get_connection("default")
    listening = {q for w in Worker.all(connection=conn) for q in w.queue_names()}
    missing = sorted(set(settings.RQ_QUEUES) - listening)
    return "no worker listens on " + ", ".join(missing) if missing else "ok"


CHECKS = (
    ("database", _check_database),
    ("redis", _check_redis),
    ("docker", _check_docker),
    ("workers", _check_workers),
)


def healthz(request):
    """Answer ``{"status": "ok"|"degraded", "checks": {name: {"ok": bool, "detail": str}}}``.

    ``detail`` is ``ok``, ``unreachable`` (the check raised; the reason is in the console's log)
    or, for workers, the queues nobody serves. Status 200 when every check passes, 503 otherwise.
    """
    checks = {}
    for name, check in CHECKS:
        try:
            detail = check()
        except Exception:  # reported as a word, logged with its reason
            log.warning("health check %s failed", name, exc_info=True)
            detail = "unreachable"
        checks[name] = {"ok": detail == "ok", "detail": detail}
    healthy = all(c["ok"] for c in checks.values())
    return JsonResponse({"status": "ok" if healthy else "degraded", "checks": checks}, status=200 if healthy else 503)
