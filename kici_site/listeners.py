"""Which requests each listener serves, and how large a request body may be.

The console listens on the operator's address (``KICI_OPERATOR_LISTEN``, loopback by default) and on
the agents' gateway (the address of ``KICI_CONSOLE_URL``), where every sandbox can reach it. The
guard fails closed: a request that did not arrive on an operator listener reaches only the routes
an agent calls (register, claim, its heartbeat: :data:`AGENT_ROUTES`); anything else there, the
orchestrator's API included, is 404 and a WebSocket is closed. A request that comes from no
socket (no ``server`` in its scope: in-process callers) is not on the network and passes.

Every HTTP body is bounded by ``KICI_MAX_REQUEST_BODY_BYTES`` before Django reads it: a
``Content-Length`` over the limit is refused with 413 at once; a body that grows past it while
streaming is cut off and answered 413 in place of the application's response. (daphne's HTTP layer
receives a body whole before the application is called; this bound keeps Django from parsing or
spooling it.)
"""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

#: What an agent itself calls: register, claim (event backends), its own heartbeat.
AGENT_ROUTES = re.compile(r"/api/v1/agents/(register|claim|[^/]+/heartbeat)")


def on_operator_listener(scope: dict, listeners: list[tuple[str, int | None]]) -> bool:
    """Whether ``scope`` arrived on one of ``listeners`` (``(host, port)``, port None = any)."""
    server = scope.get("server")
    if server is None:
        return True
    host, port = server[0], server[1]
    return any(host == h and (p is None or port == p) for h, p in listeners)


def _endpoint(host: str, port: int) -> str:
    return f"tcp:port={port}:interface={host.replace(':', chr(92) + ':')}"


def daphne_endpoints() -> list[str]:
    """daphne ``-e`` endpoint strings: every operator listener, then the agents' gateway (the host
    and port of ``KICI_CONSOLE_URL``) unless it is one of them. Raises ``ImproperlyConfigured`` for
    an operator listener without a port, or a console URL that names no address and port."""
    endpoints, seen = [], set()
    for host, port in settings.KICI_OPERATOR_LISTEN:
        if port is None:
            raise ImproperlyConfigured(f"KICI_OPERATOR_LISTEN: {host}:* cannot be listened on; give a port")
        endpoints.append(_endpoint(host, port))
        seen.add((host, port))
    url = urlsplit(settings.KICI_CONSOLE_URL)
    if not url.hostname or not url.port:
        raise ImproperlyConfigured(f"KICI_CONSOLE_URL={settings.KICI_CONSOLE_URL!r} names no host and port")
    if (url.hostname, url.port) not in seen:
        endpoints.append(_endpoint(url.hostname, url.port))
    return endpoints


def _content_length(scope: dict) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_json(send, status: int, reason: str, message: str) -> None:
    """An answer in the one ``/api/v1`` error shape (``kici_site.errors.api_error``)."""
    body = json.dumps({"error": {"code": reason, "message": message}, "reason": reason}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class ListenerGuard:
    """ASGI middleware in front of the whole application (HTTP and WebSocket)."""

    def __init__(self, app, *, operator_listeners=None, max_body_bytes: int | None = None):
        self.app = app
        self.operator_listeners = operator_listeners or settings.KICI_OPERATOR_LISTEN
        self.max_body_bytes = max_body_bytes or settings.KICI_MAX_REQUEST_BODY_BYTES

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        if not on_operator_listener(scope, self.operator_listeners):
            if scope["type"] == "websocket":
                await receive()  # websocket.connect
                return await send({"type": "websocket.close", "code": 4404})
            if not AGENT_ROUTES.fullmatch(scope["path"]):
                return await _send_json(send, 404, "not-found", "only the agent API is served on this address")
        if scope["type"] == "websocket":
            return await self.app(scope, receive, send)
        return await self._bounded(scope, receive, send)

    async def _bounded(self, scope, receive, send):
        limit = self.max_body_bytes
        length = _content_length(scope)
        if length is not None and length > limit:
            return await _send_json(send, 413, "body-too-large", f"request body over {limit} bytes")
        state = {"read": 0, "over": False, "started": False}

        async def bounded_receive():
            if state["over"]:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                state["read"] += len(message.get("body", b""))
                if state["read"] > limit:
                    state["over"] = True
                    return {"type": "http.disconnect"}  # the application stops reading
            return message

        async def tracked_send(message):
            if message["type"] == "http.response.start":
                if state["over"]:
                    return
                state["started"] = True
            elif state["over"] and not state["started"]:
                return
            await send(message)

        await self.app(scope, bounded_receive, tracked_send)
        if state["over"] and not state["started"]:
            await _send_json(send, 413, "body-too-large", f"request body over {limit} bytes")
