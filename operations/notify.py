"""Approval notices: tell people an operation is waiting for them. With ``settings.KICI_NOTIFY_URL``
set, every operation stored as planned that no policy approves by itself is POSTed there once, by
an rq job after the plan commits, signed and retried as the event backend's deliveries
(``scalers.backends.emitter``). A failed delivery is logged and counted; it never blocks or undoes
the plan. The request and its payload: docs/attention.md ("Approval notices (webhook)").
"""

from __future__ import annotations

import logging

import django_rq
from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from scalers.backends.emitter import EventEmitError, HttpEventEmitter
from scalers.metrics import SharedSeries, add_to_counters, counter_increment

from .choices import OperationStatus
from .models import Operation

log = logging.getLogger(__name__)

APPROVAL_NEEDED = "kici.operation.approval-needed"
#: MetricCounter of the deliveries (``result``: ``sent``, ``failed``, ``skipped``); registered on
#: ``/metrics`` by ``operations.apps``.
NOTICES = "kici_scaler_notices_total"
NOTICES_SERIES = SharedSeries(
    NOTICES,
    "Approval notices to KICI_NOTIFY_URL, by event and result (sent, failed, skipped).",
    ("event", "result"),
    zeros=lambda known: ({"event": APPROVAL_NEEDED, "result": r} for r in ("failed", "sent", "skipped")),
)


def notify_enabled() -> bool:
    return bool(settings.KICI_NOTIFY_URL)


def schedule_approval_notice(operation: Operation) -> None:
    """Have an rq job send the approval notice of ``operation`` once the current transaction
    commits (at once outside one). Does nothing when notices are off."""
    if not notify_enabled():
        return
    pk = operation.pk
    transaction.on_commit(lambda: django_rq.get_queue("default").enqueue(send_approval_notice, pk, job_timeout=120))


def approval_payload(operation: Operation) -> dict:
    """What a notice says about ``operation`` (JSON-ready)."""
    return {
        "operationId": operation.pk,
        "kind": operation.kind,
        "title": operation.get_kind_display(),
        "scaler": operation.scaler_name or None,
        "targets": len(operation.plan or []),
        "requestedBy": operation.requested_by.get_username() if operation.requested_by is not None else None,
        "requestedVia": operation.requested_via,
        "createdAt": operation.created_at.isoformat(),
        "expiresAt": operation.expires_at.isoformat(),
        "url": settings.KICI_OPERATOR_URL.rstrip("/") + reverse("operations:detail", args=[operation.pk]),
    }


def send_approval_notice(operation_id: int, emitter: HttpEventEmitter | None = None) -> str:
    """The rq job: POST the notice of operation ``operation_id`` if it still waits for a person.
    Returns ``sent``, ``skipped`` (decided, expired, gone, or notices off) or ``failed``."""
    operation = Operation.objects.select_related("requested_by").filter(pk=operation_id).first()
    if (
        not notify_enabled()
        or operation is None
        or operation.status != OperationStatus.PLANNED
        or operation.expires_at <= timezone.now()
    ):
        result = "skipped"
    else:
        emitter = emitter or HttpEventEmitter(secret=settings.KICI_NOTIFY_SECRET)
        try:
            emitter.emit(APPROVAL_NEEDED, approval_payload(operation), [settings.KICI_NOTIFY_URL])
            result = "sent"
        except EventEmitError as exc:
            log.warning("approval notice of operation #%s not delivered: %s", operation_id, exc)
            result = "failed"
    add_to_counters(counter_increment(NOTICES, {"event": APPROVAL_NEEDED, "result": result}))
    return result
