"""What each listener serves, and the request body bound (kici_site.listeners).

The real-server tests run daphne as ``make run`` does, with two listeners on loopback addresses
this machine owns: 127.0.0.1 plays the operator's address and 127.0.0.2 the agents' gateway.
"""

import asyncio

import pytest
import requests
from django.core.exceptions import ImproperlyConfigured

from kici_site.listeners import (
    ListenerGuard,
    daphne_endpoints,
    gateway_address,
    listening_socket,
    operator_addresses,
)
from lib import env
from tests.support.servers import free_port, run_daphne

OPERATOR, AGENTS = "127.0.0.1", "127.0.0.2"


@pytest.fixture
def two_listeners(transactional_db):
    from django.db import connection

    port = free_port()
    with run_daphne(
        connection.settings_dict,
        [f"tcp:port={port}:interface={OPERATOR}", f"tcp:port={port}:interface={AGENTS}"],
        operator_listen=f"{OPERATOR}:{port}",
    ):
        yield f"http://{OPERATOR}:{port}", f"http://{AGENTS}:{port}"


def test_the_agents_gateway_serves_the_agent_api_and_nothing_else(two_listeners):
    operator, agents = two_listeners
    for path in (
        "/accounts/login/",
        "/admin/",
        "/metrics",
        "/healthz",
        "/",
        "/agents/",
        "/api/v1/scale",
        "/api/v1/agents",
        "/api/v1/agents/some-agent",
        "/api/v1/agents/some-agent/job-complete",
    ):
        answer = requests.get(agents + path, timeout=10, allow_redirects=False)
        assert answer.status_code == 404, path
        assert answer.json()["reason"] == "not-found" and answer.json()["error"]["code"] == "not-found"
    # The agent API is reached (and refuses a missing token itself).
    assert requests.post(agents + "/api/v1/agents/register", json={}, timeout=10).status_code == 401
    # The operator listener serves the pages.
    assert requests.get(operator + "/accounts/login/", timeout=10).status_code == 200
    assert requests.get(operator + "/metrics", timeout=10).status_code == 200


def test_a_body_over_the_limit_is_refused_with_413_on_either_listener(two_listeners, settings):
    operator, agents = two_listeners
    body = b"x" * (settings.KICI_MAX_REQUEST_BODY_BYTES + 1)
    for base in (operator, agents):
        answer = requests.post(base + "/api/v1/agents/register", data=body, timeout=30)
        assert answer.status_code == 413
        assert answer.json()["reason"] == "body-too-large"


# --- the guard on its own (ASGI) -----------------------------------------------------------------


async def _asgi(guard, scope, messages):
    sent, queue = [], list(messages)

    async def receive():
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await guard(scope, receive, send)
    return sent


def _echo_app():
    async def app(scope, receive, send):
        if scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.accept"})
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # what Django does: no response for an aborted request
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    return app


def _guard():
    return ListenerGuard(_echo_app(), operator_listeners=[(OPERATOR, 8000)], max_body_bytes=1024)


def test_a_websocket_off_the_operator_listener_is_closed():
    scope = {"type": "websocket", "path": "/ws/events/", "server": (AGENTS, 8000), "headers": []}
    sent = asyncio.run(_asgi(_guard(), scope, [{"type": "websocket.connect"}]))
    assert sent == [{"type": "websocket.close", "code": 4404}]


