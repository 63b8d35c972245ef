"""Recording lifecycle events: stored in the database, then pushed live to browsers.

Every producer (rq jobs, API views, sweeps) calls :func:`record_event`; the push happens only
after the surrounding transaction commits, so a browser never sees an event that was rolled back.
"""

from __future__ import annotations

import logging

from django.db import transaction

from .models import Agent, ScalerEvent

log = logging.getLogger(__name__)


def record_event(agent: Agent | None, type: str, detail: str = "", payload: dict | None = None, *, agent_ref: str = "", scaler_name: str = "") -> ScalerEvent:
    """Store one event (``type`` is an ``agents.choices.EventType`` value) and publish it on commit.

    The live push goes to the channel-layer groups ``events.global`` and ``events.agent.<agent_id>``
    as ``{"type": "event.message", "event_id": <pk>}``; consumers render the row from the database
    with the same template partial as the page.
    """
    event = ScalerEvent.objects.create(
        agent=agent,
        agent_ref=agent.agent_id if agent else agent_ref,
        scaler_name=(agent.scaler.name if agent else scaler_name),
        type=type,
        detail=detail,
        payload=payload or {},
    )
    transaction.on_commit(lambda: _publish(event))
    return event


def _publish(event: ScalerEvent) -> None:
    try:
        from .streams import publish_event
    except ImportError:  # streams not installed yet in this build
        return
    try:
        publish_event(event)
    except Exception:  # noqa: BLE001 - a push failure must never fail the producer
        log.warning("could not publish event %s", event.pk, exc_info=True)
