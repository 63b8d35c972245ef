"""The acting loop the reaping kinds share (orphan containers, orphan VMs, stale isolation rules):
each approved target is handed, with the object its plan kept for it, to the scaler's backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..adapters import get_backend
from ..choices import TargetOutcome
from .base import Plan, Run, Scope, Target


def act_on_planned(
    run: Run,
    scope: Scope,
    plan: Plan,
    targets: list[Target],
    attempt: Callable[[Any, Any, Target], tuple[TargetOutcome, str]],
) -> None:
    """For each target, ``attempt(backend, planned, target)`` with the backend of ``scope.scaler``
    (``operations.adapters.get_backend``, built once) and ``planned`` = ``plan.context[target.key]``;
    it returns the ``(outcome, detail)`` to report. An exception from it is reported ``failed`` as
    ``<Type>: <message>`` and the next target still runs."""
    backend = get_backend(scope.scaler)
    for target in targets:
        planned = plan.context[target.key]
        try:
            outcome, detail = attempt(backend, planned, target)
        except Exception as exc:  # noqa: BLE001 - one target failing does not stop the others
            run.report(target.key, TargetOutcome.FAILED, f"{type(exc).__name__}: {exc}")
            continue
        run.report(target.key, outcome, detail)
