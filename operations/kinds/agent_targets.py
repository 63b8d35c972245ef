"""What the agent kinds (drain, destroy) share: the evidence of one agent row and the planning loop
over the scope's agent ids."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agents.models import Agent

from .base import Plan, Scope, Spared, age_seconds, is_registered


def agent_evidence(agent) -> dict:
    """The facts a drain or destroy decision rests on, for one agent row."""
    return {
        "state": agent.state,
        "registered": is_registered(agent),
        "active_jobs": agent.active_jobs,
        "bound_job": agent.bound_job_id or None,
        "warm": agent.warm,
        "managed_id": agent.managed_id or None,
        "ip": agent.ip,
        "owner_instance": agent.owner_instance or None,
        "age_seconds": age_seconds(agent.created_at),
        "last_heartbeat_seconds": age_seconds(agent.last_heartbeat),
    }


def plan_agents(scope: Scope, decide: Callable[[Plan, str, Any], None]) -> Plan:
    """A plan over ``scope.agent_ids``, in their order: an id with no agent row is spared ("no such
    agent"); every row found (scaler loaded, one query for all) goes to ``decide(plan, key, agent)``
    with ``key`` = ``agent:<agent_id>``, which adds the target or the spared entry."""
    result = Plan()
    agents = {a.agent_id: a for a in Agent.objects.filter(agent_id__in=scope.agent_ids).select_related("scaler")}
    for agent_id in scope.agent_ids:
        agent = agents.get(agent_id)
        key = f"agent:{agent_id}"
        if agent is None:
            result.spared.append(Spared(key, agent_id, "no such agent"))
        else:
            decide(result, key, agent)
    return result
