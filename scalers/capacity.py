"""Capacity figures for the dashboard: what each scaler holds against its caps, read from the database.

Counts come from the reservation rows (the admitted set) and from agent states; nothing here is
cached or kept beside them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Q, Sum

from agents.choices import ACTIVE_STATES, AgentState
from agents.models import Agent

from .models import ConfigState, MachinePool, Reservation, Scaler
from .pauses import pauses_holding


@dataclass
class Capacity:
    """One cap holder (a scaler, a machine pool, or the whole console).

    ``reserved``: reservation rows (agents admitted and not yet released). ``states``: active agents
    per state (``{"running": 3, "spawning": 1}``). ``cpus`` / ``memory_bytes``: summed reservation
    requests (CPUs, bytes). ``max_*``: the caps, ``None`` when uncapped. ``pause``: the sentence of
    the pause holding the scaler (its own or its host's), "" when none.
    """

    key: str
    name: str
    max_agents: int | None = None
    max_cpu: float | None = None
    max_memory_bytes: int | None = None
    reserved: int = 0
    cpus: float = 0.0
    memory_bytes: int = 0
    states: dict[str, int] = field(default_factory=dict)
    scaler: Scaler | None = None
    pause: str = ""

    @property
    def running(self) -> int:
        return self.states.get(AgentState.RUNNING, 0)

    @property
    def other_reserved(self) -> int:
        """Reserved but not running (spawning, draining, destroying, or a row whose agent is gone)."""
        return max(0, self.reserved - self.running)

    @property
    def active(self) -> int:
        return sum(self.states.values())

    @property
    def at_agent_cap(self) -> bool:
        return self.max_agents is not None and self.reserved >= self.max_agents

    def state_items(self) -> list[tuple[str, int]]:
        """``[(state, count)]`` in lifecycle order, zero counts left out."""
        return [(s.value, self.states[s.value]) for s in AgentState if self.states.get(s.value)]


def scaler_capacities(scalers=None, *, pauses: bool = False) -> list[Capacity]:
    """Capacity for ``scalers`` (a queryset or list; default: every scaler), in the given order;
    with ``pauses``, each one's ``pause`` too (the pages; the samples do without).

    Two queries whatever the number of scalers, three with ``pauses``.
    """
    scalers = list(Scaler.objects.all() if scalers is None else scalers)
    ids = [s.pk for s in scalers]
    reserved: dict[int, Any] = {
        row["scaler_id"]: row
        for row in Reservation.objects.filter(scaler_id__in=ids)
        .values("scaler_id")
        .annotate(n=Count("id"), cpu=Sum("cpus"), mem=Sum("memory_bytes"))
    }
    states: dict[int, dict[str, int]] = defaultdict(dict)
    for row in (
        Agent.objects.filter(scaler_id__in=ids, state__in=ACTIVE_STATES)
        .values("scaler_id", "state")
        .annotate(n=Count("id"))
    ):
        states[row["scaler_id"]][row["state"]] = row["n"]
    paused = pauses_holding(scalers) if pauses else {}
    out = []
    for s in scalers:
        r = reserved.get(s.pk, {})
        out.append(
            Capacity(
                key=f"scaler-{s.pk}",
                name=s.name,
                max_agents=s.max_agents,
                max_cpu=s.max_cpu,
                max_memory_bytes=s.max_memory_bytes,
                reserved=r.get("n", 0),
                cpus=r.get("cpu") or 0.0,
                memory_bytes=r.get("mem") or 0,
                states=states.get(s.pk, {}),
                scaler=s,
                pause=paused[s.pk]["wording"] if s.pk in paused else "",
            )
        )
    return out


def listed_scaler_capacities(pks=None) -> list[Capacity]:
    """The rows of ``/scalers/``: the capacity of every scaler (or of those with a pk in ``pks``),
    each scaler annotated with ``n_label_sets`` (its label sets not retired) and its machine pool."""
    scalers = Scaler.objects.annotate(
        n_label_sets=Count("label_sets", filter=Q(label_sets__retired=False))
    ).select_related("machine_pool")
    if pks is not None:
        scalers = scalers.filter(pk__in=list(pks))
    return scaler_capacities(scalers)


def global_capacity() -> Capacity:
    """The console-wide figures against ``globalMaxAgents`` and ``globalResourceCap``."""
    cfg = ConfigState.load()
    agg = Reservation.objects.aggregate(n=Count("id"), cpu=Sum("cpus"), mem=Sum("memory_bytes"))
    states = {
        row["state"]: row["n"]
        for row in Agent.objects.filter(state__in=ACTIVE_STATES).values("state").annotate(n=Count("id"))
    }
    return Capacity(
        key="global",
        name="All scalers",
        max_agents=cfg.global_max_agents,
        max_cpu=cfg.global_max_cpu,
        max_memory_bytes=cfg.global_max_memory_bytes,
        reserved=agg["n"] or 0,
        cpus=agg["cpu"] or 0.0,
        memory_bytes=agg["mem"] or 0,
        states=states,
    )


def pool_capacities() -> list[Capacity]:
    """Machine pools (shared CPU/memory caps) with what their reservations hold."""
    pools = list(MachinePool.objects.all())
    if not pools:
        return []
    held: dict[int, Any] = {
        row["machine_pool_id"]: row
        for row in Reservation.objects.filter(machine_pool__isnull=False)
        .values("machine_pool_id")
        .annotate(n=Count("id"), cpu=Sum("cpus"), mem=Sum("memory_bytes"))
    }
    return [
        Capacity(
            key=f"pool-{p.pk}",
            name=p.name,
            max_cpu=p.max_cpu,
            max_memory_bytes=p.max_memory_bytes,
            reserved=held.get(p.pk, {}).get("n", 0),
            cpus=held.get(p.pk, {}).get("cpu") or 0.0,
            memory_bytes=held.get(p.pk, {}).get("mem") or 0,
        )
        for p in pools
    ]
