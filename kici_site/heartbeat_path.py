"""The gateway's lean heartbeat: ``POST /api/v1/agents/<id>/heartbeat`` answered ahead of Django's
handler when it succeeds. The body is read, checked as the view checks it (bearer token,
``Content-Type``, a JSON object, ``HeartbeatBody``, no NUL), and the beat is written by the
process's batcher (``agents.heartbeat_batch``); written, it is answered 200 with the view's own
answer (``scalers.agent_api.heartbeat_answer``). Anything else (no or a refused token, a bad body,
a beat the statement did not write, a database failure) goes on to the Django application, its
body handed over as it was read, and the view gives the exact refusal (or writes the beat
itself). Why: docs/serving.md ("One heartbeat").
"""

from __future__ import annotations

import re
from functools import cache

from agents.heartbeat_batch import HeartbeatBatcher
from kici_site.listeners import read_body
from kici_site.middleware import JSON_NUL, NUL
from lib.errors import json_content_type_accepted
from lib.json_body import BodyRefused, validate_body
from lib.json_input import parse_json_object
from scalers.agent_api import bearer_token, heartbeat_answer
from scalers.api_models import HeartbeatBody

#: The heartbeat's path (the route ``agent_heartbeat``: ``<str:agent_id>`` is one segment).
HEARTBEAT_PATH = re.compile(r"/api/v1/agents/([^/]+)/heartbeat")
#: The headers the view reads; one sent twice goes to Django, which joins the values.
_READ = {b"authorization": "authorization", b"content-type": "content-type", b"content-length": "content-length"}


def beat_of(headers: list[tuple[bytes, bytes]], body: bytes) -> tuple[str, int | None] | None:
    """``(token, active_jobs)`` of a heartbeat request the view would write as asked, from its
    ASGI ``headers`` and ``body``; None for one the view would refuse, or may."""
    seen: dict[str, str] = {}
    for name, value in headers:
        if (key := _READ.get(name)) is not None:
            if key in seen:
                return None
            seen[key] = value.decode("latin-1")  # as Django decodes a header
    token = bearer_token(seen.get("authorization", ""))
    if token is None or JSON_NUL in body:
        return None
    try:
        if not json_content_type_accepted(seen.get("content-type", ""), seen.get("content-length", "")):
            return None
        return token, validate_body(HeartbeatBody, parse_json_object(body)).active_jobs
    except (ValueError, BodyRefused):  # BodyRefused is a ValueError; named for the reader
        return None


@cache
def _answer(state: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The ASGI headers and body of :func:`heartbeat_answer` for ``state``, as the API's handler
    sends them (``kici_site.asgi.SyncApiHandler``: its headers and a ``Content-Length``)."""
    response = heartbeat_answer(state)
    content = response.content
    headers = [(name.encode("ascii"), value.encode("latin1")) for name, value in response.items()]
    headers.append((b"Content-Length", str(len(content)).encode("ascii")))
    return headers, content


class HeartbeatPath:
    """ASGI middleware of the gateway (module doc): heartbeats that succeed are answered here, all
    else goes to ``app``. One batcher per process (``batcher``: by default a new one)."""

    def __init__(self, app, batcher: HeartbeatBatcher | None = None):
        self.app = app
        self.batcher = batcher or HeartbeatBatcher()

    async def __call__(self, scope, receive, send):
        match = HEARTBEAT_PATH.fullmatch(scope["path"]) if scope["type"] == "http" else None
        if match is None or scope["method"] != "POST" or scope.get("query_string") or NUL in match[1]:
            return await self.app(scope, receive, send)
        body = await read_body(receive)
        if body is None:
            return
        beat = beat_of(scope["headers"], body)
        state = None if beat is None else await self.batcher.beat(beat[0], match[1], beat[1])
        if state is None:
            return await self.app(scope, _replaying(body, receive), send)
        headers, content = _answer(state)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})


def _replaying(body: bytes, receive):
    """A ``receive`` that gives ``body`` whole first, then what ``receive`` gives."""
    given = False

    async def replay():
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
