"""The cap check of admission as pure arithmetic over a usage snapshot: no database here.
:mod:`scalers.admission.ledger` reads the snapshot under the admission lock,
:func:`first_refusing_cap` decides one request against it (caps in :data:`CAP_ORDER`) and
:meth:`Usage.admit` books the admitted request into it, so the next request of the same batch
sees it. ``maxConcurrentSpawns`` is not a cap: docs/admission.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class CapName(StrEnum):
    """The name of a cap, as stored (``ScaleRequest.cap``), answered and used as a metric label.
    Members are declared in check order."""

    GLOBAL_MAX_AGENTS = "globalMaxAgents"
    MAX_AGENTS = "maxAgents"
    RESOURCE_CAP_CPU = "resourceCap.cpu"
    RESOURCE_CAP_MEMORY = "resourceCap.memory"
    GLOBAL_RESOURCE_CAP_CPU = "globalResourceCap.cpu"
    GLOBAL_RESOURCE_CAP_MEMORY = "globalResourceCap.memory"
    MACHINE_POOL_CPU = "machinePool.cpu"
    MACHINE_POOL_MEMORY = "machinePool.memory"


#: Every cap name in check order (the declaration order of :class:`CapName`).
CAP_ORDER = tuple(CapName)
#: Caps on resources: a request larger than one of these *alone* can never be admitted while the cap
#: stands (:func:`cap_exceeded_alone`), whatever else runs.
RESOURCE_CAPS = (
    CapName.RESOURCE_CAP_CPU,
    CapName.RESOURCE_CAP_MEMORY,
    CapName.GLOBAL_RESOURCE_CAP_CPU,
    CapName.GLOBAL_RESOURCE_CAP_MEMORY,
    CapName.MACHINE_POOL_CPU,
    CapName.MACHINE_POOL_MEMORY,
)
#: Caps on agent counts: a refusal on one of these may warrant the ledger warning.
COUNT_CAPS = frozenset({CapName.GLOBAL_MAX_AGENTS, CapName.MAX_AGENTS})
#: Caps the unlabelled refusal gauge ``kici_orch_scaler_spawn_refusals_total`` does not count: a
#: machine-pool refusal does not bump it.
NOT_IN_ORCH_REFUSAL_GAUGE = frozenset({CapName.MACHINE_POOL_CPU, CapName.MACHINE_POOL_MEMORY})

# Sums of float cpus drift (0.1 + 0.2 > 0.3); a request that fits "exactly" must be admitted.
_EPS = 1e-9


@dataclass(frozen=True)
class ScalerCaps:
    """One scaler's caps. ``None`` = uncapped. cpus in cores, memory in bytes."""

    scaler_id: int
    max_agents: int
    max_cpu: float | None = None
    max_memory_bytes: int | None = None
    machine_pool_id: int | None = None


@dataclass(frozen=True)
class GlobalCaps:
    """``globalMaxAgents`` and ``globalResourceCap`` (cores, bytes; ``None`` = uncapped)."""

    max_agents: int
    max_cpu: float | None = None
    max_memory_bytes: int | None = None


@dataclass(frozen=True)
class PoolCaps:
    """One ``machinePools[]`` entry (cores, bytes; ``None`` = uncapped)."""

    pool_id: int
    max_cpu: float | None = None
    max_memory_bytes: int | None = None


@dataclass
class Tally:
    """Usage of one scope: reservation rows, active agents, reserved cpus and bytes; for a scaler
    also its spawns in flight (``spawning`` agents holding a spawn job id) and waiting for a slot
    (``spawning`` without one)."""

    reservations: int = 0
    active: int = 0
    cpus: float = 0.0
    memory_bytes: int = 0
    spawns_in_flight: int = 0
    spawns_waiting: int = 0

    @property
    def count(self) -> int:
        """The occupied slots: ``max(active agents, reservations)``."""
        return max(self.active, self.reservations)


@dataclass
class Usage:
    """The whole snapshot: global, per scaler (by id) and per machine pool (by id)."""

    total: Tally = field(default_factory=Tally)
    scalers: dict[int, Tally] = field(default_factory=dict)
    pools: dict[int, Tally] = field(default_factory=dict)
    #: Rows of the usage tally summed into this (``scalers.admission.ledger.FOLD_ROWS``).
    tally_rows: int = 0

    def scaler(self, scaler_id: int) -> Tally:
        return self.scalers.setdefault(scaler_id, Tally())

    def pool(self, pool_id: int) -> Tally:
        return self.pools.setdefault(pool_id, Tally())

    def admit(self, caps: ScalerCaps, cpus: float, memory_bytes: int) -> None:
        """Book one admitted spawn: a reservation, an active agent, its requests."""
        scopes = [self.total, self.scaler(caps.scaler_id)]
        if caps.machine_pool_id is not None:
            scopes.append(self.pool(caps.machine_pool_id))
        for t in scopes:
            t.reservations += 1
            t.active += 1
            t.cpus += cpus
            t.memory_bytes += memory_bytes

    def ledger_outruns_agents(self) -> bool:
        """True when more reservations exist than active agents (capacity billed to no agent)."""
        return self.total.reservations > self.total.active


