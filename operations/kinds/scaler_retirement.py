"""Tear down a retired scaler: one removed from ``scalers.yaml`` (marked retiring by the reload) is
torn down once it has no active agent, no reservation and no spawn in flight.

Scope: one scaler; the sweep plans every retiring scaler not yet torn down. The single target is the
scaler itself, with its counts as evidence; a scaler that still holds agents or reservations is
spared with the counts (it drains first).
"""

from __future__ import annotations

from agents.choices import ACTIVE_STATES, UNREGISTERED_STATES
from scalers.models import Reservation, Scaler, ScalerTeardown

from ..choices import OperationKind, TargetOutcome
from .base import Kind, Plan, Scope, ScopeInvalid, Spared, Target, age_seconds, require_scaler
from .reaping import backend_for


def _torn_down(scaler) -> bool:
    return ScalerTeardown.objects.filter(scaler=scaler).exists()


def teardown_retired_scaler(scaler, reason: str) -> str:
    """Tear down one empty retiring scaler as admission's ``retirement_sweep`` does for all of them:
    the backend's optional ``teardown()``, then a ``ScalerTeardown`` row. Refuses (ValueError) when
    the scaler is not retiring or still holds an active agent or a reservation."""
    scaler = Scaler.objects.get(pk=scaler.pk)
    if not scaler.retiring:
        raise ValueError(f"scaler {scaler.name!r} is not retiring")
    if scaler.agents.filter(state__in=ACTIVE_STATES).exists() or Reservation.objects.filter(scaler=scaler).exists():
        raise ValueError(f"scaler {scaler.name!r} still holds agents or reservations")
    detail = reason
    try:
        hook = getattr(backend_for(scaler), "teardown", None)
        if callable(hook):
            hook()
            detail += "; backend teardown ran"
    except Exception as exc:  # noqa: BLE001 - recorded; the scaler is empty either way
        detail += f"; backend teardown failed: {exc}"
    row, created = ScalerTeardown.objects.get_or_create(scaler=scaler, defaults={"detail": detail})
    return detail if created else f"already torn down at {row.torn_down_at:%Y-%m-%d %H:%M:%S}"


class ScalerRetirement(Kind):
    name = OperationKind.SCALER_RETIREMENT
    volatile = frozenset({"retiring_seconds"})
    swept = True

    def validate_scope(self, scope: Scope) -> None:
        require_scaler(scope, what="a retirement")
        if not scope.scaler.retiring:
            raise ScopeInvalid("scaler", f"scaler {scope.scaler.name!r} is not retiring (it is still in scalers.yaml)")

    def sweep_scopes(self) -> list[Scope]:
        return [Scope(scaler=s) for s in Scaler.objects.filter(retiring=True, teardown__isnull=True)]

    def plan(self, scope: Scope) -> Plan:
        scaler = Scaler.objects.get(pk=scope.scaler.pk)
        key = f"scaler:{scaler.name}"
        result = Plan()
        if not scaler.retiring:
            result.spared.append(Spared(key, scaler.name, "no longer retiring (back in scalers.yaml)"))
            return result
        if _torn_down(scaler):
            result.spared.append(Spared(key, scaler.name, "already torn down"))
            return result
        active = scaler.agents.filter(state__in=ACTIVE_STATES)
        evidence = {
            "retiring": True,
            "retiring_seconds": age_seconds(scaler.retiring_since),
            "active_agents": active.count(),
            "spawning": active.filter(state__in=UNREGISTERED_STATES).count(),
            "reservations": Reservation.objects.filter(scaler=scaler).count(),
            "type": scaler.type,
        }
        if evidence["active_agents"] or evidence["reservations"]:
            result.spared.append(
                Spared(
                    key,
                    scaler.name,
                    f"still draining: {evidence['active_agents']} active agent(s), {evidence['reservations']} "
                    "reservation(s)",
                    evidence,
                )
            )
            return result
        result.targets.append(Target(key, "tear down", scaler.name, evidence))
        return result

    def act(self, run, scope, plan, targets) -> None:
        for target in targets:
            try:
                detail = teardown_retired_scaler(
                    scope.scaler, f"retired scaler torn down by operation #{run.operation_id}"
                )
            except Exception as exc:  # noqa: BLE001
                run.report(target.key, TargetOutcome.FAILED, f"{type(exc).__name__}: {exc}")
                continue
            run.report(target.key, TargetOutcome.DONE, detail)
