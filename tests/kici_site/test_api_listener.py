"""The orchestrator's API on a listener of its own (``KICI_API_LISTEN``): uvicorn processes
(``python -m kici_site.gateway --api``, as make run starts them) with the suite's PostgreSQL answer
the agent GET and ``/scale`` as the operator's daphne answers them, refuse the pages, the agent
routes and WebSockets, and keep the gateway's bounds while reading; make run's supervisor runs
them when ``KICI_API_LISTEN`` names an address, and not otherwise."""

from __future__ import annotations

import configparser
import json
import socket
import time
from http.client import HTTPConnection

import pytest
from django.core.management import call_command

from agents.choices import AgentState
from tests.support.scalers import make_agent, make_scaler
from tests.support.servers import daphne_server, free_port, run_gateway

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "api-listener-env-token"


@pytest.fixture
def servers(settings):
    """The operator's daphne and one API process on their own loopback ports, both with
    ``KICI_API_TOKEN``; yields (operator port, API port)."""
    from django.db import connection

    db = connection.settings_dict
    settings.KICI_API_TOKEN = TOKEN
    api = free_port()
    with daphne_server(db, TOKEN) as operator_url:
        operator = int(operator_url.rsplit(":", 1)[1])
        env = {"KICI_API_TOKEN": TOKEN, "KICI_API_LISTEN": f"127.0.0.1:{api}", "KICI_MAX_REQUEST_BODY_BYTES": "4096"}
        env |= {"KICI_GATEWAY_HEADER_TIMEOUT_SECONDS": "2"}
        with run_gateway(db, f"127.0.0.1:{api}", operator_listen=f"127.0.0.1:{operator}", extra_env=env, api=True):
            yield operator, api


