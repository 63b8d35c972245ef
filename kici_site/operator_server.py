"""One operator server process: daphne (pages, WebSockets, the orchestrator's API) on every
operator listener (``KICI_OPERATOR_LISTEN``), ``python -m kici_site.operator_server
[--process-num N] [--access-log FILE]``. IPv4 listeners are shared with ``SO_REUSEPORT``; an IPv6
one is served by process 1 alone. Its connections are :class:`OperatorChannel`, which answers an
over-long head 414/431 where twisted would close silently, and whose requests are
:class:`OperatorRequest`, daphne's without twisted's form parsing (docs/serving.md). Raises
``SystemExit`` naming an address that cannot be bound.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, cast

import django
from daphne import http_protocol
from daphne import server as daphne_server
from daphne.cli import CommandLineInterface
from twisted.web.http import HTTPChannel, _GenericHTTPChannelProtocol

from kici_site.listeners import (
    MAX_REQUEST_HEAD_BYTES,
    MAX_REQUEST_LINE_BYTES,
    closing_answer,
    daphne_endpoints,
    listening_socket,
    operator_addresses,
)


class OperatorRequest(http_protocol.WebRequest):
    """daphne's request with twisted's form parsing off (twisted's own ``parsePOSTFormSubmission``):
    twisted would parse every POST's ``Content-Type`` with the ``email`` package and a form or
    multipart body into ``request.args``, which daphne never reads (Django parses the body
    itself), and would answer a multipart body it cannot parse 400 and close the connection
    before the application sees it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, parsePOSTFormSubmission=False, **kwargs)


class OperatorChannel(HTTPChannel):
    """twisted's HTTP/1.1 channel answering a request over the head limits instead of dropping it:
    a request line over ``MAX_REQUEST_LINE_BYTES`` is 414, a header line over that (twisted reads
    every head line with one limit, ``MAX_HEADER_LINE_BYTES`` being the same) or a head over
    ``MAX_REQUEST_HEAD_BYTES`` is 431; the answer closes the connection. Its requests are
    :class:`OperatorRequest`."""

    MAX_LENGTH = MAX_REQUEST_LINE_BYTES
    totalHeadersSize = MAX_REQUEST_HEAD_BYTES

    @property
    def requestFactory(self) -> type[OperatorRequest]:
        return OperatorRequest

    @requestFactory.setter
    def requestFactory(self, factory: type) -> None:
        # daphne's factory hands each connection its WebRequest; OperatorRequest is that request.
        if factory is not http_protocol.WebRequest:
            raise TypeError(f"an operator connection builds OperatorRequest (daphne's WebRequest), not {factory!r}")

    def lineLengthExceeded(self, line: bytes) -> None:
        # Nothing of this request's head counted yet: the line too long is its request line.
        if self._receivedHeaderSize == 0:
            self._refuse(414, "uri-too-long", f"request line over {MAX_REQUEST_LINE_BYTES} bytes")
        else:
            self._refuse(431, "headers-too-large", f"a header line over {MAX_REQUEST_LINE_BYTES} bytes")

    def lineReceived(self, line: bytes) -> None:
        if self._receivedHeaderSize + len(line) > self.totalHeadersSize:
            self._refuse(431, "headers-too-large", f"request head over {MAX_REQUEST_HEAD_BYTES} bytes")
            return
        super().lineReceived(line)

    def _refuse(self, status: int, reason: str, message: str) -> None:
        # The transport is twisted's TCP one (typed as a zope interface, whose methods mypy misreads).
        cast(Any, self.transport).write(closing_answer(status, reason, message))
        self.loseConnection()


def operator_channel_protocol(factory: http_protocol.HTTPFactory) -> _GenericHTTPChannelProtocol:
    """What daphne's HTTP factory builds for each connection: twisted's protocol wrapper (which
    also negotiates HTTP/2 where enabled) around an :class:`OperatorChannel`."""
    return _GenericHTTPChannelProtocol(OperatorChannel())


class OperatorHTTPFactory(http_protocol.HTTPFactory):
    """daphne's HTTP factory for this process: its connections are :class:`OperatorChannel`
    (:func:`operator_channel_protocol`), whose requests are :class:`OperatorRequest`, and twisted's
    own access line is not written."""

    protocol = operator_channel_protocol

    def log(self, request) -> None:
        """Nothing. twisted formats a combined-log line for every finished request and writes it to
        its legacy log, which daphne at the verbosity this process runs (its default) sends
        nowhere; daphne's access log (``--access-log``) is written by daphne itself and stays."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kici_site.operator_server")
    parser.add_argument("--process-num", type=int, default=1, help="1 also serves the IPv6 operator listeners")
    parser.add_argument("--access-log", help="daphne's access log (default: none)")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kici_site.settings")

    django.setup()
    sockets, ipv6 = [], []
    for host, port in operator_addresses():
        if ":" in host:
            ipv6 += [(host, port)] if args.process_num == 1 else []
            continue
        try:
            sockets.append(listening_socket(host, port))
        except OSError as exc:
            raise SystemExit(f"cannot listen on {host}:{port}: {exc}") from None
    command = []
    for endpoint in daphne_endpoints(sockets, ipv6):
        command += ["-e", endpoint]
    if args.access_log:
        command += ["--access-log", args.access_log]
    # daphne's server builds its HTTP factory by this name: this process's answers a request over
    # the head limits (OperatorChannel) instead of dropping it, leaves its body to Django to parse
    # (OperatorRequest), and writes no line nobody reads.
    daphne_server.HTTPFactory = OperatorHTTPFactory
    CommandLineInterface().run([*command, "kici_site.asgi:application"])


if __name__ == "__main__":
    main()
