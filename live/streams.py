"""What a console stream carries, pure (no I/O): lines, their levels and keys, failure flags, batch
cutting, the ``console.lines`` message with its packed ring entries, and the per-viewer buffer.

A :class:`Line` is one console row; :class:`StreamKey` names a console stream and its Channels
group; :func:`failure_indexes` flags serial-console failure lines; :func:`split_batches` cuts a
run of texts into publishable batches; :func:`ring_blob` / :func:`lines_from_blobs` pack and read
the ring that keeps a stream's recent lines; :class:`ViewerBuffer` holds what one viewer has not
been sent yet. See ``docs/live-streams.md`` for how the parts fit together.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import msgpack

from consolelog.tail import take_oldest
from scalers.backends.firecracker.failure import FAILURE_PATTERNS

BATCH_LINES = 1000
"""Most lines in one published batch."""

BATCH_CHARS = 256 * 1024
"""Most characters of text in one published batch (a 64 KiB line still fits alone)."""

LEVEL_DEBUG = "debug"
LEVEL_ERROR = "error"
LEVEL_DROPPED = "dropped"

_FAILURE_RE = re.compile("|".join(map(re.escape, FAILURE_PATTERNS)), re.IGNORECASE)
_FAILURE_FOLDED = tuple(p.casefold() for p in FAILURE_PATTERNS)


def failure_indexes(texts: Sequence[str]) -> list[int]:
    """Indexes of the failure lines in ``texts``; one casefolded ``find`` per pattern on the
    whole batch first (a case-insensitive regex over 100 KB costs milliseconds)."""
    folded = "\n".join(texts).casefold()
    if not any(p in folded for p in _FAILURE_FOLDED):
        return []
    return [i for i, text in enumerate(texts) if _FAILURE_RE.search(text)]


def is_failure_line(text: str) -> bool:
    """True when ``text`` contains one of :data:`FAILURE_PATTERNS` (any case)."""
    return _FAILURE_RE.search(text) is not None


class Line(NamedTuple):
    """One console row: ``text``; ``seq`` (its line number); ``level`` ``"debug"``, ``"error"`` (a
    failure pattern, serial console only) or ``"dropped"`` (an in-band marker); ``ts``, when the
    console received it (seconds since the epoch; 0: unknown). A viewer's drop row has ``dropped``,
    the lines it stands for, from ``seq``. A named tuple: hundreds of thousands are made per second.
    """

    text: str
    seq: int
    level: str = LEVEL_DEBUG
    dropped: int = 0
    ts: float = 0.0


def console_row(line: Line) -> list:
    """One console row as the page's script reads it: ``[number, ms, text]`` plus a kind, ``"e"``
    (a failure line), ``"m"`` (an in-band marker) or ``"g"`` with a count (that many lines, from
    ``number`` on, did not reach this viewer). ``ms``: receive time, 0 when unknown."""
    row = [line.seq, round(line.ts * 1000), line.text]
    if line.dropped:
        row += ["g", line.dropped]
    elif line.level == LEVEL_ERROR:
        row.append("e")
    elif line.level == LEVEL_DROPPED:
        row.append("m")
    return row


def drop_row(count: int, seq: int = 0, noun: str = "lines") -> Line:
    """The ``… N lines dropped`` row a viewer gets instead of ``count`` lines it was too slow for."""
    return Line(f"… {count} {noun} dropped", seq, LEVEL_DROPPED, count)


_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,80}$")


@dataclass(frozen=True, slots=True)
class StreamKey:
    """``(agent_id, stream)``; both ``[A-Za-z0-9_-]{1,80}``. ``group`` is the Channels group name."""

    agent_id: str
    stream: str

    def __post_init__(self):
        for name in ("agent_id", "stream"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _NAME_RE.match(value):
                raise ValueError(f"{name} must match [A-Za-z0-9_-]{{1,80}}, got {value!r}")

    @property
    def group(self) -> str:
        return f"console.{self.agent_id}.{self.stream}"


def split_batches(
    texts: Sequence[str], max_lines: int = BATCH_LINES, max_chars: int = BATCH_CHARS
) -> list[Sequence[str]]:
    """Cut ``texts`` into runs of at most ``max_lines`` lines and ``max_chars`` characters.

    A single line longer than ``max_chars`` travels alone. Order is kept.
    """
    if len(texts) <= max_lines and sum(map(len, texts)) <= max_chars:
        return [texts]
    out = []
    ends = list(itertools.accumulate(map(len, texts)))
    start, base = 0, 0
    n = len(texts)
    while start < n:
        stop = bisect_right(ends, base + max_chars, lo=start, hi=min(n, start + max_lines))
        stop = max(stop, start + 1)
        out.append(texts[start:stop])
        base = ends[stop - 1]
        start = stop
    return out


RING_LINES = 500
"""Lines kept per stream for viewers that join late."""


def lines_from_message(message: dict) -> list[Line]:
    """The :class:`Line` list of a ``console.lines`` message: ``seq`` (number of the first line),
    ``texts``, ``marks`` (``[index, level]``), ``ts`` (when it was read), ``born`` (how many of
    its first lines predate the pump) and ``stamps`` (their receive times in ms, when an earlier
    pump received them; 0: unknown)."""
    first = message["seq"]
    texts = message["texts"]
    ts = message.get("ts", 0.0)
    n = len(texts)
    born = min(message.get("born", 0), n)
    times: Iterator[float] = itertools.repeat(ts)
    if born:
        stamps = message.get("stamps") or [0] * born
        times = itertools.chain((ms / 1000 for ms in stamps[:born]), itertools.repeat(ts, n - born))
    lines = list(map(Line, texts, range(first, first + n), itertools.repeat(LEVEL_DEBUG), itertools.repeat(0), times))
    for index, level in message.get("marks") or ():
        line = lines[index]
        lines[index] = line._replace(level=level)
    return lines


def ring_blob(message: dict, keep: int = RING_LINES) -> tuple[bytes, int]:
    """The last ``keep`` lines of a ``console.lines`` message packed as one ring entry.

    Returns ``(blob, line_count)``; :func:`lines_from_blobs` reads them back.
    """
    texts = message["texts"]
    start = max(0, len(texts) - keep)
    marks = [[i - start, level] for i, level in message.get("marks") or () if i >= start]
    born = max(0, message.get("born", 0) - start)
    stamps = (message.get("stamps") or [])[start:]
    blob = msgpack.packb([message["seq"] + start, texts[start:], marks, message.get("ts", 0.0), born, stamps])
    return blob, len(texts) - start


def lines_from_blobs(blobs: Iterable[bytes], keep: int = RING_LINES) -> list[Line]:
    """The last ``keep`` lines stored in ring entries (oldest entry first)."""
    lines: list[Line] = []
    for blob in blobs:
        first, texts, marks, ts, born, stamps = msgpack.unpackb(blob)
        message = {"seq": first, "texts": texts, "marks": marks, "ts": ts, "born": born, "stamps": stamps}
        lines.extend(lines_from_message(message))
    return lines[-keep:]


VIEWER_BUFFER_LINES = 2000
"""Lines buffered per viewer before the oldest are replaced by a drop row."""


class ViewerBuffer:
    """What one viewer has not been sent yet: at most ``maxlen`` rows, oldest dropped first, one drop
    row at the head counting them. ``push(lines, gen)`` appends a batch ordered by ``seq``; with
    ``ordered`` (console streams) lines already seen are ignored, a newer generation starts over
    (``pop_batch`` reports ``reset``) and a gap in ``seq`` becomes a drop row. Memory: ``maxlen`` rows
    plus one batch. ``noun``: what is dropped; ``dropped_total``: every line this viewer lost.
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
