"""What the database says about a scaler's agents, for the container sweeps and the registry probe."""

from __future__ import annotations

from agents.choices import ACTIVE_STATES, AgentState
from agents.models import Agent

from .orphans import TrackedAgent

#: Sentinel: answer ``is_registered`` from the agents table (registered_at set, running or draining).
FROM_DATABASE = object()


def db_tracked_agents(scaler) -> dict[str, TrackedAgent]:
    """Agents this console tracks for ``scaler`` (rows in spawning/running/draining/destroying), by id."""
    rows = Agent.objects.filter(scaler=scaler, state__in=ACTIVE_STATES).values_list(
        "agent_id", "state", "registered_at"
    )
    return {agent_id: TrackedAgent(state, registered_at is not None) for agent_id, state, registered_at in rows}


def db_registered_ids(agent_ids: list[str]) -> set[str]:
    """Of ``agent_ids``, those registered: ``registered_at`` set and state running or draining."""
    return set(
        Agent.objects.filter(
            agent_id__in=agent_ids, registered_at__isnull=False, state__in=[AgentState.RUNNING, AgentState.DRAINING]
        ).values_list("agent_id", flat=True)
    )
