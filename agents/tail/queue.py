"""The bounded FIFO between a tail's reader and its consumer (SPEC (i)): pure, no I/O."""

from __future__ import annotations

from collections import deque

from .markers import DropMarker

MAX_QUEUED_LINES = 10000
"""Largest number of lines (marker included) waiting for the consumer (SPEC (i))."""


def take_oldest(q: deque, limit: int | None = None) -> list:
    """Remove and return up to ``limit`` (all if None) entries from the left of ``q``, oldest first.

    Shared by :meth:`LineQueue.take` and ``agents.streams.ViewerBuffer.pop_batch``.
    """
    if limit is None or limit >= len(q):
        out = list(q)
        q.clear()
        return out
    popleft = q.popleft
    return [popleft() for _ in range(limit)]


class LineQueue:
    """FIFO of at most ``maxlen`` lines with a single cumulative ``[dropped N lines]`` head marker.

    ``extend(lines)`` appends, then, if more than ``maxlen`` entries are held, drops the oldest so
    exactly ``maxlen`` remain, the first being a :class:`DropMarker` whose count is the number of
    real lines dropped since the queue was created (an existing head marker is replaced, not
    counted) — SPEC (i), CASES TAIL-10/11. O(1) amortised per line (a deque).
    """

    __slots__ = ("maxlen", "_q", "_has_marker", "dropped")

    def __init__(self, maxlen: int = MAX_QUEUED_LINES):
        if maxlen < 2:
            raise ValueError(f"maxlen must be >= 2 (room for the marker), got {maxlen!r}")
        self.maxlen = maxlen
        self._q: deque[str] = deque()
        self._has_marker = False
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:
        return bool(self._q)

    def snapshot(self) -> list[str]:
        """A copy of the queued entries, oldest first (for tests)."""
        return list(self._q)

    def extend(self, lines: list[str]) -> None:
        q = self._q
        if len(q) + len(lines) <= self.maxlen:
            q.extend(lines)
            return
        if self._has_marker:
            q.popleft()
            self._has_marker = False
        keep = self.maxlen - 1
        if len(lines) >= keep:
            self.dropped += len(q) + len(lines) - keep
            q.clear()
            q.extend(lines[len(lines) - keep :])
        else:
            q.extend(lines)
            excess = len(q) - keep
            self.dropped += excess
            popleft = q.popleft
            for _ in range(excess):
                popleft()
        q.appendleft(DropMarker(self.dropped))
        self._has_marker = True

    def take(self, limit: int | None = None) -> list[str]:
        """Remove and return up to ``limit`` (all if None) entries, oldest first."""
        if not self._q:
            return []
        out = take_oldest(self._q, limit)
        self._has_marker = False
        return out
