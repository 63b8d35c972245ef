"""``python manage.py supervisor_config --workers N --servers N [--gateway HOST:PORT] [--api
HOST:PORT ...] --out FILE --log-dir DIR``: write the supervisord configuration ``make run`` runs
the console under (``operations.supervision``), each server process's database pool sized to the
database's ``max_connections``. ``--gateway``: the agents' gateway, where gateway processes listen
(``kici_site.listeners.gateway_address``, as ``scripts/run.sh`` gives it); none without it.
``--api`` (repeated): the orchestrator's API listeners, where API processes listen
(``kici_site.listeners.api_addresses``, checked and given by ``scripts/run.sh``); none without it."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from operations.supervision import db_pool_size, supervisord_config


class Command(BaseCommand):
    help = "Write the supervisord configuration of the console's processes (servers, rq workers, sweeper)."

    def add_arguments(self, parser):
        parser.add_argument("--workers", type=int, required=True, help="rq workers to run (KICI_WORKERS)")
        parser.add_argument(
            "--servers", type=int, default=1, help="daphne processes, and as many gateway and API ones (KICI_SERVERS)"
        )
        parser.add_argument("--gateway", default="", help="HOST:PORT ([v6]:PORT) of the agents' gateway")
        parser.add_argument(
            "--api", action="append", default=[], help="HOST:PORT ([v6]:PORT) of an orchestrator's API listener"
        )
        parser.add_argument("--out", type=Path, required=True, help="the file written (mode 0600)")
        parser.add_argument("--run-dir", type=Path, help="pid file and control socket (default: the file's directory)")
        parser.add_argument("--log-dir", type=Path, required=True, help="the processes' logs")

    def handle(
        self, *args, workers: int, servers: int, gateway: str, api: list[str], out: Path, log_dir: Path, **options
    ):
        run_dir: Path | None = options["run_dir"]
        try:
            gateway_at = _address("--gateway", gateway) if gateway else None
            api_at = [_address("--api", text) for text in api]
            if workers < 1:
                raise ValueError(f"workers={workers!r} is not a positive whole number")
            if servers < 1:
                raise ValueError(f"servers={servers!r} is not a positive whole number")
            with connection.cursor() as cur:
                cur.execute("SHOW max_connections")
                max_connections = int(cur.fetchone()[0])
            programs = 1 + (gateway_at is not None) + bool(api_at)
            pool = db_pool_size(max_connections, servers * programs, workers)
            text = supervisord_config(
                root=Path(settings.BASE_DIR),
                run_dir=(run_dir or out.parent).resolve(),
                log_dir=log_dir.resolve(),
                workers=workers,
                servers=servers,
                gateway=gateway_at,
                pool_size=pool,
                api=api_at,
            )
        except (ValueError, ImproperlyConfigured) as exc:
            raise CommandError(str(exc)) from None
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)


def _address(option: str, text: str) -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` / ``[v6]:PORT`` given to ``option``. ValueError naming
    the option and the value."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{option}={text!r} is not HOST:PORT with a port in 1-65535")
    return host.removeprefix("[").removesuffix("]"), int(port)
