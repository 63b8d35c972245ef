"""Optional ``?flow=ack`` flow control of a live socket: at most :data:`ACK_WINDOW` frames in flight."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import parse_qs

ACK_WINDOW = 4
"""Frames in flight to a ``?flow=ack`` viewer."""


class _Flow:
    """The ``?flow=ack`` window: ``await acquire()`` before a frame, ``ack(n)`` on the client's word."""

    def __init__(self, window: int):
        self.window = window
        self.in_flight = 0
        self._changed = asyncio.Event()

    async def acquire(self) -> None:
        while self.in_flight >= self.window:
            self._changed.clear()
            await self._changed.wait()
        self.in_flight += 1

    def ack(self, count: int) -> None:
        self.in_flight = max(0, self.in_flight - max(0, count))
        self._changed.set()


def _flow_from_scope(scope) -> _Flow | None:
    query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
    return _Flow(ACK_WINDOW) if "ack" in query.get("flow", []) else None


def _ack_count(text_data: str | None) -> int:
    if not text_data:
        return 0
    if text_data.strip() == "ack":
        return 1
    try:
        data = json.loads(text_data)
    except ValueError:
        return 0
    if not isinstance(data, dict) or "ack" not in data:
        return 0
    try:
        return max(0, min(int(data["ack"]), 1000))
    except (TypeError, ValueError):
        return 1
