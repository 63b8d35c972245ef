"""The baseline of bench/http.py: a bare Django project in one file, one view doing one indexed
query (an agent by its id, on the console's own table) with a persistent connection, as any Django
deployment serves it under gunicorn's sync workers.

    DATABASE_URL=postgres://... gunicorn -w 2 --chdir bench/baseline bare_django:application
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import django
from django.conf import settings
from django.core.wsgi import get_wsgi_application
from django.db import connection
from django.http import Http404, JsonResponse
from django.urls import path


def agent(request, agent_id: str):
    with connection.cursor() as cur:
        cur.execute("SELECT agent_id, state, last_heartbeat FROM agents_agent WHERE agent_id = %s", [agent_id])
        row = cur.fetchone()
    if row is None:
        raise Http404(agent_id)
    return JsonResponse({"agentId": row[0], "state": row[1], "lastHeartbeat": row[2]})


urlpatterns = [path("api/v1/agents/<str:agent_id>", agent)]

_db = urlsplit(os.environ["DATABASE_URL"])
settings.configure(
    DEBUG=False,
    SECRET_KEY="bench-only-not-secret",
    ALLOWED_HOSTS=["127.0.0.1"],
    ROOT_URLCONF=__name__,
    MIDDLEWARE=[],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _db.path.lstrip("/"),
            "USER": _db.username or "postgres",
            "PASSWORD": _db.password or "",
            "HOST": _db.hostname or "127.0.0.1",
            "PORT": str(_db.port or 5432),
            "CONN_MAX_AGE": 600,
        }
    },
)
django.setup()
application = get_wsgi_application()
