"""``python manage.py import_scalers PATH [--dir DIR] [--check]``.

Validates ``scalers.yaml`` (plus drop-ins) and, unless ``--check``, applies it to the
database in one transaction (``scalers.importing.apply_scalers_config``). On invalid
input it prints one line per problem, ``FILE:LINE: dotted.path: message``, to stderr,
changes nothing and exits 1. Settings accepted but without effect (``scalers.config.warnings``)
are printed as ``warning: dotted.path: message`` lines after the result.
"""

from __future__ import annotations

import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from scalers.config.loader import ConfigInvalid, load_scalers_config
from scalers.config.warnings import config_warnings
from scalers.importing import apply_scalers_config


class Command(BaseCommand):
    help = (
        "Validate a scalers.yaml (and optional drop-in directory) and apply it to the database in one "
        "transaction. --check validates only. Problems are printed as FILE:LINE: path: message."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "path",
            nargs="?",
            help="the scalers.yaml to import (default: KICI_SCALER_CONFIG_PATH)",
        )
        parser.add_argument(
            "--dir",
            dest="drop_in_dir",
            help="drop-in directory: its *.yaml/*.yml scalers arrays are appended, in lexicographic order",
        )
        parser.add_argument("--check", action="store_true", help="validate only; change nothing")

    def handle(self, *args, **options):
        path = options["path"] or getattr(settings, "KICI_SCALER_CONFIG_PATH", None)
        if not path:
            raise CommandError("no config path given and KICI_SCALER_CONFIG_PATH is not set")
        drop_in_dir = options["drop_in_dir"]
        try:
            config = load_scalers_config(path, drop_in_dir)
            if options["check"]:
                label_sets = sum(len(s.label_sets) for s in config.scalers)
                self.stdout.write(f"OK: {len(config.scalers)} scalers, {label_sets} label sets")
                for path, warning in config_warnings(config):
                    self.stdout.write(f"warning: {path}: {warning.message}")
                return
            summary = apply_scalers_config(config, path)
        except ConfigInvalid as exc:
            for problem in exc.problems:
                self.stderr.write(str(problem))
            sys.exit(1)
        self.stdout.write(str(summary))
