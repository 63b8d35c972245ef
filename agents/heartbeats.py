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

#: Sent on the event publisher thread when an agent's row changed without an event (a heartbeat):
#: ``agent_id`` (str) and ``scaler_id`` (the scaler's pk); ``live.apps`` connects the push.
agent_row_changed = Signal()


def push_heartbeat_row(agent: Agent) -> None:
    """Announce ``agent``'s row as changed once the current transaction commits (in order with the
    event pushes). Needs only ``agent.agent_id`` and ``agent.scaler_id``: no query."""
    agent_id, scaler_id = agent.agent_id, agent.scaler_id
    push_after_commit(lambda: agent_row_changed.send(sender=Agent, agent_id=agent_id, scaler_id=scaler_id))
