"""One operator server process: daphne (pages, WebSockets, the orchestrator's API) on every
operator listener (``KICI_OPERATOR_LISTEN``).

    python -m kici_site.operator_server [--process-num N] [--access-log FILE]

binds each IPv4 listener with ``SO_REUSEPORT`` (:func:`kici_site.listeners.listening_socket`), so
that several such processes serve one address, then becomes daphne adopting those sockets. An IPv6
listener is served by process 1 alone (daphne cannot adopt an IPv6 socket). Raises
``SystemExit`` naming the address that cannot be bound.
"""

from __future__ import annotations

import argparse
import os
import sys

import django

from kici_site.listeners import daphne_endpoints, listening_socket, operator_addresses


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
    command = [sys.executable, "-m", "daphne"]
    for endpoint in daphne_endpoints(sockets, ipv6):
        command += ["-e", endpoint]
    if args.access_log:
        command += ["--access-log", args.access_log]
    os.execv(sys.executable, [*command, "kici_site.asgi:application"])


if __name__ == "__main__":
    main()
