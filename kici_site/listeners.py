"""Which requests each listener serves, and how large a request body may be. The guard fails
closed: off the operator's listeners only the routes an agent calls (:data:`AGENT_ROUTES`) answer,
and on the orchestrator's API listener only the API without them (:func:`orchestrator_path`).
Every HTTP body is bounded before Django reads it, and a WebSocket handshake must come from a page
of the console itself (:class:`OperatorOriginValidator`). Design: docs/serving.md ("What each
listener serves") and docs/browser-security.md ("WebSocket origins").
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

from lib.errors import API_PREFIX

#: Bytes of a request line (method, target, version) either server reads; a longer one is
#: answered 414 (twisted's own line limit, which daphne keeps).
MAX_REQUEST_LINE_BYTES = 16 * 1024
#: Bytes of one header line either server reads; a longer one is answered 431.
MAX_HEADER_LINE_BYTES = 16 * 1024
#: Bytes of a request's head (request line and headers) either server reads; more is answered 431.
MAX_REQUEST_HEAD_BYTES = 64 * 1024

_STATUS_PHRASES = {
    408: "Request Timeout",
    413: "Content Too Large",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
}


def _error_body(reason: str, message: str) -> bytes:
    """An answer's body in the one ``/api/v1`` error shape (``lib.errors.api_error``)."""
    return json.dumps({"error": {"code": reason, "message": message}, "reason": reason}).encode()


