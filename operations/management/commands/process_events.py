"""``python manage.py process_events``: supervisord's event listener under ``make run``
(``operations.supervision``). Each unexpected exit of a console process, its retries and a
give-up become a console event and a count in ``kici_scaler_process_restarts_total``.

Its stdin and stdout are supervisord's event protocol: nothing else may write to stdout (the log
goes to stderr, ``var/log/process_events.log``). An event that cannot be stored (database down)
is logged and acknowledged all the same, so supervisord never holds the others back for it.
"""

from __future__ import annotations

import logging
import sys

from django.core.management.base import BaseCommand
from django.db import close_old_connections
from supervisor import childutils

from agents.events import flush_events
from operations.supervision import record_process_state

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "supervisord event listener: record console processes that exited (make run)."

    def handle(self, *args, **options):
        protocol_out = sys.stdout
        sys.stdout = sys.stderr  # a stray print must not break the protocol
        while True:
            headers, payload = childutils.listener.wait(sys.stdin, protocol_out)
            try:
                close_old_connections()
                fields = childutils.get_headers(payload.split("\n", 1)[0])
                log.warning("%s: %s", headers["eventname"], fields)
                record_process_state(headers["eventname"], fields)
                flush_events()
            except Exception:
                log.exception("could not record %s", headers.get("eventname"))
            childutils.listener.ok(protocol_out)
