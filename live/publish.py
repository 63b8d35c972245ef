"""Pushing to the live pages' Channels groups: stored events (:func:`publish_event`), ``rows.dirty``
notices of changed rows, ids only (:func:`publish_rows`), and an operation's progress
(:func:`publish_progress`); consumers render from the database with the page's own partials, so
the markup cannot drift between the first render and a live update. Groups and the signals that
feed them: docs/live-streams.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Coroutine, Iterable
from typing import Any

from .render import render_live_update
from .rows import AGENTS_GROUP, OPERATIONS_GROUP, SCALERS_GROUP, agent_groups, agent_rows_group, scaler_rows_group
from .streams import StreamKey

log = logging.getLogger(__name__)

EVENTS_GLOBAL_GROUP = "events.global"
#: Seconds a synchronous push waits for the channel layer before it fails (TimeoutError).
PUSH_TIMEOUT_SECONDS = 10.0


class _LayerLoop:
    """One event loop on a daemon thread that runs every synchronous push of this process. The
    channel layer keeps its Redis connection per event loop, and ``async_to_sync`` called from a
    thread with no loop starts a new loop per call: a connection opened and dropped per push, half
    the CPU time of a heartbeat. Here the loop, and so the connection, lives as long as the process."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """No loop yet (also in a forked child, which inherits the object but not its thread)."""
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None

    def run(self, coro: Coroutine, timeout: float = PUSH_TIMEOUT_SECONDS) -> Any:
        """Run ``coro`` on the loop and return its result; raises what it raises, or TimeoutError."""
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.loop = asyncio.new_event_loop()
                self.thread = threading.Thread(target=self.loop.run_forever, name="kici-layer-loop", daemon=True)
                self.thread.start()
            loop = self.loop
        assert loop is not None, "the loop starts with its thread"
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)


_LAYER_LOOP = _LayerLoop()
# A forked rq work-horse inherits the loop object but not its thread: start afresh in the child.
os.register_at_fork(after_in_child=_LAYER_LOOP.reset)


def events_agent_group(agent_id: str) -> str:
    """``events.agent.<agent_id>``: the group of one agent's timeline."""
    StreamKey(agent_id, "events")  # validates the id
    return f"events.agent.{agent_id}"


def event_groups(agent_ref: str | None) -> list[str]:
    groups = [EVENTS_GLOBAL_GROUP]
    if agent_ref:
        groups.append(events_agent_group(agent_ref))
    return groups


def event_message(event: Any, render: bool | None = None) -> dict:
    """The ``event.message`` group message for a stored ``ScalerEvent``: ``{"type": "event.message",
    "event_id": pk, "agent_ref": id[, "html": ...]}``. Without ``html`` (also when rendering fails)
    each receiving console process renders the event from the database once. ``render`` defaults to
    ``settings.KICI_RENDER_EVENTS_AT_PUBLISH`` (False): rendering in the producer would put the
    template work on the spawn worker's critical path.
    """
    message = {"type": "event.message", "event_id": event.pk, "agent_ref": event.agent_ref or ""}
    if render is None:
        from django.conf import settings

        render = getattr(settings, "KICI_RENDER_EVENTS_AT_PUBLISH", False)
    if not render:
        return message
    try:
        message["html"] = render_live_update(event)
    except Exception:  # the receivers can still render from the database
        log.warning("could not render event %s for the live push", event.pk, exc_info=True)
    return message


async def apublish_message(message: dict, groups: Iterable[str], layer: Any = None) -> None:
    """Send ``message`` to each of ``groups`` (the message gets a ``group`` field per group)."""
    if layer is None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
    for group in groups:
        await layer.group_send(group, {**message, "group": group})


async def apublish_event(event: Any, layer: Any = None) -> None:
    """Async :func:`publish_event` (for async producers)."""
    from asgiref.sync import sync_to_async

    message = await sync_to_async(event_message)(event)
    await apublish_message(message, event_groups(message["agent_ref"]), layer)


def publish_event(event: Any) -> None:
    """Push a stored ``ScalerEvent`` to ``events.global`` and ``events.agent.<agent_id>`` (sync).

    Called by ``agents.events.record_event`` after commit. Renders the live HTML once (see
    :func:`event_message`), then the channel layer's ``group_send`` per group on the process's
    push loop. Raises whatever the channel layer raises (the caller logs it).
    """
    message = event_message(event)
    _LAYER_LOOP.run(apublish_message(message, event_groups(message["agent_ref"])))


