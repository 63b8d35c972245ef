"""Per-kind sweep interval (``KICI_SWEEP_<KIND>_SECONDS``) and auto-approve policy
(``KICI_AUTO_APPROVE``), read from the environment at each sweep; empty by default, so nothing is
reaped, released or retired on a guess. Defaults and bounds: docs/operations.md ("Periodic sweeps").
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from lib.env import env_int, env_list

from .choices import OperationKind
from .kinds.catalog import get_kind


@dataclass(frozen=True)
class SweepPolicy:
    interval_seconds: int  # 0 = off
    auto_approve: bool

    @property
    def enabled(self) -> bool:
        return self.interval_seconds > 0


def interval_variable(kind: str) -> str:
    return f"KICI_SWEEP_{OperationKind(kind).value.upper().replace('-', '_')}_SECONDS"


def auto_approved_kinds() -> frozenset[str]:
    kinds = env_list("KICI_AUTO_APPROVE", [])
    known = {k.value for k in OperationKind}
    for kind in kinds:
        if kind not in known:
            raise ImproperlyConfigured(
                f"KICI_AUTO_APPROVE: {kind!r} is not an operation kind (known: {', '.join(sorted(known))})"
            )
    return frozenset(kinds)


def sweep_policy(kind: str) -> SweepPolicy:
    """The policy of ``kind`` (an OperationKind value); ImproperlyConfigured names a bad variable."""
    name = interval_variable(kind)
    default = get_kind(kind).sweep_seconds
    seconds = env_int(name, settings.KICI_SWEEP_INTERVAL_SECONDS if default is None else default, minimum=0)
    if 0 < seconds < 5:
        raise ImproperlyConfigured(f"{name}={seconds} is below the minimum 5 (0 turns the sweep off)")
    return SweepPolicy(interval_seconds=seconds, auto_approve=OperationKind(kind).value in auto_approved_kinds())
