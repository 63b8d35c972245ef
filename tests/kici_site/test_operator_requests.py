"""What the operator server (``python -m kici_site.operator_server``, as make run starts it) hands
the application: every POST body as sent, parsed by Django alone (twisted's form parsing is off),
and a refused ``/scale`` answered and recorded as admission decides it."""

from __future__ import annotations

import re
import socket

import pytest
import requests
from django.contrib.auth import get_user_model

from agents.models import Agent
from scalers.metrics import ORCH_REFUSALS, REFUSALS
from scalers.models import MetricCounter, Reservation, ScaleRequest
from tests.support.scalers import make_agent, make_scaler
from tests.support.servers import free_port, operator_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("stop_admission_queue")]

TOKEN = "test-operator-requests-token"


@pytest.fixture
def server():
    """The operator server on a free loopback port, serving this test's database with the API
    token :data:`TOKEN`; yields its port."""
    from django.db import connection

    port = free_port()
    with operator_server(connection.settings_dict, port, {"KICI_API_TOKEN": TOKEN}):
        yield port


def _exchange(port: int, *requests_: bytes) -> list[bytes]:
    """The answers to ``requests_`` sent one after another on one kept-alive connection (each read
    whole by its Content-Length, or to the connection's end without one); an answer missing because
    the server closed is b""."""
    answers = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        reader = sock.makefile("rb")
        for raw in requests_:
            sock.sendall(raw)
            head = b""
            while (line := reader.readline()) not in (b"\r\n", b""):
                head += line
            if not head:
                answers.append(b"")
                break
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            answers.append(head + b"\r\n" + (reader.read(int(length[1])) if length else reader.read()))
    return answers


def _post(path: str, content_type: str, body: bytes, *, token: str = TOKEN) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def test_a_multipart_body_twisted_cannot_parse_reaches_the_api_and_the_connection_stays_open(server):
    """twisted parsing forms would answer this 400 itself and close the connection; the API says
    what it takes, and the next request on the connection is served."""
    refused, health = _exchange(
        server, _post("/api/v1/scale", "multipart/form-data; boundary=x", b'{"labels": ["linux"]}'), HEALTHZ
    )
    assert refused.startswith(b"HTTP/1.1 415 "), refused[:300]
    assert b'"reason": "unsupported-media-type"' in refused and b"multipart/form-data" in refused
    assert health.startswith(b"HTTP/1.1 "), "the connection was closed after the first answer"
    assert not Agent.objects.exists()


@pytest.mark.parametrize("encoding", ["form", "multipart"])
def test_a_form_posted_to_a_page_is_parsed_by_django(server, encoding):
    """The sign-in form, form-encoded as a browser sends it and as multipart: Django reads both and
    signs the operator in (a form it could not read is shown again, 200)."""
    from django.conf import settings

    get_user_model().objects.create_user("operator", password="a long pass phrase")
    session = requests.Session()
    page = session.get(f"http://127.0.0.1:{server}/accounts/login/", timeout=10)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)[1]
    fields = {"username": "operator", "password": "a long pass phrase", "csrfmiddlewaretoken": token}
    if encoding == "form":
        answer = session.post(page.url, data=fields, allow_redirects=False, timeout=10)
    else:
        answer = session.post(
            page.url, files={name: (None, value) for name, value in fields.items()}, allow_redirects=False, timeout=10
        )
    assert answer.status_code == 302 and answer.headers["Location"] == "/", answer.text[:500]
    assert settings.SESSION_COOKIE_NAME in answer.cookies


def test_refused_scales_on_one_connection_are_answered_and_recorded_each(server):
    """Five asks for one job at capacity on a kept-alive connection: five 409s naming the cap, one
    request record that counts five attempts, and each refusal counted; nothing admitted."""
    scaler = make_scaler("full", max_agents=1)
    make_agent(scaler, state="running")
    body = b'{"labels": ["linux"], "jobId": "j-refused"}'
    answers = _exchange(server, *[_post("/api/v1/scale", "application/json", body)] * 5)
    expected = (
        b'{"error": {"code": "at-capacity", "message": "maxAgents reached on scaler full"}, "reason": "at-capacity", '
        b'"cap": "maxAgents", "scaler": "full", "retryAfterSeconds": 10}'
    )
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 409 "), answer[:300]
        assert answer.endswith(b"\r\n\r\n" + expected), answer
        assert b"\r\nRetry-After: 10\r\n" in answer
    record = ScaleRequest.objects.get(job_id="j-refused")
    assert (record.outcome, record.cap, record.scaler_name, record.attempts) == ("at-capacity", "maxAgents", "full", 5)
    assert record.token_name
    refusals = MetricCounter.objects.get(name=REFUSALS, labels={"scaler": "full", "cap": "maxAgents"})
    assert refusals.value == 5
    assert MetricCounter.objects.get(name=ORCH_REFUSALS).value == 5
    assert Agent.objects.count() == 1 and Reservation.objects.count() == 1


def test_a_websocket_handshake_is_still_upgraded(server):
    """The requests are daphne's still: a WebSocket handshake from the console's own origin is
    switched to the WebSocket protocol (the attention badge's route, which then closes for an
    anonymous client)."""
    handshake = (
        f"GET /ws/attention/ HTTP/1.1\r\nHost: 127.0.0.1:{server}\r\nOrigin: http://127.0.0.1:{server}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server), timeout=10) as sock:
        sock.sendall(handshake)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 101 "), answer[:300]
    assert b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in answer, "the accept key of the handshake"
