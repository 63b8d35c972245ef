"""Every operation kind by name: ``get_kind(name)`` gives the kind that plans and acts for it."""

from __future__ import annotations

from ..choices import OperationKind
from .agent_destroy import AgentDestroy
from .agent_drain import AgentDrain
from .base import Kind
from .config_reload import ConfigReload
from .holding import AgentHold, HoldRelease
from .host_access_apply import HostAccessApply
from .lost_agents import LostAgents
from .orphan_containers import OrphanContainers
from .orphan_vms import OrphanVms
from .pausing import Pause, Resume
from .scaler_retirement import ScalerRetirement
from .stale_isolation_rules import StaleIsolationRules
from .stale_reservations import StaleReservations

KINDS: dict[OperationKind, type[Kind]] = {
    cls.name: cls
    for cls in (
        OrphanContainers,
        OrphanVms,
        StaleIsolationRules,
        StaleReservations,
        LostAgents,
        AgentDrain,
        AgentDestroy,
        AgentHold,
        HoldRelease,
        ScalerRetirement,
        HostAccessApply,
        ConfigReload,
        Pause,
        Resume,
    )
}


def get_kind(kind: str) -> Kind:
    """The kind named ``kind`` (an ``OperationKind`` value); ValueError names an unknown kind."""
    try:
        cls = KINDS[OperationKind(kind)]
    except ValueError:
        raise ValueError(
            f"kind: unknown operation kind {kind!r}; known: {', '.join(k.value for k in OperationKind)}"
        ) from None
    return cls()


def all_kinds() -> list[Kind]:
    """Every kind, in ``OperationKind`` order."""
    return [get_kind(k) for k in OperationKind]
