"""``ws/events/`` and ``ws/agents/<agent_id>/events/``: the live event feeds."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import OrderedDict

from channels.db import database_sync_to_async
from django.template.loader import render_to_string

from live.publish import EVENTS_GLOBAL_GROUP, events_agent_group
from live.streams import Line, ViewerBuffer

from .flow import _flow_from_scope
from .frames import FALLBACK_TEMPLATE
from .hubs import get_console_hub
from .live import CLOSE_NOT_FOUND, FRAME_MAX_ROWS, _LiveConsumer

EVENT_BUFFER = 1000
"""Events buffered per viewer before the oldest become one drop row."""

_RENDER_CACHE_SIZE = 256
_render_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _rendered(event_id: int) -> asyncio.Future:
    """The live HTML of an event that came without it, rendered once per process."""
    loop = asyncio.get_running_loop()
    cache = _render_cache.setdefault(loop, OrderedDict())
    task = cache.get(event_id)
    if task is None:
        from live.render import render_live_update

        task = asyncio.ensure_future(database_sync_to_async(render_live_update)(event_id))
        cache[event_id] = task
        while len(cache) > _RENDER_CACHE_SIZE:
            cache.popitem(last=False)
    return task


class EventsConsumer(_LiveConsumer):
    """``ws/events/`` (all events) or ``ws/agents/<agent_id>/events/`` (one agent's timeline).

    Relays the ``event.message`` group messages of ``events.global`` /
    ``events.agent.<agent_id>`` (their ``html``), batched per frame, through a bounded buffer.
    """

    group: str | None = None
    buffer: ViewerBuffer | None = None

    async def connect(self):
        if not await self._allowed():
            return
        agent_id = self.scope["url_route"]["kwargs"].get("agent_id")
        try:
            self.group = events_agent_group(agent_id) if agent_id else EVENTS_GLOBAL_GROUP
        except ValueError:
            return await self._refuse(CLOSE_NOT_FOUND)
        self.flow = _flow_from_scope(self.scope)
        self.buffer = ViewerBuffer(EVENT_BUFFER, ordered=False, noun="events")
        await get_console_hub().transport.listen(self.group, self._on_event)
        await self.accept()
        self.writer = asyncio.create_task(self._write())

    def _on_event(self, message: dict) -> None:
        if message.get("type") != "event.message":
            return
        html = message.get("html")
        event_id = message.get("event_id") or 0
        if html is not None:
            self.buffer.push([Line(html, event_id, "event")])
        elif event_id:
            task = _rendered(event_id)
            task.add_done_callback(lambda t, event_id=event_id: self._on_rendered(t, event_id))

    def _on_rendered(self, task: asyncio.Future, event_id: int) -> None:
        if self.buffer is None or task.cancelled() or task.exception() is not None:
            return
        if task.result():
            self.buffer.push([Line(task.result(), event_id, "event")])

    async def _next_frame(self) -> str | None:
        rows, _ = await self.buffer.next_batch(FRAME_MAX_ROWS)
        parts = []
        for row in rows:
            if row.dropped:
                parts.append(render_to_string(f"{FALLBACK_TEMPLATE}#events_dropped", {"count": row.dropped}))
            else:
                parts.append(row.text)
        return "\n".join(parts) if parts else None

    async def disconnect(self, code):
        await self._stop_writer()
        if self.group is not None:
            group, self.group = self.group, None
            with contextlib.suppress(Exception):
                await get_console_hub().transport.unlisten(group, self._on_event)
