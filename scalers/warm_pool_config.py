"""Which warm pools the configuration asks for, and each pool's gauge values (target, ready,
in flight), read from the database. Kept apart from :mod:`scalers.warm_pools` (which spawns and
destroys) so ``/metrics`` can read them without importing the spawn machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.utils import timezone

from agents.choices import AgentState
from scalers.labels import platform_to_taints
from scalers.resources import has_declared_shape

from .admission import ledger
from .admission.matching import ScalerInfo, World
from .warm_schedule import size_at


@dataclass(frozen=True)
class PoolSpec:
    """One configured pool: its scaler and label set, target size and idle timeout (seconds)."""

    scaler_pk: int
    scaler_name: str
    label_set_pk: int
    key: str  # normalised declared labels
    size: int
    idle_timeout_seconds: float


def pool_size(info: ScalerInfo, at: datetime) -> int:
    """The warm pool size ``info`` asks for at ``at``: its ``warmPool.schedule`` when it has one
    (``scalers.warm_schedule``), else its ``warmPool.size``."""
    warm = (info.config or {}).get("warmPool") or {}
    return size_at(warm, at) if warm.get("schedule") else info.warm_pool_size


def configured_pools(world: World, now: datetime | None = None) -> tuple[list[PoolSpec], list[str]]:
    """The pools the config asks for at ``now`` (sizes by their schedule), and one warning per
    pool refused (pure but for the clock)."""
    now = now or timezone.now()
    pools: list[PoolSpec] = []
    warnings: list[str] = []
    for info in world.scalers.values():
        if not info.warm_pool_enabled or info.retiring:
            continue
        for ls in info.label_sets:
            key = ",".join(sorted(set(ls.declared)))
            query = set(ls.declared) | set(platform_to_taints(info.platform))
            missing = [g for g in ls.gate if g not in query]
            if missing:
                warnings.append(f"warm pool {info.name}[{key}] not configured: gate labels {missing} unreachable")
                continue
            try:
                shaped = has_declared_shape(ls.resources, world.defaults)
            except ValueError as exc:
                warnings.append(f"warm pool {info.name}[{key}] not configured: {exc}")
                continue
            if not shaped:
                warnings.append(
                    f"warm pool {info.name}[{key}] not configured: "
                    "neither the label set nor defaults declare cpus or memory"
                )
                continue
            pools.append(
                PoolSpec(info.pk, info.name, ls.pk, key, pool_size(info, now), info.warm_pool_idle_timeout_seconds)
            )
    return pools, warnings


def pool_counts(cursor) -> dict[int, tuple[int, int]]:
    """``{label set pk: (ready, in_flight)}`` for warm agents; in flight = spawning or connecting
    (not registered yet)."""
    cursor.execute(
        "SELECT label_set_id, count(*) FILTER (WHERE state = %s AND bound_job_id = '' AND active_jobs = 0), "
        "count(*) FILTER (WHERE state IN (%s, %s)) FROM agents_agent WHERE warm AND state IN (%s, %s, %s) "
        "AND label_set_id IS NOT NULL GROUP BY label_set_id",
        [
            str(AgentState.RUNNING),
            str(AgentState.SPAWNING),
            str(AgentState.CONNECTING),
            str(AgentState.RUNNING),
            str(AgentState.SPAWNING),
            str(AgentState.CONNECTING),
        ],
    )
    return {r[0]: (r[1], r[2]) for r in cursor.fetchall()}


def read_world() -> World:
    """The routing/caps view without taking the admission lock."""
    with connection.cursor() as cur:
        return ledger.load_world(cur, ledger.read_config(cur))


@dataclass(frozen=True)
class PoolStatus:
    """Gauge values of one pool: ``target``, ``ready`` (idle warm agents), ``in_flight``."""

    scaler: str
    label_set: str
    target: int
    ready: int
    in_flight: int


def pool_status() -> list[PoolStatus]:
    """Every configured pool with its target / ready / in-flight counts (for /metrics, pages)."""
    world = read_world()
    pools, _ = configured_pools(world)
    with connection.cursor() as cur:
        counts = pool_counts(cur)
    return [PoolStatus(p.scaler_name, p.key, p.size, *counts.get(p.label_set_pk, (0, 0))) for p in pools]
