"""Pauses: a scaler, or every scaler of one host, taking no new agent (``scalers.models.Pause``).

While a scaler or its host is paused, admission spawns and binds nothing for it and ``/scale``
answers 409 ``paused`` with who asked, who approved and why; its agents keep running (a pause
with ``drain`` also drains them: each is torn down once its job ends). Only the approved
``pause`` and ``resume`` operations call :func:`set_pause` and :func:`lift_pause`; the pages show
:func:`current_pauses` as a banner.
"""

from __future__ import annotations

from typing import overload

from django.db import transaction
from django.db.models import F, Q

from lib.wording import json_text

from .models import Pause, Scaler

#: Longest pause reason (characters).
MAX_REASON = 500


def reason_problem(value) -> str | None:
    """What is wrong with a pause reason (a non-empty string of at most :data:`MAX_REASON`
    characters), naming the value; None when it is fine."""
    if isinstance(value, str) and value.strip() and len(value.strip()) <= MAX_REASON:
        return None
    return f"must be a non-empty text of at most {MAX_REASON} characters saying why, got {json_text(value)}"


def known_hosts() -> list[str]:
    """The hosts that own at least one scaler, sorted."""
    return sorted(set(Scaler.objects.exclude(host="").values_list("host", flat=True)))


@overload
def pause_json(pause: Pause) -> dict: ...
@overload
def pause_json(pause: None) -> None: ...
def pause_json(pause: Pause | None) -> dict | None:
    """A pause as the API, admission and the pages carry it: ``{scope, scaler | host, requestedBy,
    approvedBy, reason, since, operation}`` (``since`` ISO 8601); None for None."""
    if pause is None:
        return None
    return pause_row_json(
        {
            "scaler_name": pause.scaler.name if pause.scaler is not None else "",
            "host": pause.host,
            "requested_by": pause.requested_by,
            "approved_by": pause.approved_by,
            "reason": pause.reason,
            "paused_at": pause.paused_at,
            "operation_ref": pause.operation_ref,
        }
    )


def pause_row_json(row: dict) -> dict:
    """:func:`pause_json` of a ``scalers_pause`` row read as a dict (with its scaler's
    ``scaler_name``, "" for a host's pause): admission reads them under its lock."""
    where = {"scope": "host", "host": row["host"]} if row["host"] else {"scope": "scaler", "scaler": row["scaler_name"]}
    return where | {
        "requestedBy": row["requested_by"],
        "approvedBy": row["approved_by"],
        "reason": row["reason"],
        "since": row["paused_at"].isoformat(),
        "operation": row["operation_ref"],
    }


def pause_wording(pause: dict) -> str:
    """One sentence naming what is paused, by whom, since when and why (from :func:`pause_json`)."""
    what = f"host {pause['host']}" if pause["scope"] == "host" else f"scaler {pause['scaler']}"
    approved = f", approved by {pause['approvedBy']}" if pause.get("approvedBy") else ""
    return (
        f"{what} is paused by {pause['requestedBy']}{approved} since {pause['since'][:19].replace('T', ' ')} UTC "
        f"(operation #{pause['operation']}): {pause['reason']}"
    )


def pauses_holding(scalers: list[Scaler]) -> dict[int, dict]:
    """The pause holding each of ``scalers`` (its own, else its host's) as :func:`pause_json` plus
    ``wording``, by scaler pk; a scaler that no pause holds is left out. One query."""
    hosts = {s.host for s in scalers if s.host}
    own: dict[int, dict] = {}
    by_host: dict[str, dict] = {}
    query = Q(scaler__in=[s.pk for s in scalers]) | Q(host__in=hosts)
    for pause in Pause.objects.select_related("scaler").filter(query):
        shown = pause_json(pause)
        shown = shown | {"wording": pause_wording(shown)}
        if pause.scaler_id:
            own[pause.scaler_id] = shown
        else:
            by_host[pause.host] = shown
    held = {s.pk: own.get(s.pk) or by_host.get(s.host) for s in scalers}
    return {pk: pause for pk, pause in held.items() if pause is not None}


def pause_of(scaler: Scaler) -> dict | None:
    """The pause holding ``scaler`` (:func:`pauses_holding`), None when none does."""
    return pauses_holding([scaler]).get(scaler.pk)


def current_pauses() -> list[dict]:
    """Every pause in force, as :func:`pause_json` plus ``wording``, hosts first, oldest first."""
    rows = Pause.objects.select_related("scaler").order_by(F("scaler_id").asc(nulls_first=True), "paused_at")
    return [p | {"wording": pause_wording(p)} for p in (pause_json(r) for r in rows)]


def set_pause(
    *,
    scaler: Scaler | None = None,
    host: str = "",
    reason: str,
    requested_by: str,
    approved_by: str,
    operation: int | None,
    drain: bool = False,
) -> tuple[Pause, bool]:
    """Pause ``scaler`` or ``host`` (exactly one). Returns the pause and whether it is new: an
    existing pause of the same scope is kept as it is (the first asker's who and why stand).
    Raises ValueError naming the field for a bad scope or reason."""
    if (scaler is None) == (not host):
        raise ValueError("scope: pause exactly one scaler or one host")
    if problem := reason_problem(reason):
        raise ValueError(f"reason: {problem}")
    with transaction.atomic():
        return Pause.objects.get_or_create(
            scaler=scaler,
            host=host,
            defaults={
                "reason": reason.strip(),
                "requested_by": requested_by,
                "approved_by": approved_by,
                "operation_ref": operation,
                "drain": drain,
            },
        )


def lift_pause(*, scaler: Scaler | None = None, host: str = "") -> bool:
    """Resume ``scaler`` or ``host``: remove its pause. True if there was one. A scaler whose host
    is paused stays paused (resume the host for it)."""
    if (scaler is None) == (not host):
        raise ValueError("scope: resume exactly one scaler or one host")
    deleted, _ = Pause.objects.filter(scaler=scaler, host=host).delete()
    return bool(deleted)
