"""Which operations ``/operations/`` shows: its filters, shared by the page and its live rows."""

from __future__ import annotations

from .choices import OperationKind, OperationStatus
from .models import Operation

#: Rows per page of ``/operations/``.
PAGE_SIZE = 50


def filter_operations(params) -> tuple:
    """Apply the filters ``status``, ``kind`` (unknown values are ignored) and ``scaler`` (name),
    newest first. Returns ``(queryset, cleaned)`` with ``cleaned`` the values as the page shows them."""
    qs = Operation.objects.select_related("label_set", "requested_by", "approved_by", "rejected_by")
    status = params.get("status", "")
    kind = params.get("kind", "")
    scaler = (params.get("scaler") or "").strip()
    if status in OperationStatus.values:
        qs = qs.filter(status=status)
    if kind in OperationKind.values:
        qs = qs.filter(kind=kind)
    if scaler:
        qs = qs.filter(scaler_name=scaler)
    return qs, {"status": status, "kind": kind, "scaler": scaler}
