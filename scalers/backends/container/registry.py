"""What the database says about a scaler's agents, for the container sweeps and the registry probe."""

from __future__ import annotations

from agents.choices import ACTIVE_STATES, AgentState

#: Sentinel: wire ``is_registered`` to the agent registry in the database.
REGISTRY = object()


def db_tracked_ids(scaler) -> set[str]:
    """Agent ids this console tracks for ``scaler``: rows in spawning/running/draining/destroying."""
    from agents.models import Agent

    return set(Agent.objects.filter(scaler=scaler, state__in=ACTIVE_STATES).values_list("agent_id", flat=True))


def db_registered_ids(agent_ids: list[str]) -> set[str]:
    """Of ``agent_ids``, those registered: ``registered_at`` set and state running or draining."""
    from agents.models import Agent

    return set(
        Agent.objects.filter(
            agent_id__in=agent_ids, registered_at__isnull=False, state__in=[AgentState.RUNNING, AgentState.DRAINING]
        ).values_list("agent_id", flat=True)
    )
