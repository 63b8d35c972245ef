"""Warm pools: idle agents kept ready per (scaler × label set), filled under the admission lock
with the same caps as jobs and trimmed per pool. When a pool exists, the tick, the deficit pass
and the idle check: docs/lifecycle.md ("Warm pools").
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from scalers.models import ScaleOutcome, this_host

from .admission import ledger
from .admission.caps import count_headroom
from .admission.decide import Request, decide_batch
from .jobs import enqueue_spawn_or_fail
from .lifecycle import drain_and_destroy
from .metrics import WARM_REAPED, add_to_counters, counter_increment
from .warm_pool_config import configured_pools, pool_counts, read_world

log = logging.getLogger("scalers.warm_pools")

#: Seconds between ticks.
WARM_TICK_SECONDS = 30.0


def deficit_pass() -> int:
    """Issue the warm spawns every pool lacks, under the admission lock. Returns spawns admitted."""
    with transaction.atomic():
        with connection.cursor() as cur:
            config_row = ledger.lock_admission(cur)
            world, usage = ledger.load_snapshot(cur, config_row)
            counts = pool_counts(cur)
        pools, warnings = configured_pools(world)
        for w in warnings:
            log.warning(w)
        global_left = count_headroom(usage.total, world.glob.max_agents)
        scaler_left: dict[int, int] = {}
        requests: list[Request] = []
        for pool in pools:
            if pool.size <= 0 or world.scalers[pool.scaler_pk].tools_missing:
                continue  # a scaler not started (host tools missing) is not filled
            ready, in_flight = counts.get(pool.label_set_pk, (0, 0))
            deficit = pool.size - ready - in_flight
            if deficit <= 0:
                continue
            caps = world.scalers[pool.scaler_pk].caps
            left = scaler_left.setdefault(pool.scaler_pk, count_headroom(usage.scaler(pool.scaler_pk), caps.max_agents))
            n = min(deficit, left, global_left)
            scaler_left[pool.scaler_pk] = left - n
            global_left -= n
            requests += [
                Request(labels=(), job_id="", warm=True, target=(pool.scaler_pk, pool.label_set_pk)) for _ in range(n)
            ]
        if not requests:
            return 0
        result = decide_batch(requests)
    for decision, agent in zip(
        [d for d in result.decisions if d.action == ScaleOutcome.SPAWNING], result.admitted, strict=True
    ):
        enqueue_spawn_or_fail(decision, agent)
    refused = [d for d in result.decisions if d.action != ScaleOutcome.SPAWNING]
    if refused:
        log.info(
            "warm pass: %d warm spawns refused (%s)",
            len(refused),
            ", ".join(sorted({d.cap or d.reason for d in refused})),
        )
    return len(result.admitted)


def idle_check(now: datetime | None = None, *, reconcile: bool = False) -> int:
    """Destroy surplus idle warm agents of this host's scalers (see the module docstring; their
    sandboxes are this host's to remove). ``reconcile=True`` (after a
    config change) destroys a shrunk pool's oldest surplus without waiting for the idle timeout.
    Returns how many were destroyed."""
    now = now or timezone.now()
    pools, _ = configured_pools(read_world(), now)
    by_set = {p.label_set_pk: p for p in pools}
    idle = list(
        Agent.objects.select_related("scaler")
        .filter(scaler__host=this_host(), warm=True, state=AgentState.RUNNING, bound_job_id="", active_jobs=0)
        .order_by("registered_at", "id")
    )
    groups: dict[int | None, list[Agent]] = {}
    for a in idle:
        groups.setdefault(a.label_set_id, []).append(a)
    destroyed = 0
    for ls_pk, agents in groups.items():
        pool = by_set.get(ls_pk) if ls_pk is not None else None
        excess = len(agents) - (pool.size if pool else 0)
        if excess <= 0:
            continue
        for agent in agents[:excess]:
            since = agent.registered_at or agent.created_at
            idle_for = (now - since).total_seconds()
            timeout = pool.idle_timeout_seconds if pool else 0.0
            if pool is not None and not reconcile and idle_for <= timeout:
                continue
            if drain_and_destroy(agent, "warm-pool-idle", destroy_reason="idle"):
                destroyed += 1
                add_to_counters(counter_increment(WARM_REAPED, {"scaler": agent.scaler.name}))
    return destroyed


class WarmPools:
    """The periodic driver: ``start()`` runs the first tick now and arms the interval; ``tick()``
    is called by the sweeper. Tracks the config version to reconcile after a change."""

    def __init__(self, interval: float = WARM_TICK_SECONDS):
        self.interval = interval
        self.started = False
        self._last_tick: float | None = None
        self._last_version: str | None = None
        self._lock = threading.Lock()

    def start(self, *, deficits: bool = True) -> None:
        self.started = True
        self.tick(force=True, deficits=deficits)

    def due(self, monotonic_now: float) -> bool:
        return self.started and (self._last_tick is None or monotonic_now - self._last_tick >= self.interval)

    def tick(self, *, force: bool = False, now: datetime | None = None, deficits: bool = True) -> bool:
        """Idle check (this host's agents) then, with ``deficits`` (the leading sweeper: the pass
        spans every host's pools), the deficit pass. Returns True when an agent was destroyed or
        spawned."""
        with self._lock:
            if not self.started or (not force and not self.due(time.monotonic())):
                return False
            self._last_tick = time.monotonic()
            version = read_world().version
            reconcile = self._last_version is not None and version != self._last_version
            self._last_version = version
            destroyed = idle_check(now, reconcile=reconcile)
            spawned = deficit_pass() if deficits else 0
            return bool(destroyed or spawned)


WARM_POOLS = WarmPools()


def start_warm_pools(*, deficits: bool = True) -> None:
    """Run the pools' first tick now and arm their periodic tick (separate from start so the
    first fill waits until everything a spawn reaches is wired). Every host's sweeper starts it;
    only the leading one passes ``deficits`` (the deficit pass spans every host's pools)."""
    WARM_POOLS.start(deficits=deficits)