def _call(port: int, method: str, path: str, body: dict | None = None, token: str = TOKEN):
    """(status, content type, body) of one request to the server on ``port``."""
    conn = HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Authorization": f"Bearer {token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type"), response.read()
    finally:
        conn.close()


def test_the_agent_get_and_scale_are_answered_as_on_the_operator_listener(servers):
    operator, api = servers
    scaler = make_scaler(labels=("linux", "apil"), max_agents=1)
    agent = make_agent(scaler, AgentState.RUNNING, labels=["linux", "apil"], bound_job_id="job-1", active_jobs=1)
    for method, path, body in [
        ("GET", f"/api/v1/agents/{agent.agent_id}", None),
        ("GET", "/api/v1/agents/no-such-agent", None),
        ("GET", "/api/v1/agents", None),
        # At capacity: the one agent the scaler may have is running.
        ("POST", "/api/v1/scale", {"labels": ["linux", "apil"], "jobId": "job-2"}),
        ("POST", "/api/v1/scale", {"labels": ["nothing-has-these"], "jobId": "job-3"}),
        ("POST", "/api/v1/scale", {"labels": "not a list"}),
    ]:
        on_operator = _call(operator, method, path, body)
        on_api = _call(api, method, path, body)
        assert on_api[:2] == on_operator[:2], (path, body, on_api, on_operator)
        assert json.loads(on_api[2]) == json.loads(on_operator[2]), (path, body)
    assert _call(api, "GET", f"/api/v1/agents/{agent.agent_id}")[0] == 200
    assert _call(api, "POST", "/api/v1/scale", {"labels": ["linux", "apil"], "jobId": "job-2"})[0] == 409
    assert _call(api, "GET", f"/api/v1/agents/{agent.agent_id}", token="wrong")[0] == 401


def test_pages_agent_routes_and_websockets_are_refused(servers):
    _, api = servers
    agent = make_agent(make_scaler(), AgentState.RUNNING)
    refused = [
        ("GET", "/"),
        ("GET", "/agents/"),
        ("GET", "/login/"),
        ("GET", "/metrics"),
        ("POST", "/api/v1/agents/register"),
        ("POST", "/api/v1/agents/claim"),
        ("POST", f"/api/v1/agents/{agent.agent_id}/heartbeat"),
        ("POST", f"/api/v1/agents/{agent.agent_id}/heartbeat/"),
    ]
    for method, path in refused:
        status, kind, body = _call(api, method, path, {} if method == "POST" else None)
        assert (status, kind) == (404, "application/json"), (path, status, body)
        assert json.loads(body)["error"]["message"] == "only the orchestrator's API is served on this address"
    assert _call(api, "GET", "/healthz")[0] in (200, 503)
    # A WebSocket handshake to the live events is not upgraded: the guard answers it as HTTP, 404.
    with socket.create_connection(("127.0.0.1", api), timeout=10) as sock:
        sock.sendall(
            b"GET /ws/events/ HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            b"Origin: http://127.0.0.1\r\n\r\n"
        )
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 404"), answer[:200]


def test_the_gateways_bounds_hold_there(servers):
    _, api = servers
    # A declared body over the limit (4096 here): 413 before any of it is read, connection closed.
    with socket.create_connection(("127.0.0.1", api), timeout=10) as sock:
        sock.sendall(
            b"POST /api/v1/scale HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
        )
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert sock.recv(65536) == b""
    # Headers that never complete: 408 at the header deadline (2 s here).
    with socket.create_connection(("127.0.0.1", api), timeout=10) as sock:
        sock.sendall(b"GET /api/v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        start = time.monotonic()
        answer = sock.recv(65536)
        took = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 408") and 1.5 < took < 5, (took, answer[:200])


def test_twenty_connections_from_one_address_are_all_served(servers):
    # The orchestrator is one address with many connections: no per-source cap there (the
    # gateway's is 16).
    _, api = servers
    conns = [socket.create_connection(("127.0.0.1", api), timeout=10) for _ in range(20)]
    try:
        for sock in conns:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        for sock in conns:
            assert sock.recv(65536).startswith(b"HTTP/1.1 "), "a connection was reset"
    finally:
        for sock in conns:
            sock.close()


def _config(tmp_path, *api: str) -> configparser.RawConfigParser:
    out = tmp_path / "s.conf"
    options = [arg for address in api for arg in ("--api", address)]
    call_command(
        "supervisor_config", "--workers", "1", "--servers", "2", *options, "--out", str(out), "--log-dir", str(tmp_path)
    )
    config = configparser.RawConfigParser()
    config.read_string(out.read_text())
    return config


def test_make_runs_supervisor_runs_the_api_processes_on_its_addresses(settings, tmp_path):
    program = _config(tmp_path, "127.0.0.1:8001", "[::1]:8001")["program:api"]
    assert program["command"].endswith("-m kici_site.gateway --api --listen 127.0.0.1:8001 --listen [::1]:8001")
    assert program["numprocs"] == "2" and program["process_name"] == "api-%(process_num)d"
    assert program["environment"].startswith("KICI_DB_POOL_SIZE=")
    assert "program:api" not in _config(tmp_path)


def test_an_api_address_without_a_port_is_refused_naming_the_option(tmp_path):
    from django.core.management import CommandError

    with pytest.raises(CommandError, match=r"--api='127.0.0.1' is not HOST:PORT"):
        _config(tmp_path, "127.0.0.1")


def test_an_api_listener_on_an_operator_listener_or_the_gateway_is_refused(settings):
    from django.core.exceptions import ImproperlyConfigured

    from kici_site.listeners import api_addresses

    settings.KICI_OPERATOR_LISTEN = [("127.0.0.1", 8000)]
    settings.KICI_API_LISTEN = [("127.0.0.1", 8000)]
    with pytest.raises(ImproperlyConfigured, match=r"KICI_API_LISTEN: 127.0.0.1:8000 is also in KICI_OPERATOR_LISTEN"):
        api_addresses()
    settings.KICI_CONSOLE_URL = "http://172.30.0.1:8000"
    settings.KICI_API_LISTEN = [("172.30.0.1", 8000)]
    with pytest.raises(ImproperlyConfigured, match=r"KICI_API_LISTEN: 172.30.0.1:8000 is also in KICI_CONSOLE_URL"):
        api_addresses()
    settings.KICI_API_LISTEN = [("127.0.0.1", None)]
    with pytest.raises(ImproperlyConfigured, match=r"KICI_API_LISTEN: 127.0.0.1:\* cannot be listened on"):
        api_addresses()
    settings.KICI_API_LISTEN = [("127.0.0.1", 8001), ("::1", 8001)]
    assert api_addresses() == [("127.0.0.1", 8001), ("::1", 8001)]


def test_a_host_access_that_opens_the_api_listener_is_warned_about(settings):
    from scalers.backends.isolation import console_services

    settings.KICI_API_LISTEN = [("192.168.1.10", 8001)]
    named = [(s.name, s.host, s.port) for s in console_services(None)]
    assert ("orchestrator's API listener (KICI_API_LISTEN)", "192.168.1.10", 8001) in named
