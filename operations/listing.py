"""Which operations ``/operations/`` shows: its filters, shared by the page and its live rows."""

from __future__ import annotations

from lib.query import choice

from .choices import OperationKind, OperationStatus
from .models import Operation

#: Rows per page of ``/operations/``.
PAGE_SIZE = 50

#: Parameters of ``/operations/``, each taken once (a filter picks one status, kind or scaler).
LIST_PARAMETERS = ("status", "kind", "scaler", "page")


def filter_operations(params) -> tuple:
    """Apply the filters ``status``, ``kind`` and ``scaler`` (name), newest first. Returns
    ``(queryset, cleaned)`` with ``cleaned`` the values as the page shows them. BadParameter naming
    the field and value for an unknown status or kind: a filter dropped silently shows a list the
    operator did not ask for."""
    qs = Operation.objects.select_related("label_set", "requested_by", "approved_by", "rejected_by")
    status = choice("status", params.get("status"), OperationStatus.values)
    kind = choice("kind", params.get("kind"), OperationKind.values)
    scaler = (params.get("scaler") or "").strip()
    if status:
        qs = qs.filter(status=status)
    if kind:
        qs = qs.filter(kind=kind)
    if scaler:
        qs = qs.filter(scaler_name=scaler)
    return qs, {"status": status, "kind": kind, "scaler": scaler}
