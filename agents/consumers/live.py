"""What both live consumers share: the access check, refusals, flow control and the frame writer."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from .flow import _ack_count, _Flow

log = logging.getLogger(__name__)

CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404

FRAME_INTERVAL = 0.05
"""Seconds between two frames to one viewer (so at most 20 frames/s per viewer)."""

FRAME_MAX_ROWS = 500
"""Most rows in one frame; the rest wait in the viewer's bounded buffer."""


@database_sync_to_async
def _may_view(user) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.has_perm("agents.view_agent"))


class _LiveConsumer(AsyncWebsocketConsumer):
    """Common parts: access check, flow control, the writer task."""

    writer: asyncio.Task | None = None
    flow: _Flow | None = None

    async def _refuse(self, code: int) -> None:
        await self.accept()
        await self.close(code=code)

    async def _allowed(self) -> bool:
        if await _may_view(self.scope.get("user")):
            return True
        await self._refuse(CLOSE_FORBIDDEN)
        return False

    async def receive(self, text_data=None, bytes_data=None):
        if self.flow is not None:
            count = _ack_count(text_data)
            if count:
                self.flow.ack(count)

    async def _send_frame(self, text: str, *, reserved: bool = False) -> None:
        if self.flow is not None and not reserved:
            await self.flow.acquire()
        await self.send(text_data=text)

    async def _next_frame(self) -> str | None:
        raise NotImplementedError

    async def _write(self) -> None:
        try:
            while True:
                if self.flow is not None:
                    await self.flow.acquire()  # room first: meanwhile lines wait in the bounded buffer
                frame = await self._next_frame()
                if frame:
                    await self._send_frame(frame, reserved=True)
                elif self.flow is not None:
                    self.flow.ack(1)  # give the unused slot back
                await asyncio.sleep(FRAME_INTERVAL)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the socket is gone or rendering broke: end this viewer
            log.warning("live writer stopped", exc_info=True)
            with contextlib.suppress(Exception):
                await self.close(code=1011)

    async def _stop_writer(self) -> None:
        if self.writer is not None:
            self.writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.writer
            self.writer = None
