"""``ws/agents/<agent_id>/console/<stream>/``: one viewer of a console stream."""

from __future__ import annotations

import asyncio

from channels.db import database_sync_to_async

from live.consoles import console_source
from live.streams import StreamKey

from .flow import _flow_from_scope
from .frames import render_console_frame
from .hubs import get_console_hub
from .live import CLOSE_NOT_FOUND, FRAME_MAX_ROWS, _LiveConsumer


@database_sync_to_async
def _load_agent(agent_id: str):
    from ..models import Agent

    return Agent.objects.select_related("scaler").filter(agent_id=agent_id).first()


class ConsoleConsumer(_LiveConsumer):
    """One viewer of ``ws/agents/<agent_id>/console/<stream>/`` (see the module docstring)."""

    viewer = None

    async def connect(self):
        if not await self._allowed():
            return
        kwargs = self.scope["url_route"]["kwargs"]
        try:
            key = StreamKey(kwargs.get("agent_id", ""), kwargs.get("stream", ""))
        except ValueError:
            return await self._refuse(CLOSE_NOT_FOUND)
        agent = await _load_agent(key.agent_id)
        if agent is None:
            return await self._refuse(CLOSE_NOT_FOUND)
        try:
            source, flag_failures = console_source(agent, key.stream)
        except LookupError:
            return await self._refuse(CLOSE_NOT_FOUND)
        self.flow = _flow_from_scope(self.scope)
        # Subscribed before the socket opens: once the client sees it open, nothing is missed.
        self.viewer = await get_console_hub().subscribe(key, source, flag_failures=flag_failures)
        await self.accept()
        await self._send_frame(render_console_frame(self.viewer.snapshot, replace=True))
        self.writer = asyncio.create_task(self._write())

    async def _next_frame(self) -> str | None:
        rows, reset = await self.viewer.next_batch(FRAME_MAX_ROWS)
        if not rows and not reset:
            return None
        return render_console_frame(rows, replace=reset)

    async def disconnect(self, code):
        await self._stop_writer()
        if self.viewer is not None:
            viewer, self.viewer = self.viewer, None
            await get_console_hub().unsubscribe(viewer)
