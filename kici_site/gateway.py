"""The machine-facing servers: uvicorn processes serving one listener's part alone, apart from the
operator's daphne. ``python -m kici_site.gateway --listen HOST:PORT`` is the agents' gateway, the
agent API on the address agents dial (``KICI_CONSOLE_URL``), so that a flood of agents reaches
neither the pages nor the orchestrator; with ``--api`` (``--listen`` once per ``KICI_API_LISTEN``
address) the orchestrator's API, so that neither the pages nor the agents slow it. Both keep the
same bounds while reading (:class:`GatewayProtocol`); the processes of one listener share its
addresses with ``SO_REUSEPORT`` (docs/serving.md).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os

import uvicorn
from django.conf import settings
from django.utils.module_loading import import_string
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kici_site.listeners import (
    MAX_HEADER_LINE_BYTES,
    MAX_REQUEST_HEAD_BYTES,
    MAX_REQUEST_LINE_BYTES,
    closing_answer,
    listening_socket,
)


class GatewayProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with the bounds a connection from a sandbox must keep, enforced
    while reading: header and body deadlines (408), the body limit (413), the head limits (414,
    431), and ``per_source`` connections per source address; each answered and closed as it is
    passed (the bounds and why: docs/serving.md, "The processes"). The class attributes are set
    from settings by :func:`protocol_class`; ``per_source`` None: no cap."""

    header_timeout = 10.0
    body_timeout = 30.0
    max_body = 1024 * 1024
    per_source: int | None = 16
    #: Open connections of this process by source address.
    open_by_source: collections.Counter = collections.Counter()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._source = (transport.get_extra_info("peername") or ("",))[0]
        self._deadline: asyncio.TimerHandle | None = None
        self._started = False  # a byte of a request has arrived
        self._body_read = 0
        self._url_read = 0
        self._head_read = 0  # bytes of data that ended inside the current request's head
        self._headers_read = 0  # bytes of the current request's complete header lines
        self._in_head = False
        self.open_by_source[self._source] += 1
        self._refused = self.per_source is not None and self.open_by_source[self._source] > self.per_source
        if self._refused:
            self.transport = transport
            transport.abort()
            return
        super().connection_made(transport)
        self._arm(self.header_timeout, "no complete request headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.open_by_source[self._source] -= 1
        if self.open_by_source[self._source] <= 0:
            del self.open_by_source[self._source]
        if not self._refused:
            super().connection_lost(exc)

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expire, seconds, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self, seconds: float, what: str) -> None:
        self._deadline = None
        if not self._started:
            self.transport.close()
            return
        self._cut(408, "request-timeout", f"{what} within {seconds:g} s")

    def _cut(self, status: int, reason: str, message: str) -> None:
        """Answer ``status`` in place of the current request's response unless that has begun, and
        close the connection. The application's task, if one runs, sees a disconnect."""
        if self.transport.is_closing():
            return
        cycle = self.cycle
        current = cycle is not None and cycle.scope is self.scope
        if not current or not cycle.response_started:
            if current:
                cycle.response_started = cycle.response_complete = True  # drop the app's answer
            self.transport.write(closing_answer(status, reason, message))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        in_head_before = self._in_head or not self._started
        super().data_received(data)
        if self.transport.is_closing() or not self._in_head:
            return
        # The request's head has not ended in this data: all of it (from the head's start) is head.
        # This bounds what the parser holds of a header line not complete yet.
        self._head_read += len(data) if in_head_before else 0
        if self._head_read > MAX_REQUEST_HEAD_BYTES:
            self._cut(431, "headers-too-large", f"request head over {MAX_REQUEST_HEAD_BYTES} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._body_read = 0
        self._url_read = 0
        self._head_read = 0
        self._headers_read = 0
        self._in_head = True
        self._started = True
        if self._deadline is None:  # a kept-alive connection's next request
            self._arm(self.header_timeout, "no complete request headers")

    def on_url(self, url: bytes) -> None:
        if self.transport.is_closing():
            return
        self._url_read += len(url)
        if self._url_read > MAX_REQUEST_LINE_BYTES:
            self._cut(414, "uri-too-long", f"request target over {MAX_REQUEST_LINE_BYTES} bytes")
            return
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.transport.is_closing():
            return
        line = len(name) + len(value) + 4  # "name: value\r\n"
        self._headers_read += line
        if line > MAX_HEADER_LINE_BYTES:
            self._cut(431, "headers-too-large", f"a header line over {MAX_HEADER_LINE_BYTES} bytes")
            return
        if self._url_read + self._headers_read > MAX_REQUEST_HEAD_BYTES:
            self._cut(431, "headers-too-large", f"request head over {MAX_REQUEST_HEAD_BYTES} bytes")
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self.transport.is_closing():
            return
        length = next((v for k, v in self.headers if k == b"content-length"), None)
        if length is not None and length.strip().isdigit() and int(length) > self.max_body:
            self._cut(413, "body-too-large", f"request body over {self.max_body} bytes")
            return
        super().on_headers_complete()
        chunked = any(k == b"transfer-encoding" for k, _ in self.headers)
        if chunked or (length is not None and length.strip() not in (b"", b"0")):
            self._arm(self.body_timeout, "no complete request body")
        else:
            self._disarm()

    def on_body(self, body: bytes) -> None:
        if self.transport.is_closing():
            return
        self._body_read += len(body)
        if self._body_read > self.max_body:
            self._cut(413, "body-too-large", f"request body over {self.max_body} bytes")
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self.transport.is_closing():
            return
        self._disarm()
        super().on_message_complete()


def protocol_class(*, per_source_cap: bool = True) -> type[GatewayProtocol]:
    """:class:`GatewayProtocol` with this console's bounds (``KICI_GATEWAY_HEADER_TIMEOUT_SECONDS``,
    ``KICI_GATEWAY_BODY_TIMEOUT_SECONDS``, ``KICI_MAX_REQUEST_BODY_BYTES``, and with
    ``per_source_cap`` ``KICI_GATEWAY_CONNECTIONS_PER_SOURCE``; without it no cap, for the
    orchestrator, one address with many connections)."""
    return type(
        "GatewayProtocol",
        (GatewayProtocol,),
        {
            "header_timeout": float(settings.KICI_GATEWAY_HEADER_TIMEOUT_SECONDS),
            "body_timeout": float(settings.KICI_GATEWAY_BODY_TIMEOUT_SECONDS),
            "max_body": settings.KICI_MAX_REQUEST_BODY_BYTES,
            "per_source": settings.KICI_GATEWAY_CONNECTIONS_PER_SOURCE if per_source_cap else None,
        },
    )


def _address(parser: argparse.ArgumentParser, listen: str) -> tuple[str, int]:
    """``(host, port)`` of ``--listen`` ``HOST:PORT`` / ``[v6]:PORT``; a usage error otherwise."""
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        parser.error(f"--listen={listen!r} is not HOST:PORT with a port in 1-65535")
    return host.removeprefix("[").removesuffix("]"), int(port)


def main(argv: list[str] | None = None) -> None:
    """Serve the gateway application, or with ``--api`` the orchestrator's API, on every
    ``--listen`` address until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m kici_site.gateway")
    parser.add_argument(
        "--listen", required=True, action="append", help="HOST:PORT ([v6]:PORT) to listen on; repeatable"
    )
    parser.add_argument("--api", action="store_true", help="serve the orchestrator's API, not the agents'")
    args = parser.parse_args(argv)
    addresses = [_address(parser, listen) for listen in args.listen]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kici_site.settings")
    # Importing the application sets Django up.
    application = import_string("kici_site.asgi.api_application" if args.api else "kici_site.asgi.gateway_application")
    sockets = [listening_socket(host, port) for host, port in addresses]
    config = uvicorn.Config(
        application,
        http=protocol_class(per_source_cap=not args.api),
        loop="uvloop",
        ws="none",
        lifespan="off",
        # Agents heartbeat every few seconds and the orchestrator asks as often: the console's
        # events and records tell more than a line per request.
        access_log=False,
        server_header=False,
        timeout_keep_alive=75,  # keep the connections of agents and the orchestrator between calls
        log_level="warning",
        backlog=settings.KICI_LISTEN_BACKLOG,  # uvicorn listens again on the socket with this
    )
    uvicorn.Server(config).run(sockets=sockets)


if __name__ == "__main__":
    main()
