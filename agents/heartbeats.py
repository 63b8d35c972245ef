"""Live row updates for heartbeats: the dashboard's Heartbeat column follows the agents.

A heartbeat stores no event (one every 5 s per agent would drown the timeline), so by itself it
changed nothing on an open page, whose heartbeat ages then counted up from page load ("33s ago"
for an agent that beat 3 s ago). Now a heartbeat pushes the agent's row (the same
``dashboard/index.html#agent_oob`` partial as every live update) to ``events.global`` and
``events.agent.<agent_id>``, at most once per agent per :data:`ROW_PUSH_SECONDS` (and at once when
``activeJobs`` changed); between two pushes the browser's clock advances the age (static/js/kici.js).
The send to the groups is the receiver of :data:`agent_row_changed` (connected by the ``live`` app).
"""

from __future__ import annotations

from datetime import datetime

from django.dispatch import Signal

from .events import push_after_commit
from .models import Agent

#: At most one heartbeat row push per agent per this many seconds (agents beat every 5 s).
ROW_PUSH_SECONDS = 10

#: Sent on the event publisher thread with an agent's row update (``agent``; ``message``: the
#: :func:`agent_row_message`); ``live.apps`` connects the send to the agent's event groups.
agent_row_changed = Signal()


def row_push_due(previous: datetime | None, now: datetime, *, period: float = ROW_PUSH_SECONDS) -> bool:
    """True when a heartbeat at ``now`` should push the row: the agent never beat before, or
    ``previous`` lies in an earlier ``period``-second slot of the clock. Slots are shared by every
    process, so the throttle holds across console processes with no shared state: within one
    slot only the first heartbeat pushes (heartbeats every 5 s → one push every 10 s)."""
    if previous is None:
        return True
    return int(previous.timestamp() // period) != int(now.timestamp() // period)


def agent_row_message(agent) -> dict:
    """The group message of one agent row update: ``{"type": "event.message", "event_id": 0,
    "agent_ref", "html"}`` with the ``agent_oob`` upsert (no event row, no capacity cards)."""
    from django.template.loader import render_to_string

    html = render_to_string("dashboard/index.html#agent_oob", {"agent": agent}).strip()
    return {"type": "event.message", "event_id": 0, "agent_ref": agent.agent_id, "html": html}


def publish_agent_row(agent_pk: int) -> None:
    """Render the agent's row as it is now and send it to its event groups (sync; channel layer,
    through :data:`agent_row_changed`)."""
    agent = Agent.objects.select_related("scaler").filter(pk=agent_pk).first()
    if agent is None:
        return
    agent_row_changed.send(sender=Agent, agent=agent, message=agent_row_message(agent))


def push_heartbeat_row(agent_pk: int) -> None:
    """Queue :func:`publish_agent_row` on the event publisher thread (after commit)."""
    push_after_commit(lambda: publish_agent_row(agent_pk))