def count_headroom(tally: Tally, max_agents: int) -> int:
    """Agents a count cap (``maxAgents``, ``globalMaxAgents``) still admits in ``tally``'s scope:
    ``max_agents`` minus its occupied slots, never below 0."""
    return max(0, max_agents - tally.count)


def _over(used: float, request: float, cap: float | None) -> bool:
    return cap is not None and used + request > cap + _EPS


def first_refusing_cap(
    usage: Usage,
    glob: GlobalCaps,
    caps: ScalerCaps,
    pool: PoolCaps | None,
    cpus: float,
    memory_bytes: int,
) -> CapName | None:
    """Return the first cap (in :data:`CAP_ORDER`) that refuses this request, or ``None``.

    ``cpus`` (cores) and ``memory_bytes`` are the resolved requests. Count caps refuse
    at ``count >= max``; resource caps refuse at ``used + request > cap`` (equal is admitted).
    ``pool`` is the scaler's machine pool, or ``None``.
    """
    s = usage.scaler(caps.scaler_id)
    if not count_headroom(usage.total, glob.max_agents):
        return CapName.GLOBAL_MAX_AGENTS
    if not count_headroom(s, caps.max_agents):
        return CapName.MAX_AGENTS
    if _over(s.cpus, cpus, caps.max_cpu):
        return CapName.RESOURCE_CAP_CPU
    if _over(s.memory_bytes, memory_bytes, caps.max_memory_bytes):
        return CapName.RESOURCE_CAP_MEMORY
    if _over(usage.total.cpus, cpus, glob.max_cpu):
        return CapName.GLOBAL_RESOURCE_CAP_CPU
    if _over(usage.total.memory_bytes, memory_bytes, glob.max_memory_bytes):
        return CapName.GLOBAL_RESOURCE_CAP_MEMORY
    if pool is not None:
        p = usage.pool(pool.pool_id)
        if _over(p.cpus, cpus, pool.max_cpu):
            return CapName.MACHINE_POOL_CPU
        if _over(p.memory_bytes, memory_bytes, pool.max_memory_bytes):
            return CapName.MACHINE_POOL_MEMORY
    return None


def resource_cap_limits(glob: GlobalCaps, caps: ScalerCaps, pool: PoolCaps | None) -> dict[CapName, float | int | None]:
    """Every resource cap in force for one scaler: cap name → its value (cores or bytes; None =
    uncapped), in :data:`RESOURCE_CAPS` order. ``pool`` is the scaler's machine pool or None."""
    return {
        CapName.RESOURCE_CAP_CPU: caps.max_cpu,
        CapName.RESOURCE_CAP_MEMORY: caps.max_memory_bytes,
        CapName.GLOBAL_RESOURCE_CAP_CPU: glob.max_cpu,
        CapName.GLOBAL_RESOURCE_CAP_MEMORY: glob.max_memory_bytes,
        CapName.MACHINE_POOL_CPU: pool.max_cpu if pool is not None else None,
        CapName.MACHINE_POOL_MEMORY: pool.max_memory_bytes if pool is not None else None,
    }


def cap_exceeded_alone(
    glob: GlobalCaps, caps: ScalerCaps, pool: PoolCaps | None, cpus: float, memory_bytes: int
) -> CapName | None:
    """The first resource cap (in :data:`RESOURCE_CAPS` order) that ``cpus`` cores or
    ``memory_bytes`` exceed on their own, or None.

    Such a request can never be admitted while the configuration stands, even with nothing else
    running: admission answers it with the permanent ``exceeds-cap`` refusal instead of
    ``at-capacity`` (which tells the orchestrator to retry). Equal to the cap fits.
    Count caps are not considered here: a slot frees when an agent ends.
    """
    for name, limit in resource_cap_limits(glob, caps, pool).items():
        request = cpus if name.endswith(".cpu") else memory_bytes
        if limit is not None and request > limit + _EPS:
            return name
    return None
