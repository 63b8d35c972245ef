"""HTML for live pushes, rendered from the same template partials as the pages.

The ``ws/events/`` and ``ws/agents/<id>/events/`` consumers receive ``{"type": "event.message",
"event_id": pk}`` group messages (see ``live.publish.event_message``) and send each client the string
:func:`render_live_update` returns. The htmx ``ws`` extension swaps every top-level element of that
string out of band; the page's ``kici-live`` extension (static/js/kici.js) first drops the elements
whose target the page does not have. Agent rows are not part of it: each page's row view pushes its
own (``live.rows``), so a page shows only the agents its filter selects.
"""

from __future__ import annotations

from django.template.loader import render_to_string

from agents.models import Agent, ScalerEvent
from scalers.capacity import global_capacity, scaler_capacities

from .rows import server_time

PAGE = "dashboard/index.html"


def render_live_update(event: ScalerEvent | int) -> str:
    """The WebSocket message for one stored event (a ScalerEvent or its pk); ``""`` if it is gone.
    Synchronous (database reads: call it through ``database_sync_to_async``). Its parts, each swapped
    out of band: the event row (``afterbegin:#event-rows``); for an agent's event the capacity cards
    of its scaler (``#cap-scaler-<pk>``) and the console (``#cap-global``); and
    ``<i data-server-time="ISO">``, the console's clock that kici.js counts ages on.
    """
    if not isinstance(event, ScalerEvent):
        found = ScalerEvent.objects.select_related("agent", "agent__scaler").filter(pk=event).first()
        if found is None:
            return ""
        event = found
    parts: list[str] = [render_to_string(f"{PAGE}#event_oob", {"event": event})]
    agent = None
    if event.agent_id:
        agent = Agent.objects.select_related("scaler").filter(pk=event.agent_id).first()
    if agent is not None:
        for cap in scaler_capacities([agent.scaler], pauses=True):
            parts.append(render_to_string(f"{PAGE}#cap_card", {"cap": cap, "oob": True}))
        parts.append(render_to_string(f"{PAGE}#cap_card", {"cap": global_capacity(), "oob": True}))
    parts.append(f'<i data-server-time="{server_time()}"></i>')
    return "\n".join(p.strip() for p in parts)