def rows_notice(noun: str, keys: Iterable) -> dict:
    """``{"type": "rows.dirty", noun: [keys]}``: the rows ``keys`` (agent ids, operation or scaler
    pks) changed; each row view that shows ``noun`` renders them (``live.consumers.RowsConsumer``)."""
    return {"type": "rows.dirty", noun: list(keys)}


async def apublish_rows(notices: Iterable[tuple[str, dict]], layer: Any = None) -> None:
    """Send each ``(group, notice)``."""
    if layer is None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
    for group, notice in notices:
        await layer.group_send(group, notice)


def agent_row_notices(agent_id: str, scaler_pk: int, *, capacity: bool) -> list[tuple[str, dict]]:
    """The notices of one agent's changed row: to its row groups, and with ``capacity`` (a state
    or reservation may have changed) to ``rows.scalers`` for its scaler's row."""
    notice = rows_notice("agents", [agent_id])
    notices = [(group, notice) for group in agent_groups(agent_id, scaler_pk)]
    if capacity:
        notices.append((SCALERS_GROUP, rows_notice("scalers", [scaler_pk])))
    return notices


def publish_rows(notices: Iterable[tuple[str, dict]]) -> None:
    """:func:`apublish_rows` from sync code, on the process's push loop. Raises whatever the
    channel layer raises."""
    _LAYER_LOOP.run(apublish_rows(list(notices)))


def publish_committed_event(sender: Any, event: Any, **kwargs: Any) -> None:
    """Receiver of ``agents.events.event_committed``: :func:`publish_event`, then the agent's row
    and its scaler's row (an event marks a change of the agent)."""
    publish_event(event)
    if event.agent_id:
        agent = event.agent
        publish_rows(agent_row_notices(agent.agent_id, agent.scaler_id, capacity=True))


def agent_rows_notices(rows: dict[str, int], scalers: Iterable[int] = ()) -> list[tuple[str, dict]]:
    """The notices of several agents' changed rows (``rows``: agent id -> scaler pk), one per
    group: the agent list's, each scaler's with its agents, each agent's own page; and, for
    ``scalers`` whose capacity changed, one to ``rows.scalers`` for their rows."""
    by_scaler: dict[int, list[str]] = {}
    for agent_id, scaler_pk in rows.items():
        by_scaler.setdefault(scaler_pk, []).append(agent_id)
    notices = [(AGENTS_GROUP, rows_notice("agents", rows))]
    notices += [(scaler_rows_group(pk), rows_notice("agents", ids)) for pk, ids in by_scaler.items()]
    notices += [(agent_rows_group(agent_id), rows_notice("agents", [agent_id])) for agent_id in rows]
    if scalers := sorted(scalers):
        notices.append((SCALERS_GROUP, rows_notice("scalers", scalers)))
    return notices


def send_agent_rows(sender: Any, rows: dict[str, int], scalers: Iterable[int] = (), **kwargs: Any) -> None:
    """Receiver of ``agents.heartbeats.agent_rows_changed`` (heartbeats, admissions): the agents'
    rows and the changed scalers' rows (sync), in one call to the channel layer."""
    publish_rows(agent_rows_notices(rows, scalers))


def operation_group(operation_id: int) -> str:
    """``operation.<id>``: the group of one operation's page."""
    return f"operation.{operation_id}"


def publish_progress(
    operation_id: int, keys: Iterable[str] = (), log_from: int | None = None, log_to: int | None = None
) -> None:
    """Tell the operation's viewers that its status changed, that the targets ``keys`` have new
    outcomes, and that log entries ``[log_from:log_to]`` are new (the consumer renders exactly that
    slice from the database, so a notice handled late never repeats a line). Never raises: a push
    failure must not fail the producer."""
    try:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return
        _LAYER_LOOP.run(
            layer.group_send(
                operation_group(operation_id),
                {
                    "type": "operation.progress",
                    "operation_id": operation_id,
                    "keys": list(keys),
                    "log_from": log_from,
                    "log_to": log_to,
                },
            )
        )
    except Exception:
        log.warning("could not publish progress of operation %s", operation_id, exc_info=True)


def send_operation_progress(sender, operation_id: int, keys=(), log_from=None, log_to=None, **kwargs) -> None:
    """Receiver of ``operations.models.operation_progress``: :func:`publish_progress`, and the
    operation's row on ``/operations/`` (never raises)."""
    publish_progress(operation_id, keys, log_from, log_to)
    try:
        publish_rows([(OPERATIONS_GROUP, rows_notice("operations", [operation_id]))])
    except Exception:  # a push failure must not fail the producer
        log.warning("could not publish the row of operation %s", operation_id, exc_info=True)