def closing_answer(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 response in the ``/api/v1`` error shape that closes the connection, for a
    server refusing a request before the application sees it (408, 413, 414, 431)."""
    body = _error_body(reason, message)
    head = (
        f"HTTP/1.1 {status} {_STATUS_PHRASES[status]}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


#: What an agent itself calls: register, claim (event backends), its own heartbeat.
AGENT_ROUTES = re.compile(r"/api/v1/agents/(register|claim|[^/]+/heartbeat)")

#: The listeners whose processes serve one part alone (``ListenerGuard(listener=...)``): the
#: agents' gateway (``KICI_CONSOLE_URL``) and the orchestrator's API (``KICI_API_LISTEN``).
GATEWAY, API = "gateway", "api"


def agent_path(path: str) -> bool:
    """Whether the agents' gateway serves ``path``: one of :data:`AGENT_ROUTES`."""
    return AGENT_ROUTES.fullmatch(path) is not None


def orchestrator_path(path: str) -> bool:
    """Whether the orchestrator's API listener serves ``path``: under ``/api/`` but no path that
    begins as an agent route does, or ``/healthz``."""
    return path == "/healthz" or (path.startswith(API_PREFIX) and AGENT_ROUTES.match(path) is None)


#: Per listener: the paths it serves and what its 404 says of it.
_SERVED = {
    GATEWAY: (agent_path, "only the agent API is served on this address"),
    API: (orchestrator_path, "only the orchestrator's API is served on this address"),
}


def on_operator_listener(scope: dict, listeners: list[tuple[str, int | None]]) -> bool:
    """Whether ``scope`` arrived on one of ``listeners`` (``(host, port)``, port None = any)."""
    server = scope.get("server")
    if server is None:
        return True
    host, port = server[0], server[1]
    return any(host == h and (p is None or port == p) for h, p in listeners)


def operator_addresses() -> list[tuple[str, int]]:
    """The operator listeners to listen on (``KICI_OPERATOR_LISTEN``). Raises
    ``ImproperlyConfigured`` for one without a port."""
    out = []
    for host, port in settings.KICI_OPERATOR_LISTEN:
        if port is None:
            raise ImproperlyConfigured(f"KICI_OPERATOR_LISTEN: {host}:* cannot be listened on; give a port")
        out.append((host, port))
    return out


def api_addresses() -> list[tuple[str, int]]:
    """The orchestrator's API listeners (``KICI_API_LISTEN``), none when it is empty. Raises
    ``ImproperlyConfigured`` for one without a port, or one that is an operator listener or the
    agents' gateway (processes sharing an address with ``SO_REUSEPORT`` share its connections)."""
    taken: dict[tuple[str | None, int | None], str] = dict.fromkeys(operator_addresses(), "KICI_OPERATOR_LISTEN")
    url = urlsplit(settings.KICI_CONSOLE_URL)
    with contextlib.suppress(ValueError):  # a console URL without a valid port names no address
        taken.setdefault((url.hostname, url.port), "KICI_CONSOLE_URL")
    out = []
    for host, port in settings.KICI_API_LISTEN:
        if port is None:
            raise ImproperlyConfigured(f"KICI_API_LISTEN: {host}:* cannot be listened on; give a port")
        if (host, port) in taken:
            raise ImproperlyConfigured(f"KICI_API_LISTEN: {host}:{port} is also in {taken[host, port]}")
        out.append((host, port))
    return out


def gateway_address() -> tuple[str, int] | None:
    """The agents' gateway (the host and port of ``KICI_CONSOLE_URL``), None when it is one of the
    operator listeners (then the operator's server answers agents too). Raises
    ``ImproperlyConfigured`` for a console URL that names no address and port."""
    url = urlsplit(settings.KICI_CONSOLE_URL)
    if not url.hostname or not url.port:
        raise ImproperlyConfigured(f"KICI_CONSOLE_URL={settings.KICI_CONSOLE_URL!r} names no host and port")
    if (url.hostname, url.port) in operator_addresses():
        return None
    return url.hostname, url.port


def listening_socket(host: str, port: int, backlog: int | None = None) -> socket.socket:
    """A TCP socket listening on ``host:port`` with ``SO_REUSEPORT``, so that several server
    processes listen on one address and the kernel spreads new connections over them; its queue
    of connections not yet accepted holds ``backlog`` (``KICI_LISTEN_BACKLOG``; the kernel caps
    it at ``net.core.somaxconn``). Inheritable: a server started with ``exec`` adopts it. Raises
    OSError when the address cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(backlog or settings.KICI_LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def daphne_endpoints(sockets: list[socket.socket], ipv6: list[tuple[str, int]]) -> list[str]:
    """daphne ``-e`` endpoint strings: adopting each IPv4 listening socket of ``sockets``, and
    listening on each IPv6 address of ``ipv6`` itself (Twisted adopts only IPv4 sockets by file
    descriptor, so those cannot be shared by several processes)."""
    adopted = [f"fd:fileno={s.fileno()}" for s in sockets]
    return adopted + [f"tcp6:port={port}:interface={host.replace(':', chr(92) + ':')}" for host, port in ipv6]


def _content_length(scope: dict) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_json(send, status: int, reason: str, message: str) -> None:
    """An answer in the one ``/api/v1`` error shape; a 413 also asks the server to close the
    connection rather than read the rest of the body."""
    body = _error_body(reason, message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 413:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ListenerGuard:
    """ASGI middleware in front of the whole application (HTTP and WebSocket). With ``listener``
    (:data:`GATEWAY` or :data:`API`: the processes of ``kici_site.gateway`` serving that listener)
    every request is treated as arriving there, whatever its scope says; without it, a request
    that did not arrive on an operator listener is treated as arriving on the gateway. Off the
    operator listeners a WebSocket is closed and a path that listener does not serve is 404."""

    def __init__(self, app, *, operator_listeners=None, max_body_bytes: int | None = None, listener: str | None = None):
        if listener is not None and listener not in _SERVED:
            raise ValueError(f"listener={listener!r} is not one of {', '.join(_SERVED)}")
        self.app = app
        self.operator_listeners = operator_listeners or settings.KICI_OPERATOR_LISTEN
        self.max_body_bytes = max_body_bytes or settings.KICI_MAX_REQUEST_BODY_BYTES
        self.listener = listener

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        listener = self.listener
        if listener is None and not on_operator_listener(scope, self.operator_listeners):
            listener = GATEWAY
        if listener is not None:
            if scope["type"] == "websocket":
                await receive()  # websocket.connect
                return await send({"type": "websocket.close", "code": 4404})
            served, refusal = _SERVED[listener]
            if not served(scope["path"]):
                return await _send_json(send, 404, "not-found", refusal)
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


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(scheme: str, host: str, port: int | None) -> str:
    """``scheme://host[:port]`` lower-cased, the default port left out, IPv6 in brackets."""
    host = host.lower()
    if ":" in host:
        host = f"[{host}]"
    if port is None or port == _DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def normal_origin(value: str) -> str | None:
    """``value`` (an ``Origin`` header or a configured origin) as :func:`_origin` writes it; None
    when it is no ``http(s)://host[:port]`` origin."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    return _origin(parts.scheme, parts.hostname, port)


def operator_origins() -> tuple[frozenset[str], list[tuple[str, str]]]:
    """The configured origins of the operator pages: ``KICI_OPERATOR_URL``'s, each
    ``CSRF_TRUSTED_ORIGINS`` entry and ``http://host:port`` of each ``KICI_OPERATOR_LISTEN``
    listener with a port. Returns the exact origins and the ``CSRF_TRUSTED_ORIGINS`` wildcards as
    ``(scheme, ".domain[:port]")`` (``https://*.example.com``, matched as Django's CSRF check does)."""
    exact, wildcards = set(), []
    for value in [settings.KICI_OPERATOR_URL, *settings.CSRF_TRUSTED_ORIGINS]:
        scheme, sep, netloc = value.partition("://")
        if sep and netloc.startswith("*"):
            wildcards.append((scheme.lower(), netloc[1:].lower()))
            continue
        origin = normal_origin(value)
        if origin:
            exact.add(origin)
    for host, port in settings.KICI_OPERATOR_LISTEN:
        if port is not None:
            exact.add(_origin("http", host, port))
    return frozenset(exact), wildcards


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def own_origin(scope: dict) -> str | None:
    """The origin a WebSocket handshake was addressed to: ``https`` for ``wss`` (or, with
    ``KICI_TLS_PROXY``, an ``X-Forwarded-Proto: https``), else ``http``, with its ``Host`` header;
    None without a ``Host`` in ``ALLOWED_HOSTS``."""
    host = _header(scope, b"host")
    if not host:
        return None
    domain, port = split_domain_port(host.lower())
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    secure = scope.get("scheme") in ("wss", "https") or (
        settings.KICI_TLS_PROXY and (_header(scope, b"x-forwarded-proto") or "").strip().lower() == "https"
    )
    scheme = "https" if secure else "http"
    return normal_origin(f"{scheme}://{host}")


def origin_allowed(scope: dict, exact: frozenset[str], wildcards: list[tuple[str, str]]) -> bool:
    """Whether the handshake's ``Origin`` is its own origin or a configured one (module doc)."""
    raw = _header(scope, b"origin")
    origin = normal_origin(raw) if raw else None
    if origin is None:
        return False
    if origin == own_origin(scope) or origin in exact:
        return True
    scheme, _, netloc = origin.partition("://")
    return any(scheme == s and is_same_domain(netloc, pattern) for s, pattern in wildcards)


class OperatorOriginValidator:
    """ASGI middleware for WebSockets: refuses a handshake whose ``Origin`` is not allowed
    (:func:`origin_allowed`) with a close before accepting, which daphne answers with 403."""

    def __init__(self, app):
        self.app = app
        self.exact, self.wildcards = operator_origins()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope, self.exact, self.wildcards):
            await receive()  # websocket.connect
            return await send({"type": "websocket.close", "code": 4403})
        return await self.app(scope, receive, send)


async def read_body(receive) -> bytes | None:
    """The request's whole body from the server (bounded before it gets here: the listener guard,
    and on the gateway and API listeners their protocol), or None when the client went away
    meanwhile."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return bytes(body)
