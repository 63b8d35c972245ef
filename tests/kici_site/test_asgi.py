"""The web process's entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = "import gc; import kici_site.asgi; print(gc.get_freeze_count(), len(gc.get_objects()))"


def test_the_startup_heap_is_out_of_the_collectors_reach():
    """Loading the ASGI application freezes what it loaded: a full collection then walks only
    what requests made (the framework's heap, walked each time, stalls every request in
    flight)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "kici_site.settings"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    frozen, tracked = int(out[0]), int(out[1])
    assert frozen > 50_000, f"only {frozen} objects frozen"
    assert tracked < 1_000, f"{tracked} objects still tracked by the collector"


def _get(path: str, **headers) -> tuple[int, dict, int]:
    """``(status, headers, thread hops)`` of one GET through the ASGI application, in process."""
    import asyncio
    from urllib.parse import unquote

    import asgiref.sync
    from asgiref.testing import ApplicationCommunicator

    from kici_site.asgi import application

    hops = []
    call = asgiref.sync.SyncToAsync.__call__

    async def counted(self, *args, **kwargs):
        hops.append(self.func)
        return await call(self, *args, **kwargs)

    async def exchange() -> dict:
        raw = [(b"host", b"localhost")] + [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        scope = {"type": "http", "http_version": "1.1", "method": "GET", "path": unquote(path), "query_string": b""}
        app = ApplicationCommunicator(application, {**scope, "headers": raw})
        await app.send_input({"type": "http.request", "body": b""})
        response = await app.receive_output(10)
        message = response
        while message.get("more_body", message["type"] == "http.response.start"):
            message = await app.receive_output(10)
        await app.wait(10)
        return response

    asgiref.sync.SyncToAsync.__call__ = counted
    try:
        response = asyncio.run(exchange())
    finally:
        asgiref.sync.SyncToAsync.__call__ = call
    return response["status"], {k.decode().lower(): v.decode() for k, v in response["headers"]}, len(hops)


@pytest.mark.django_db(transaction=True)
def test_the_api_goes_through_its_short_middleware_list_and_pages_through_the_full_one(settings):
    settings.KICI_API_TOKEN = "asgi-test-token"
    status, headers, hops = _get("/api/v1/agents/nobody", Authorization="Bearer asgi-test-token")
    assert status == 404 and headers["content-type"] == "application/json"
    # A synchronous API view runs whole on the server's thread, as in a WSGI worker: no hop at all.
    assert hops == 0, f"{hops} thread hops for one API call"
    assert "content-security-policy" not in headers and "x-frame-options" not in headers
    status, headers, hops = _get("/accounts/login/")
    assert status == 200 and "content-security-policy" in headers and "x-frame-options" in headers


@pytest.mark.django_db(transaction=True)
def test_the_api_keeps_its_json_errors_and_nul_guard():
    status, headers, _ = _get("/api/v1/agents/a%00b", Authorization="Bearer x")
    assert status == 400 and headers["content-type"] == "application/json"


def test_static_files_are_served_in_the_async_stack_and_other_requests_pass_by_without_a_hop():
    from django.conf import settings
    from django.utils.module_loading import import_string

    assert all(getattr(import_string(m), "async_capable", False) for m in settings.MIDDLEWARE)
    status, headers, _ = _get("/static/css/kici.css")
    assert status == 200 and headers["content-type"].startswith("text/css")


@pytest.mark.django_db(transaction=True)
def test_api_answers_carry_their_length_from_either_handler(settings):
    """Without Content-Length the server chunks an answer (HTTP/1.1) or closes its connection
    (HTTP/1.0): a synchronous view's answer and the asynchronous /scale's both carry one."""
    settings.KICI_API_TOKEN = "asgi-test-token"
    for path in ("/api/v1/agents/nobody", "/api/v1/scale"):
        status, headers, _ = _get(path, Authorization="Bearer asgi-test-token")
        assert status in (404, 405) and int(headers["content-length"]) > 0, (path, headers)


@pytest.mark.django_db(transaction=True)
def test_the_asynchronous_api_answers_without_a_thread_hop(settings):
    """``/scale`` (here refused: GET is not allowed) runs on the server's thread from the request
    to its close, its error's log line included: Django's handler crossed to a thread three times
    (the request's start, the log line, the close) and started one per request."""
    settings.KICI_API_TOKEN = "asgi-test-token"
    status, headers, hops = _get("/api/v1/scale", Authorization="Bearer asgi-test-token")
    assert status == 405 and headers["allow"] == "POST"
    assert hops == 0, f"{hops} thread hops for one /scale"


@pytest.mark.django_db(transaction=True)
def test_an_api_path_is_resolved_once_and_before_the_pages_patterns(settings, monkeypatch):
    """Each API call is resolved once (the match that chose its handler is handed over), and
    its resolution tries none of the pages' patterns (a failed include builds the list of every
    pattern it tried)."""
    from django.urls import get_resolver
    from django.urls.resolvers import URLResolver

    import front.urls

    settings.KICI_API_TOKEN = "asgi-test-token"
    resolve = URLResolver.resolve
    root_calls = []

    def counted(self, path):
        if self.urlconf_name == settings.ROOT_URLCONF:
            root_calls.append(path)
        return resolve(self, path)

    monkeypatch.setattr(URLResolver, "resolve", counted)
    for path in ("/api/v1/scale", "/api/v1/agents/nobody"):
        root_calls.clear()
        _get(path, Authorization="Bearer asgi-test-token")
        assert root_calls == [path]
    pages = {id(p) for p in front.urls.urlpatterns}
    for path in ("/api/v1/scale", "/api/v1/agents/a/heartbeat", "/api/v1/agents/a"):
        tried = get_resolver().resolve(path).tried
        assert not any(id(p) in pages for chain in tried for p in chain), path
