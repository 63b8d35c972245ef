"""Which Origin may open a WebSocket (kici_site.listeners.OperatorOriginValidator): scheme, host
and port, against the handshake's own origin and the configured operator origins."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator

from kici_site.listeners import OperatorOriginValidator, operator_origins, origin_allowed


def scope(origin: str | None, host: str | None = "127.0.0.1:8000", scheme: str = "ws", **headers) -> dict:
    pairs = []
    if origin is not None:
        pairs.append((b"origin", origin.encode()))
    if host is not None:
        pairs.append((b"host", host.encode()))
    pairs += [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return {"type": "websocket", "scheme": scheme, "headers": pairs}


def allowed(s: dict) -> bool:
    return origin_allowed(s, *operator_origins())


@pytest.fixture(autouse=True)
def operator(settings):
    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]", "console.example.com"]
    settings.KICI_OPERATOR_LISTEN = [("127.0.0.1", 8000)]
    settings.KICI_OPERATOR_URL = "http://127.0.0.1:8000"
    settings.CSRF_TRUSTED_ORIGINS = []
    settings.KICI_TLS_PROXY = False
    return settings


def test_the_pages_own_origin_is_allowed():
    assert allowed(scope("http://127.0.0.1:8000"))
    assert allowed(scope("http://localhost:8000", host="localhost:8000"))
    assert allowed(scope("http://[::1]:8000", host="[::1]:8000"))


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:9999",  # another local port: same host, same cookies
        "http://localhost:8000",  # another host than the handshake's, not configured
        "https://127.0.0.1:8000",  # another scheme
        "http://127.0.0.1",  # port 80
        "http://evil.example",
        "null",
        "",
    ],
)
def test_another_origin_is_refused(origin):
    assert not allowed(scope(origin))


def test_no_origin_or_a_host_outside_allowed_hosts_is_refused():
    assert not allowed(scope(None))
    assert not allowed(scope("http://rebound.example:8000", host="rebound.example:8000"))


def test_configured_operator_origins_are_allowed_with_their_port(operator):
    operator.KICI_OPERATOR_URL = "https://console.example.com"
    operator.CSRF_TRUSTED_ORIGINS = ["https://ops.example.com:8443", "https://*.corp.example"]
    operator.KICI_OPERATOR_LISTEN = [("127.0.0.1", 8000), ("10.0.0.5", 8001), ("0.0.0.0", None)]
    assert allowed(scope("https://console.example.com"))
    assert allowed(scope("https://console.example.com:443"))
    assert not allowed(scope("https://console.example.com:444"))
    assert allowed(scope("https://ops.example.com:8443"))
    assert not allowed(scope("https://ops.example.com"))
    assert allowed(scope("https://a.corp.example"))
    assert not allowed(scope("http://a.corp.example"))
    assert not allowed(scope("https://a.corp.example:8443"))
    assert allowed(scope("http://10.0.0.5:8001"))
    assert not allowed(scope("http://10.0.0.5:8000"))


def test_behind_a_tls_proxy_the_forwarded_scheme_counts_only_when_configured(operator):
    forwarded = scope("https://console.example.com", host="console.example.com", x_forwarded_proto="https")
    assert not allowed(forwarded)
    operator.KICI_TLS_PROXY = True
    assert allowed(forwarded)
    assert allowed(scope("https://console.example.com", host="console.example.com", scheme="wss"))


async def test_the_validator_refuses_the_handshake_before_the_application():
    reached = []

    async def app(scope, receive, send):
        reached.append(scope)
        await receive()
        await send({"type": "websocket.accept"})

    for origin, expected in (("http://127.0.0.1:9999", False), ("http://127.0.0.1:8000", True)):
        headers = [(b"origin", origin.encode()), (b"host", b"127.0.0.1:8000")]
        comm = WebsocketCommunicator(OperatorOriginValidator(app), "/ws/events/", headers=headers)
        connected, _ = await comm.connect()
        assert connected is expected, origin
        await comm.disconnect()
    assert len(reached) == 1


async def test_the_application_refuses_another_local_ports_origin():
    from kici_site.asgi import application

    headers = [(b"origin", b"http://127.0.0.1:9999"), (b"host", b"127.0.0.1:8000")]
    comm = WebsocketCommunicator(application, "/ws/events/", headers=headers)
    connected, code = await comm.connect()
    assert not connected, code
