"""Context for the operation templates, shared by the page views and the WebSocket consumer so a
live update renders exactly what the page rendered."""

from __future__ import annotations

import json

from lib.units import format_bytes_iec, format_duration
from operations.choices import OUTCOME_COLOURS
from operations.kinds.base import jsonable
from operations.models import Operation, target_dom_id
from operations.services import can_approve, stored_plan, unconfirmed_warnings_reason

_LABELS = {
    "age_seconds": "age",
    "owner_instance": "owner",
    "pid_probe": "pid probe",
    "container_state": "container",
    "address_holders": "address held by",
}


def _value(name: str, value) -> str:
    if name.endswith("_seconds") and isinstance(value, (int, float)):
        return format_duration(value)
    if name.endswith("_bytes") and isinstance(value, (int, float)):
        return format_bytes_iec(value)
    if value is None:
        # a label set's hostAccess of None is the default list, not a missing value
        return "default" if "host_access" in name else "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) if value else "none"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


#: evidence fields shown first, in this order (JSONB does not keep a dict's order); the rest follow
#: alphabetically
_FIRST = (
    "why", "agent_id", "agent_state", "agent_row", "state", "lost_by", "sandbox", "sandbox_detail", "last_heartbeat",
    "heartbeat_age_seconds", "container", "container_state", "status", "registered",
    "tracked", "pid_probe", "address", "addresses", "ip", "address_holders", "owner_instance", "age_seconds",
)  # fmt: skip


def evidence_items(evidence: dict) -> list[tuple[str, str]]:
    """``[(label, text)]`` of one target's evidence, the telling fields first."""
    evidence = evidence or {}
    order = [k for k in _FIRST if k in evidence] + sorted(k for k in evidence if k not in _FIRST)
    return [(_LABELS.get(k, k.replace("_", " ")), _value(k, evidence[k])) for k in order]


#: plan rows per page of the operation page (a reap may plan thousands of targets)
ROWS_PER_PAGE = 200


def target_rows(operation: Operation, keys=None, start: int = 0, stop: int | None = None) -> list[dict]:
    """Plan targets ``[start:stop]`` joined with their outcome; only ``keys`` when given (live updates)."""
    wanted = set(keys) if keys is not None else None
    rows = []
    for index, target in enumerate(operation.plan):
        if wanted is not None and target["key"] not in wanted:
            continue
        if wanted is None and (index < start or (stop is not None and index >= stop)):
            continue
        outcome = (operation.outcomes or {}).get(target["key"])
        rows.append(
            {
                **target,
                "index": index + 1,
                "dom_id": target_dom_id(target["key"]),
                "evidence_items": evidence_items(target.get("evidence", {})),
                "outcome": outcome,
                "outcome_colour": OUTCOME_COLOURS.get(outcome["outcome"], "grey") if outcome else "",
            }
        )
    return rows


def preview_context(kind: str, scope, plan) -> dict:
    """Everything ``operations/preview.html`` needs to show a plan that was not stored (a dry run):
    an unsaved :class:`Operation` for its kind, scope and first :data:`ROWS_PER_PAGE` rows
    (``rows``, as the operation page shows them), the spared candidates with their evidence,
    ``more`` (targets not shown) and the plan's ``digest`` (what "Request approval" compares)."""
    targets, digest = stored_plan(kind, plan)
    operation = Operation(
        kind=kind,
        scaler_name=scope.scaler.name if scope.scaler else "",
        label_set=scope.label_set,
        agent_ids=list(scope.agent_ids or []),
        plan=targets,
        notes=list(plan.notes),
        warnings=list(plan.warnings),
    )
    return {
        "operation": operation,
        "rows": target_rows(operation, stop=ROWS_PER_PAGE),
        "more": max(0, len(targets) - ROWS_PER_PAGE),
        "spared": [
            {**s, "evidence_items": evidence_items(s.get("evidence", {}))}
            for s in (jsonable(s.as_json()) for s in plan.spared)
        ],
        "digest": digest,
    }


def plan_pages(operation: Operation) -> int:
    """How many pages of :data:`ROWS_PER_PAGE` plan rows the operation page has (1 for an empty plan)."""
    return max(1, -(-len(operation.plan or []) // ROWS_PER_PAGE))


def detail_context(
    operation: Operation,
    user,
    keys=None,
    log_from: int | None = None,
    page: int | None = None,
    log_to: int | None = None,
) -> dict:
    """Everything ``operations/detail.html`` and its partials need. ``page`` (1-based) picks
    :data:`ROWS_PER_PAGE` plan rows; None renders all (or only ``keys``)."""
    total = len(operation.plan or [])
    pages = plan_pages(operation)
    start, stop = 0, None
    if page is not None:
        page = min(max(1, page), pages)
        start, stop = (page - 1) * ROWS_PER_PAGE, page * ROWS_PER_PAGE

    allowed, why_not = can_approve(user, operation)
    counts = operation.counts()
    log = list(operation.log or [])
    decider = operation.approved_by or operation.rejected_by
    return {
        "operation": operation,
        "decided_by": decider.get_username() if decider else "",
        "shown_status": operation.shown_status(),
        "rows": target_rows(operation, keys, start, stop),
        "rows_page": page or 1,
        "rows_pages": pages,
        "rows_first": start + 1,
        "rows_last": min(total, stop) if stop is not None else total,
        "spared": [{**s, "evidence_items": evidence_items(s.get("evidence", {}))} for s in operation.spared or []],
        "counts": counts,
        "processed": counts["total"] - counts["pending"],
        "log_entries": [
            {**entry, "index": index}
            for index, entry in enumerate(log)
            if (log_from is None or index >= log_from) and (log_to is None or index < log_to)
        ],
        "audit": list(operation.audit.select_related("user").all()),
        "can_decide": allowed,
        "cannot_decide_reason": why_not,
        "live": not operation.is_terminal,
        "ws_path": f"/ws/operations/{operation.pk}/",
    }


#: Targets the bulk approval step shows for each operation (its page shows them all).
BULK_TARGETS_SHOWN = 5


def bulk_rows(operations: list[Operation], user) -> list[dict]:
    """One entry per operation of a bulk approval (``operations/bulk_confirm.html``): ``operation``,
    ``counts``, its first :data:`BULK_TARGETS_SHOWN` ``targets``, ``more`` (how many are not
    shown), ``can_decide`` and ``cannot_decide_reason`` (``operations.services.can_approve``; an
    operation with warnings is approved only on its own)."""
    rows = []
    for operation in operations:
        allowed, why_not = can_approve(user, operation)
        if allowed and operation.warnings:
            allowed, why_not = False, unconfirmed_warnings_reason(operation)
        counts = operation.counts()
        rows.append(
            {
                "operation": operation,
                "counts": counts,
                "targets": target_rows(operation, stop=BULK_TARGETS_SHOWN),
                "more": max(0, counts["total"] - BULK_TARGETS_SHOWN),
                "can_decide": allowed,
                "cannot_decide_reason": why_not,
            }
        )
    return rows
