"""Which operations ``/operations/`` shows: its filters, shared by the page and its live rows."""

from __future__ import annotations

from .choices import OperationKind, OperationStatus
from .models import Operation

#: Rows per page of ``/operations/``.
PAGE_SIZE = 50


def filter_operations(params) -> tuple:
    """Apply the filters ``status``, ``kind`` and ``scaler`` (name), newest first. Returns
    ``(queryset, cleaned)`` with ``cleaned`` the values as the page shows them. ValueError naming
    the field and value for an unknown status or kind: a filter dropped silently shows a list the
    operator did not ask for."""
    qs = Operation.objects.select_related("label_set", "requested_by", "approved_by", "rejected_by")
    status = params.get("status", "")
    kind = params.get("kind", "")
    scaler = (params.get("scaler") or "").strip()
    for field, value, choices in (("status", status, OperationStatus), ("kind", kind, OperationKind)):
        if value and value not in choices.values:
            raise ValueError(f"{field}: must be one of {', '.join(choices.values)}, got {value[:100]!r}")
    if status:
        qs = qs.filter(status=status)
    if kind:
        qs = qs.filter(kind=kind)
    if scaler:
        qs = qs.filter(scaler_name=scaler)
    return qs, {"status": status, "kind": kind, "scaler": scaler}
