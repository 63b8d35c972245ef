"""Recording lifecycle events: stored in the database, then pushed live to browsers. Every producer
calls :func:`record_event`; the push happens after the transaction commits (a browser never sees a
rolled-back event), on a background publisher thread, so rendering and the channel layer stay off
a spawn's critical path. A process about to exit calls :func:`flush_events` (the rq worker does
after every job). The push is the receiver of :data:`event_committed`, connected by ``live``, so
this base app does not import it.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time

from django.db import transaction
from django.dispatch import Signal

from .choices import UNREGISTERED_STATES, EventType
from .models import Agent, ScalerEvent

log = logging.getLogger(__name__)

#: Events waiting to be pushed; beyond this the oldest pushes are dropped (the rows stay stored,
#: and a page load shows them).
MAX_PENDING_PUBLICATIONS = 10_000

#: Sent on the publisher thread for every committed event, in commit order (``event``: the
#: ``ScalerEvent``); ``live.apps`` connects the push to the browsers. What a receiver raises is
#: logged by the publisher, never raised to the producer.
event_committed = Signal()


def record_event(
    agent: Agent | None,
    type: str,
    detail: str = "",
    payload: dict | None = None,
    *,
    agent_ref: str = "",
    scaler_name: str = "",
) -> ScalerEvent:
    """Store one event (``type`` is an ``agents.choices.EventType`` value) and publish it on commit.

    The live push goes to the channel-layer groups ``events.global`` and ``events.agent.<agent_id>``
    (``live.publish.publish_event``, through :data:`event_committed`), from the publisher thread.
    """
    event = ScalerEvent.objects.create(
        agent=agent,
        agent_ref=agent.agent_id if agent else agent_ref,
        scaler_name=(agent.scaler.name if agent else scaler_name),
        type=type,
        detail=detail,
        payload=payload or {},
    )
    transaction.on_commit(lambda: _PUBLISHER.submit(event))
    return event


def record_connecting(agent: Agent, detail: str, payload: dict | None = None) -> ScalerEvent | None:
    """Record ``agent.connecting`` unless the agent registered. A fast agent can register before its
    backend reaches this step, so the row is locked (``SELECT ... FOR UPDATE``) and the event stored
    only while it is ``spawning`` or ``connecting`` and unregistered; the registration's own
    compare-and-swap then waits for this transaction, which keeps ``agent.connecting`` before
    ``agent.registered``. Returns the event, or None when nothing was stored.
    """
    with transaction.atomic():
        row = Agent.objects.select_for_update().filter(pk=agent.pk).values_list("state", "registered_at").first()
        if row is None or row[0] not in UNREGISTERED_STATES or row[1] is not None:
            return None
        return record_event(agent, EventType.CONNECTING, detail, payload)


def push_after_commit(push) -> None:
    """Run ``push()`` (a zero-argument callable doing a live push, e.g. an agent row update without
    an event, see ``agents.heartbeats``) on the publisher thread once the current transaction
    commits, in order with the event pushes. Its failures are logged, never raised."""
    transaction.on_commit(lambda: push_committed(push))


def push_committed(push) -> None:
    """Run ``push()`` on the publisher thread now, in order with the event pushes: for a change
    already committed (an ``on_commit`` callback, or a write on a connection of its own). No
    database access, so safe on an event loop. Its failures are logged, never raised."""
    _PUBLISHER.submit(push)


def flush_events(timeout: float = 5.0) -> bool:
    """Wait until every submitted event was pushed (or ``timeout`` seconds pass); True when drained."""
    return _PUBLISHER.flush(timeout)


def _publish_now(event: ScalerEvent) -> None:
    event_committed.send(sender=ScalerEvent, event=event)


class _Publisher:
    """One daemon thread pushing events in the order they were committed."""

    def __init__(self):
        self._reset()

    def _reset(self) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=MAX_PENDING_PUBLICATIONS)
        self._pending = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, event: ScalerEvent) -> None:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="kici-event-publisher", daemon=True)
                self._thread.start()
            self._pending += 1
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            log.warning("event publisher backlog full: %s is stored but not pushed live", getattr(event, "pk", event))
            self._done()

    def _done(self) -> None:
        with self._cond:
            self._pending -= 1
            if self._pending <= 0:
                self._cond.notify_all()

    def _run(self) -> None:
        from django.db import close_old_connections

        while True:
            event = self._queue.get()
            try:
                if callable(event):  # push_after_commit
                    event()
                else:
                    _publish_now(event)
            except Exception:  # a push failure must never fail the producer
                log.warning("could not publish %s", getattr(event, "pk", event), exc_info=True)
            finally:
                close_old_connections()
                self._done()

    def flush(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True


_PUBLISHER = _Publisher()
# A forked rq work-horse inherits the queue but not the thread: start afresh in the child.
os.register_at_fork(after_in_child=_PUBLISHER._reset)
