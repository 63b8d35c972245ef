"""One planner module per operation kind (issue 8). ``get_kind(kind)`` returns the module.

Each module has ``KIND``, ``VOLATILE``, ``ATOMIC``, ``SWEPT``, ``validate_scope(scope)``,
``plan(scope) -> Plan``, ``act(run, scope, plan, targets)`` and ``sweep_scopes()``; see
``operations.kinds.base.KindModule``.
"""

from __future__ import annotations

from importlib import import_module

from ..choices import OperationKind
from .base import Plan, PlanRefused, Scope, ScopeInvalid, Spared, Target  # noqa: F401

_MODULES = {
    OperationKind.ORPHAN_CONTAINERS: "orphan_containers",
    OperationKind.ORPHAN_VMS: "orphan_vms",
    OperationKind.STALE_ISOLATION_RULES: "stale_isolation_rules",
    OperationKind.STALE_RESERVATIONS: "stale_reservations",
    OperationKind.LOST_AGENTS: "lost_agents",
    OperationKind.AGENT_DRAIN: "agent_drain",
    OperationKind.AGENT_DESTROY: "agent_destroy",
    OperationKind.SCALER_RETIREMENT: "scaler_retirement",
    OperationKind.HOST_ACCESS_APPLY: "host_access_apply",
    OperationKind.CONFIG_RELOAD: "config_reload",
}


def get_kind(kind: str):
    """The planner module of ``kind`` (an ``OperationKind`` value); ValueError names an unknown kind."""
    try:
        name = _MODULES[OperationKind(kind)]
    except ValueError:
        raise ValueError(
            f"kind: unknown operation kind {kind!r}; known: {', '.join(k.value for k in OperationKind)}"
        ) from None
    return import_module(f"{__name__}.{name}")


def all_kinds():
    """Every kind module, in ``OperationKind`` order."""
    return [get_kind(k) for k in OperationKind]
