"""A request line or header block over a server's limit gets an answer saying so, on both servers
as make run starts them: daphne on the operator's address, the uvicorn gateway on the agents'."""

from __future__ import annotations

import select
import socket

import pytest

from kici_site.listeners import MAX_REQUEST_LINE_BYTES
from tests.support.servers import free_port, operator_server, run_gateway

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def db():
    from django.db import connection

    return connection.settings_dict


def _answer(port: int, head: bytes) -> bytes:
    """What the server at ``port`` on loopback answers ``head`` with, until it closes (10 s at most)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return got


def _long_url(size: int) -> bytes:
    return f"GET /healthz?q={'a' * size} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()


def _many_headers(count: int, size: int) -> bytes:
    headers = "".join(f"X-Long-{n}: {'a' * size}\r\n" for n in range(count))
    return f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Connection: close\r\n\r\n".encode()


def _long_header(size: int) -> bytes:
    return f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: {'a' * size}\r\nConnection: close\r\n\r\n".encode()


#: (request, status line) over each limit of kici_site.listeners, and just under them.
CASES = [
    (_long_url(100), b"HTTP/1.1 "),
    (_long_url(18 * 1024), b"HTTP/1.1 414 URI Too Long\r\n"),
    (_long_url(MAX_REQUEST_LINE_BYTES + 1), b"HTTP/1.1 414 URI Too Long\r\n"),
    (_long_header(18 * 1024), b"HTTP/1.1 431 Request Header Fields Too Large\r\n"),
    (_many_headers(8, 12 * 1024), b"HTTP/1.1 431 Request Header Fields Too Large\r\n"),
    (_many_headers(4, 12 * 1024), b"HTTP/1.1 "),
]


def _check(port: int) -> None:
    for head, status in CASES:
        answer = _answer(port, head)
        assert answer.startswith(status), (len(head), answer[:200])
        if status == b"HTTP/1.1 ":  # under the limits: served
            assert answer.split()[1] in (b"200", b"404", b"503"), (len(head), answer[:200])
        else:
            assert b'"reason": "' in answer and b"connection: close" in answer.lower(), answer
    assert _trickled_header(port).startswith(b"HTTP/1.1 431 "), "a never-ending header line"


def _trickled_header(port: int) -> bytes:
    """What the server answers a header line that grows 8 KiB at a time and never ends (sending
    stops as soon as an answer is there to read)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: ")
        for _ in range(32):  # 256 KiB at most
            if select.select([sock], [], [], 0.05)[0]:
                break
            sock.sendall(b"a" * 8192)
        select.select([sock], [], [], 5)
        return sock.recv(65536)


def test_the_operator_server_answers_a_long_url_414_and_long_headers_431(db):
    port = free_port()
    with operator_server(db, port):
        _check(port)


def test_the_gateway_answers_a_long_url_414_and_long_headers_431(db):
    port = free_port()
    with run_gateway(db, f"127.0.0.1:{port}", operator_listen=f"127.0.0.1:{free_port()}"):
        _check(port)
