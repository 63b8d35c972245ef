"""Writing audit records: :func:`record` is called where an audited change happens, inside the
change's transaction when it has one, so the change and its record commit or roll back together."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .choices import ActorKind
from .models import AuditRecord

#: Characters of ``detail`` kept (a longer text is cut, "…" marking the cut).
DETAIL_MAX = 2000


def user_actor(user: Any) -> tuple[str, str]:
    """``(actor, actor_kind)`` of a Django user, or of the console itself for None (a sweep, a worker)."""
    if user is None or not getattr(user, "is_authenticated", False):
        return "system", ActorKind.SYSTEM.value
    return user.get_username(), ActorKind.USER.value


def audit_fields(
    action: str,
    *,
    actor: str = "system",
    actor_kind: str = ActorKind.SYSTEM,
    scaler_name: str = "",
    operation_id: int | None = None,
    operation_kind: str = "",
    agent_ref: str = "",
    detail: str = "",
    remote_addr: str | None = None,
) -> dict[str, Any]:
    """The columns of one audit record (``action``: an ``audit.choices.AuditAction`` value), values
    longer than their column cut, never refused: an audit write must not fail the change it records.
    For a writer that inserts records with its own statement (admission's batch write)."""
    if len(detail) > DETAIL_MAX:
        detail = detail[: DETAIL_MAX - 1] + "…"
    return {
        "action": action,
        "actor": actor[:200],
        "actor_kind": actor_kind,
        "scaler_name": scaler_name[:200],
        "operation_id": operation_id,
        "operation_kind": operation_kind[:40],
        "agent_ref": agent_ref[:100],
        "detail": detail,
        "remote_addr": remote_addr or None,
    }


def record_audit(
    action: str,
    *,
    actor: str = "system",
    actor_kind: str = ActorKind.SYSTEM,
    scaler_name: str = "",
    operation_id: int | None = None,
    operation_kind: str = "",
    agent_ref: str = "",
    detail: str = "",
    remote_addr: str | None = None,
    at: datetime | None = None,
) -> AuditRecord:
    """Store one audit record (:func:`audit_fields`: ``action`` an ``audit.choices.AuditAction``
    value, values too long for their column cut)."""
    fields = audit_fields(
        action,
        actor=actor,
        actor_kind=actor_kind,
        scaler_name=scaler_name,
        operation_id=operation_id,
        operation_kind=operation_kind,
        agent_ref=agent_ref,
        detail=detail,
        remote_addr=remote_addr,
    )
    if at is not None:
        fields["at"] = at
    return AuditRecord.objects.create(**fields)
