"""The per-viewer bounded buffer of a console or event stream (issue 7): pure, no I/O."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from live.tail import take_oldest

from .lines import Line, drop_row

VIEWER_BUFFER_LINES = 2000
"""Lines buffered per viewer before the oldest are replaced by a drop row."""


class ViewerBuffer:
    """What one viewer has not been sent yet: at most ``maxlen`` rows, oldest dropped first.

    ``push(lines, gen)`` appends a batch of :class:`Line` (ordered by ``seq``). With ``ordered``
    (console streams) it also ignores lines already seen, starts over on a newer generation
    (``pop_batch`` then reports ``reset``) and turns a gap in ``seq`` into a drop row. On
    overflow the oldest rows are removed and one drop row at the head counts them (merged with a
    drop row already there). Memory: ``maxlen`` rows plus one batch while it is being pushed.
    ``noun`` names what is dropped (``lines``, ``events``). ``dropped_total`` counts every line
    this viewer lost.
    """

    def __init__(self, maxlen: int = VIEWER_BUFFER_LINES, *, ordered: bool = True, noun: str = "lines"):
        if maxlen < 2:
            raise ValueError(f"maxlen must be >= 2, got {maxlen!r}")
        self.maxlen = maxlen
        self.ordered = ordered
        self.noun = noun
        self._q: deque[Line] = deque()
        self.gen: int | None = None
        self.last_seq: int | None = None
        self._reset = False
        self._ready = asyncio.Event()
        self.dropped_total = 0

    def __len__(self) -> int:
        return len(self._q)

    def _drop_row(self, count: int, seq: int) -> Line:
        return drop_row(count, seq, self.noun)

    def _append_gap(self, count: int, seq: int) -> None:
        self.dropped_total += count
        q = self._q
        if q and q[-1].dropped:
            count += q[-1].dropped
            seq = q[-1].seq
            q.pop()
        q.append(self._drop_row(count, seq))

    def push(self, lines: Sequence[Line], gen: int = 0) -> None:
        if not lines:
            return
        if self.ordered:
            if self.gen is None or gen > self.gen:
                if self.gen is not None:
                    self._q.clear()
                    self._reset = True
                self.gen, self.last_seq = gen, None
            elif gen < self.gen:
                return
            last = self.last_seq
            if last is not None:
                if lines[-1].seq <= last:
                    return
                if lines[0].seq <= last:
                    lines = [line for line in lines if line.seq > last]
                if lines[0].seq > last + 1:
                    self._append_gap(lines[0].seq - last - 1, last + 1)
            self.last_seq = lines[-1].seq
        self._q.extend(lines)
        self._trim()
        self._ready.set()

    def _trim(self) -> None:
        q = self._q
        if len(q) <= self.maxlen:
            return
        count = real = 0
        first_seq = q[0].seq
        popleft = q.popleft
        while len(q) > self.maxlen - 1:
            row = popleft()
            if row.dropped:
                count += row.dropped  # a gap or earlier drop row: already in dropped_total
            else:
                count += 1
                real += 1
        self.dropped_total += real
        q.appendleft(self._drop_row(count, first_seq))

    def start_after(self, gen: int | None, seq: int | None) -> None:
        """Anchor after a snapshot that ended at ``(gen, seq)``: drop what it already showed.

        A buffer already holding a newer generation keeps it and reports ``reset`` so the
        snapshot gets replaced; an older generation is discarded.
        """
        if not self.ordered or gen is None:
            return
        if self.gen is not None and self.gen > gen:
            self._reset = True
            self._ready.set()
            return
        if self.gen is None or self.gen < gen:
            self._q.clear()
            self.gen = gen
            self.last_seq = seq
            return
        if seq is None:
            return
        q = self._q
        while q and not q[0].dropped and q[0].seq <= seq:
            q.popleft()
        if self.last_seq is None or self.last_seq < seq:
            self.last_seq = seq
        if q and not q[0].dropped and q[0].seq > seq + 1:
            q.appendleft(self._drop_row(q[0].seq - seq - 1, seq + 1))

    def pop_batch(self, max_rows: int | None = None) -> tuple[list[Line], bool]:
        """Take up to ``max_rows`` rows (all if None); returns ``(rows, reset)``.

        ``reset`` is True once after a new generation replaced what the viewer has on screen:
        the rows then replace the view instead of being appended to it.
        """
        rows = take_oldest(self._q, max_rows)
        reset, self._reset = self._reset, False
        if not self._q:
            self._ready.clear()
        return rows, reset

    async def wait(self) -> None:
        """Return when rows (or a reset) are waiting."""
        while not self._q and not self._reset:
            self._ready.clear()
            await self._ready.wait()

    async def next_batch(self, max_rows: int | None = None) -> tuple[list[Line], bool]:
        """Wait for rows, then :meth:`pop_batch`."""
        await self.wait()
        return self.pop_batch(max_rows)