def test_the_api_listener_serves_the_orchestrators_api_and_nothing_else_whatever_the_scope_says():
    guard = ListenerGuard(_echo_app(), operator_listeners=[(OPERATOR, 8000)], max_body_bytes=1024, listener="api")
    served = ["/api/v1/scale", "/api/v1/agents/a-1", "/api/v1/agents", "/api/v1/agents/a-1/release", "/healthz"]
    refused = ["/", "/agents/", "/metrics", "/static/css/kici.css", "/api/v1/agents/register", "/api/v1/agents/claim"]
    refused += ["/api/v1/agents/a-1/heartbeat", "/api/v1/agents/a-1/heartbeat/", "/apix", "/healthz/"]
    for path in served + refused:
        scope = {"type": "http", "path": path, "server": (OPERATOR, 8000), "headers": []}
        sent = asyncio.run(_asgi(guard, scope, [{"type": "http.request", "body": b""}]))
        assert sent[0]["status"] == (200 if path in served else 404), path
    scope = {"type": "websocket", "path": "/ws/events/", "server": (OPERATOR, 8000), "headers": []}
    sent = asyncio.run(_asgi(guard, scope, [{"type": "websocket.connect"}]))
    assert sent == [{"type": "websocket.close", "code": 4404}]
    with pytest.raises(ValueError, match=r"listener='pages' is not one of gateway, api"):
        ListenerGuard(_echo_app(), listener="pages")


def test_an_unknown_listener_port_on_the_operator_address_serves_only_the_agent_api():
    scope = {"type": "http", "path": "/admin/", "server": (OPERATOR, 9999), "headers": []}
    sent = asyncio.run(_asgi(_guard(), scope, [{"type": "http.request", "body": b""}]))
    assert sent[0]["status"] == 404


def test_a_streamed_body_that_grows_past_the_limit_is_cut_off_with_413():
    scope = {"type": "http", "path": "/api/v1/agents/register", "server": (AGENTS, 8000), "headers": []}
    chunks = [{"type": "http.request", "body": b"x" * 600, "more_body": True}] * 3
    sent = asyncio.run(_asgi(_guard(), scope, chunks))
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [413]


def test_a_body_within_the_limit_reaches_the_application_whole():
    scope = {"type": "http", "path": "/api/v1/agents/register", "server": (AGENTS, 8000), "headers": []}
    chunks = [
        {"type": "http.request", "body": b"x" * 600, "more_body": True},
        {"type": "http.request", "body": b"y" * 400},
    ]
    sent = asyncio.run(_asgi(_guard(), scope, chunks))
    assert sent[0]["status"] == 200 and sent[1]["body"] == b"x" * 600 + b"y" * 400


# --- configuration ---------------------------------------------------------------------------------


def test_make_run_listens_on_the_operator_listeners_and_the_agents_gateway(settings):
    settings.KICI_OPERATOR_LISTEN = [("127.0.0.1", 8000), ("::1", 8000)]
    settings.KICI_CONSOLE_URL = "http://172.30.0.1:8000"
    assert operator_addresses() == [("127.0.0.1", 8000), ("::1", 8000)]
    assert gateway_address() == ("172.30.0.1", 8000)
    settings.KICI_CONSOLE_URL = "http://127.0.0.1:8000"  # the gateway is an operator listener: no gateway
    assert gateway_address() is None


def test_several_processes_listen_on_one_address_and_daphne_adopts_the_sockets():
    first = listening_socket("127.0.0.1", 0, backlog=128)
    port = first.getsockname()[1]
    second = listening_socket("127.0.0.1", port, backlog=128)  # SO_REUSEPORT: a second server process
    try:
        assert first.get_inheritable() and second.get_inheritable()
        assert daphne_endpoints([first], [("::1", port)]) == [
            f"fd:fileno={first.fileno()}",
            f"tcp6:port={port}:interface=\\:\\:1",
        ]
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("raw", ["127.0.0.1", ":8000", "127.0.0.1:http", "127.0.0.1:0", "[::1]:70000", " , "])
def test_a_malformed_operator_listener_is_refused_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("KICI_OPERATOR_LISTEN", raw)
    with pytest.raises(ImproperlyConfigured, match="KICI_OPERATOR_LISTEN"):
        env.env_listeners("KICI_OPERATOR_LISTEN", "127.0.0.1:8000")


def test_listeners_parse_addresses_ports_and_any_port(monkeypatch):
    monkeypatch.setenv("KICI_OPERATOR_LISTEN", "127.0.0.1:8000, [::1]:8001,10.0.0.5:*")
    assert env.env_listeners("KICI_OPERATOR_LISTEN", "x") == [("127.0.0.1", 8000), ("::1", 8001), ("10.0.0.5", None)]
