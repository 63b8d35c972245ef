"""Logging filters (wired in ``settings.LOGGING``)."""

from __future__ import annotations

import logging


class OneLineClientErrors(logging.Filter):
    """Drop the traceback from ``django.request`` / ``django.security`` records of 4xx answers.

    Django logs an ordinary 403 (``PermissionDenied``) or 400 with the exception attached, so each
    refused click filled the log with a full traceback; a client error is one warning line
    (``Forbidden (Permission denied): /operations/plan/``). 5xx records keep their traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if record.exc_info and isinstance(status, int) and 400 <= status < 500:
            exc = record.exc_info[1]
            if exc is not None and str(exc) and str(exc) not in record.getMessage():
                record.msg = f"{record.msg} ({type(exc).__name__}: %s)"
                record.args = (*(record.args or ()), str(exc))
            record.exc_info = None
            record.exc_text = None
        return True
