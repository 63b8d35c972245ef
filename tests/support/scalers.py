"""Scaler, machine-pool, global-config and agent rows written straight to the database, as the
importer and admission would write them."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from datetime import timedelta

from django.utils import timezone

from agents.choices import AgentState
from agents.models import Agent
from scalers.labels import normalize_label_set
from scalers.models import ConfigState, LabelSet, MachinePool, Reservation, Scaler

#: Prefix of the scaler names made up by ``make_scaler`` (docker containers are cleaned up by it).
PREFIX = "ctr-t-"

#: The label-set entry used when none is given: the agent image built for the tests, never pulled.
DEFAULT_LABEL_SET_ENTRY = {"image": "kici-agent:local", "imagePullPolicy": "Never"}


def make_scaler(
    name: str | None = None,
    type: str = "container",
    labels: Iterable[str] = ("linux", "ctr"),
    ls_config: dict | None = None,
    *,
    label_sets: Iterable[Iterable[str]] | None = None,
    max_agents: int = 10,
    cpu: float | None = None,
    memory: int | None = None,
    pool: MachinePool | None = None,
    mandatory: Iterable[str] = (),
    warm_size: int | None = None,
    warm_idle_timeout: float = 300,
    config: dict | None = None,
    **fields,
) -> Scaler:
    """A scaler (``name`` defaults to a fresh ``PREFIX`` name) with one label set ``labels``, or one
    per entry of ``label_sets``. Each set's entry (yaml names) is ``ls_config`` plus its labels, by
    default ``DEFAULT_LABEL_SET_ENTRY``; its host access is the entry's ``networkPolicy.hostAccess``.
    ``cpu``/``memory`` are the scaler's resource cap, ``pool`` its machine pool, ``warm_size`` turns
    a warm pool on; any other Scaler field (``max_concurrent_spawns``, ``retiring``, ``roles``,
    ``orchestrator_url``, ...) is passed through."""
    name = name or f"{PREFIX}{secrets.token_hex(3)}"
    scaler = Scaler.objects.create(
        **{
            "name": name,
            "type": type,
            "max_agents": max_agents,
            "max_cpu": cpu,
            "max_memory_bytes": memory,
            "machine_pool": pool,
            "mandatory_labels": list(mandatory),
            "warm_pool_enabled": warm_size is not None,
            "warm_pool_size": warm_size or 0,
            "warm_pool_idle_timeout_seconds": warm_idle_timeout,
            "config": config if config is not None else {},
            **fields,
        }
    )
    for index, declared in enumerate(label_sets if label_sets is not None else [labels]):
        declared = [label.lower() for label in declared]
        entry = {"labels": declared, **(ls_config if ls_config is not None else DEFAULT_LABEL_SET_ENTRY)}
        LabelSet.objects.create(
            scaler=scaler,
            index=index,
            labels=declared,
            normalized=normalize_label_set(declared),
            config=entry,
            host_access=(entry.get("networkPolicy") or {}).get("hostAccess"),
        )
    return scaler


def make_pool(name: str, cpu: float | None = None, memory: int | None = None) -> MachinePool:
    return MachinePool.objects.create(name=name, max_cpu=cpu, max_memory_bytes=memory)


def set_global(
    max_agents: int = 50, cpu: float | None = None, memory: int | None = None, defaults: dict | None = None
) -> ConfigState:
    """The global caps and defaults (``globalMaxAgents``, ``globalResourceCap``, ``defaults``)."""
    cfg = ConfigState.load()
    cfg.global_max_agents = max_agents
    cfg.global_max_cpu = cpu
    cfg.global_max_memory_bytes = memory
    cfg.defaults = defaults or {}
    cfg.save()
    return cfg


def make_agent(scaler: Scaler, state: str = AgentState.SPAWNING, reserve: bool = True, **fields) -> Agent:
    """An admitted agent row (and its reservation), as admission would write it."""
    agent_id = fields.pop("agent_id", f"scaler-{scaler.type}-{secrets.token_hex(4)}")
    ls = scaler.label_sets.first()
    agent = Agent.objects.create(
        agent_id=agent_id,
        scaler=scaler,
        label_set=ls,
        state=state,
        labels=fields.pop("labels", list(ls.labels) + [f"kici:agent:{scaler.type}", f"kici:scaler:{scaler.name}"]),
        owner_instance="test",
        **fields,
    )
    if reserve:
        Reservation.objects.create(scaler=scaler, agent=agent, cpus=1, memory_bytes=1 << 30, owner_instance="test")
    return agent


def agent_field_cases() -> list[tuple[str, dict]]:
    """``(state, fields)`` of agents whose orchestrator-facing values differ in every way that
    matters to a reader of them (``make_agent``'s arguments): a spawning agent with every optional
    field null, a running one with all of them set, an ended one with an address it no longer
    shows."""
    return [
        (AgentState.SPAWNING, {}),
        (
            AgentState.RUNNING,
            {
                "labels": ["linux", "x64", "kici:auto"],
                "ip": "10.77.0.9",
                "bound_job_id": "job-7",
                "warm": True,
                "active_jobs": 2,
                "registered_at": timezone.now() - timedelta(minutes=3),
                "last_heartbeat": timezone.now() - timedelta(seconds=4),
            },
        ),
        (AgentState.DESTROYED, {"ip": "10.77.0.10", "labels": []}),
    ]
