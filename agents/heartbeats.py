"""Live row updates for heartbeats: open pages follow the agents.

A heartbeat stores no event (one every 5 s per agent would drown the timeline), so by itself it
changes nothing on an open page. Every heartbeat therefore announces the agent's row as changed
(:data:`agent_row_changed`, after commit, on the event publisher thread); the ``live`` app connects
it to the row groups of the pages showing the agent, whose consumers batch the changed rows into at
most one frame per page per second (``live.rows``). Between two frames the browser's clock
advances the age (static/js/kici.js).
"""

from __future__ import annotations

from django.dispatch import Signal

from .events import push_after_commit
from .models import Agent

#: Sent on the event publisher thread when an agent's row changed without an event (a heartbeat,
#: an admission): ``agent_id`` (str), ``scaler_id`` (the scaler's pk) and ``capacity`` (True when
#: its scaler's capacity changed too); ``live.apps`` connects the push.
agent_row_changed = Signal()


def push_heartbeat_row(agent: Agent) -> None:
    """Announce ``agent``'s row as changed once the current transaction commits (in order with the
    event pushes). Needs only ``agent.agent_id`` and ``agent.scaler_id``: no query."""
    agent_id, scaler_id = agent.agent_id, agent.scaler_id
    push_after_commit(
        lambda: agent_row_changed.send(sender=Agent, agent_id=agent_id, scaler_id=scaler_id, capacity=False)
    )


def push_admitted_row(agent_id: str, scaler_id: int) -> None:
    """Announce a newly admitted agent's row (and its scaler's capacity) once the current
    transaction commits: admission stores no event, and an agent waiting for a spawn slot records
    none until it gets one, yet it holds a reservation and counts on every list."""
    push_after_commit(
        lambda: agent_row_changed.send(sender=Agent, agent_id=agent_id, scaler_id=scaler_id, capacity=True)
    )
