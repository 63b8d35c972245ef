"""``/healthz``: JSON status of the database, Redis, docker and the rq workers."""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import JsonResponse


def _check_database() -> tuple[bool, str]:
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        return True, "ok"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return False, str(exc)


def _check_redis() -> tuple[bool, str]:
    import django_rq

    try:
        django_rq.get_connection("default").ping()
        return True, "ok"
    except Exception as exc:  # noqa: BLE001
        return False, str(exc)


def _check_docker() -> tuple[bool, str]:
    import docker

    try:
        client = docker.DockerClient(base_url=settings.DOCKER_HOST) if settings.DOCKER_HOST else docker.from_env()
        try:
            client.ping()
        finally:
            client.close()
        return True, "ok"
    except Exception as exc:  # noqa: BLE001
        return False, str(exc)


def _check_workers() -> tuple[bool, str]:
    import django_rq
    from rq import Worker

    try:
        conn = django_rq.get_connection("default")
        queues = set(settings.RQ_QUEUES)
        listening = {q for w in Worker.all(connection=conn) for q in w.queue_names()}
        missing = sorted(queues - listening)
        if missing:
            return False, "no worker listens on " + ", ".join(missing)
        return True, "ok"
    except Exception as exc:  # noqa: BLE001
        return False, str(exc)


def healthz(request):
    """Answer ``{"status": "ok"|"degraded", "checks": {name: {"ok": bool, "detail": str}}}``.

    Status 200 when every check passes, 503 otherwise.
    """
    checks = {}
    for name, fn in (
        ("database", _check_database),
        ("redis", _check_redis),
        ("docker", _check_docker),
        ("workers", _check_workers),
    ):
        ok, detail = fn()
        checks[name] = {"ok": ok, "detail": detail}
    healthy = all(c["ok"] for c in checks.values())
    return JsonResponse({"status": "ok" if healthy else "degraded", "checks": checks}, status=200 if healthy else 503)
