"""``python manage.py supervisor_config --workers N --endpoint E [--endpoint E ...] --out FILE
--log-dir DIR``: write the supervisord
configuration ``make run`` runs the console under (``operations.supervision``)."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from operations.supervision import supervisord_config


class Command(BaseCommand):
    help = "Write the supervisord configuration of the console's processes (daphne, rq workers, sweeper)."

    def add_arguments(self, parser):
        parser.add_argument("--workers", type=int, required=True, help="rq workers to run (KICI_WORKERS)")
        parser.add_argument(
            "--endpoint",
            action="append",
            default=[],
            help="a daphne endpoint (kici_site.listeners.daphne_endpoints); repeat for each",
        )
        parser.add_argument("--out", type=Path, required=True, help="the file written (mode 0600)")
        parser.add_argument("--run-dir", type=Path, help="pid file and control socket (default: the file's directory)")
        parser.add_argument("--log-dir", type=Path, required=True, help="the processes' logs")

    def handle(
        self, *args, workers: int, endpoint: list[str], out: Path, run_dir: Path | None, log_dir: Path, **options
    ):
        try:
            text = supervisord_config(
                root=Path(settings.BASE_DIR),
                run_dir=(run_dir or out.parent).resolve(),
                log_dir=log_dir.resolve(),
                workers=workers,
                endpoints=endpoint,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
