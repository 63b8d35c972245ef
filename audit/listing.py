"""The audit page's filters (who, what, when, scaler, agent, operation) and its exports' rows.

Every filter is validated first; a bad value raises ``lib.query.BadParameter`` naming the parameter
and the value, never a silently dropped filter."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from lib.query import BadParameter, whole_number
from lib.wording import json_text

from .choices import AuditAction
from .models import AuditRecord

#: Parameters of ``/audit/``, each taken once.
AUDIT_PARAMETERS = ("who", "what", "scaler", "agent", "operation", "since", "until", "page", "format")

#: Columns of the CSV export, in order (the JSON export's keys are the same).
EXPORT_FIELDS = (
    "at",
    "action",
    "actor",
    "actor_kind",
    "scaler",
    "operation_id",
    "operation_kind",
    "agent",
    "detail",
    "remote_addr",
)

#: Longest text filter kept (characters).
TEXT_MAX = 200


@dataclass(frozen=True)
class AuditFilters:
    """The filters in force: ``what`` is an ``AuditAction`` value or an operation kind; ``since`` and
    ``until`` bound ``at`` (``since`` inclusive, ``until`` exclusive)."""

    who: str = ""
    what: str = ""
    scaler: str = ""
    agent: str = ""
    operation: int | None = None
    since: datetime | None = None
    until: datetime | None = None

    def apply(self, qs: QuerySet[AuditRecord]) -> QuerySet[AuditRecord]:
        if self.who:
            qs = qs.filter(actor__icontains=self.who)
        if self.what:
            qs = qs.filter(Q(action=self.what) | Q(operation_kind=self.what))
        if self.scaler:
            qs = qs.filter(scaler_name=self.scaler)
        if self.agent:
            qs = qs.filter(agent_ref=self.agent)
        if self.operation is not None:
            qs = qs.filter(operation_id=self.operation)
        if self.since is not None:
            qs = qs.filter(at__gte=self.since)
        if self.until is not None:
            qs = qs.filter(at__lt=self.until)
        return qs

    @property
    def active(self) -> bool:
        return any(v not in ("", None) for v in self.__dict__.values())


def _when(name: str, raw: str | None) -> datetime | None:
    """An ISO 8601 date-time (``2026-12-05T08:00``, seconds and an offset optional; without an offset
    it is the console's time zone), None when absent. BadParameter otherwise."""
    raw = (raw or "").strip()
    if not raw:
        return None
    try:
        value = parse_datetime(raw)
    except ValueError:
        value = None
    if value is None:
        raise BadParameter(name, f"must be a date and time such as 2026-12-05T08:00, got {json_text(raw)}")
    return timezone.make_aware(value) if timezone.is_naive(value) else value


def parse_filters(params, what_choices: tuple[str, ...]) -> AuditFilters:
    """The filters of query ``params`` (a ``QueryDict``); ``what_choices``: the accepted ``what``
    values (audit actions and operation kinds). BadParameter naming the first bad one."""
    what = (params.get("what") or "").strip()
    if what and what not in what_choices:
        raise BadParameter("what", f"must be an audit action or an operation kind, got {json_text(what)}")
    raw_operation = (params.get("operation") or "").strip()
    operation = whole_number("operation", raw_operation, 1, 2**63 - 1) if raw_operation else None
    since, until = _when("since", params.get("since")), _when("until", params.get("until"))
    if since is not None and until is not None and until <= since:
        raise BadParameter("until", f"must be after since ({since.isoformat()}), got {json_text(until.isoformat())}")
    return AuditFilters(
        who=(params.get("who") or "").strip()[:TEXT_MAX],
        what=what,
        scaler=(params.get("scaler") or "").strip()[:TEXT_MAX],
        agent=(params.get("agent") or "").strip()[:TEXT_MAX],
        operation=operation,
        since=since,
        until=until,
    )


def export_row(entry: AuditRecord) -> dict:
    """One record as the exports write it (keys: :data:`EXPORT_FIELDS`)."""
    return {
        "at": entry.at.isoformat(),
        "action": entry.action,
        "actor": entry.actor,
        "actor_kind": entry.actor_kind,
        "scaler": entry.scaler_name,
        "operation_id": entry.operation_id,
        "operation_kind": entry.operation_kind,
        "agent": entry.agent_ref,
        "detail": entry.detail,
        "remote_addr": entry.remote_addr,
    }


def export_rows(qs: QuerySet[AuditRecord], limit: int) -> Iterator[dict]:
    """At most ``limit`` rows of ``qs``, newest first, read from the database in chunks (a server-side
    cursor), so an export of any size holds a chunk in memory, never the whole."""
    for entry in qs[:limit].iterator(chunk_size=2000):
        yield export_row(entry)


def action_values() -> tuple[str, ...]:
    return tuple(AuditAction.values)
