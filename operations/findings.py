"""Findings: what the orphan and drift detections see now, shown before anyone plans anything. Every
sweeper round runs each detecting kind's pure plan (:data:`DETECTING_KINDS`) for this host's
scopes and keeps its targets as :class:`operations.models.Finding` rows (a target gone is
deleted); nothing is planned, approved or announced. A scope whose runtime cannot be listed keeps
its findings as they were. Design: docs/operations.md ("Findings").
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from scalers.models import this_host

from .choices import OperationKind
from .kinds.base import Kind, Scope, jsonable
from .kinds.catalog import get_kind
from .models import Finding

log = logging.getLogger(__name__)

#: The kinds whose plan is a detection (it only lists what exists), in the order they are shown.
DETECTING_KINDS = (OperationKind.ORPHAN_CONTAINERS, OperationKind.ORPHAN_VMS, OperationKind.STALE_ISOLATION_RULES)

#: (kind, scaler pk) whose last detection failed: logged as a warning once, then at debug level.
_FAILING: set[tuple[str, int]] = set()


def detect_findings(now: datetime | None = None) -> bool:
    """One detection round over this host's scalers; True when a finding appeared or went.
    Never raises for one scope (logged; its findings are left as they were)."""
    now = now or timezone.now()
    here = this_host()
    changed = False
    for name in DETECTING_KINDS:
        kind = get_kind(name)
        try:
            scopes = kind.sweep_scopes()
        except Exception:
            log.warning("findings: %s: could not list scopes", name, exc_info=True)
            continue
        for scope in scopes:
            if scope.scaler is None or scope.scaler.host != here:
                continue
            failing = (str(name), scope.scaler.pk)
            try:
                changed |= _detect(kind, scope, now)
            except Exception:
                # Once per failing spell, not every round (a docker that is down stays down a while).
                level = logging.DEBUG if failing in _FAILING else logging.WARNING
                log.log(level, "findings: %s of scaler %s failed", name, scope.scaler.name, exc_info=True)
                _FAILING.add(failing)
            else:
                _FAILING.discard(failing)
    return changed


def _detect(kind: Kind, scope: Scope, now: datetime) -> bool:
    """Plan ``kind`` for ``scope`` and make its findings the plan's targets; True when one
    appeared or went."""
    plan = kind.plan(scope)
    found = {t.key: t for t in plan.targets}
    with transaction.atomic():
        rows = Finding.objects.filter(kind=kind.name, scaler=scope.scaler)
        gone, _ = rows.exclude(key__in=list(found)).delete()
        known = {f.key: f for f in rows.only("pk", "key", "evidence")}
        rows.update(last_seen_at=now)
        new, changed = [], []
        for key, target in found.items():
            evidence = jsonable(target.evidence)
            if key not in known:
                new.append(
                    Finding(
                        kind=kind.name,
                        scaler=scope.scaler,
                        key=key,
                        subject=target.subject[:500],
                        action=target.action[:200],
                        evidence=evidence,
                        first_seen_at=now,
                        last_seen_at=now,
                    )
                )
            elif known[key].evidence != evidence:  # a container's status text and age change each round
                known[key].evidence = evidence
                changed.append(known[key])
        Finding.objects.bulk_create(new)
        Finding.objects.bulk_update(changed, ["evidence"])
    return bool(gone) or bool(new)
