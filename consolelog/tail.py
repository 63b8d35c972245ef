"""Bounded tail of an append-only log file. The guest of a microVM writes to its serial console
unprivileged, so every byte this module buffers is tenant-controlled: every buffer is bounded and
an overflow is reported in-band. The bounds, and the module's parts: docs/live-streams.md ("The
file tail's bounds")."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass

from .cap import (
    COUNT_CHUNK_BYTES,
    count_lines,
    cut_lines,
    data_start,
    kept_start,
    leading_cut,
    line_number_at,
    numbering_lock,
)


@dataclass(frozen=True, slots=True)
class DropMarker:
    """The in-band ``[dropped N lines]`` head marker of a :class:`LineQueue` that overflowed:
    ``dropped`` is N, cumulative. A type of its own rather than a text, so a guest printing
    ``[dropped 5 lines]`` itself is an ordinary line and cannot reset the count."""

    dropped: int

    @property
    def text(self) -> str:
        return f"[dropped {self.dropped} lines]"


@dataclass(frozen=True, slots=True)
class SkipMarker:
    """``[skipped N bytes]``: a :class:`FileTail` jumped over ``skipped`` bytes, either a paced
    tail (``pace=True, max_lag_bytes=...``) that had fallen that far behind, or the beginning of
    a file a cap freed under it (``consolelog.cap``); see :class:`FileTail`."""

    skipped: int

    @property
    def text(self) -> str:
        return f"[skipped {self.skipped} bytes]"


@dataclass(frozen=True, slots=True)
class LineNumber:
    """A zero-width marker of a numbered :class:`FileTail`: the next line is line ``number`` of
    the file (``consolelog.cap.line_number_at``); lines numbered below ``live_from`` were already
    in the file when the tail opened it. Never shown: the reader numbers the lines that follow
    from it."""

    number: int
    live_from: int = 0


@dataclass(frozen=True, slots=True)
class StampedLine:
    """A line of a source that knows its own number and time (a container's docker logs,
    ``consolelog.dockerlogs``): ``n``, its line number; ``ms``, docker's time of it (ms since the
    epoch). The console pump publishes ``ms`` as the line's time instead of the time it read it."""

    text: str
    n: int
    ms: int


#: One entry of a tail's stream: a plain line (``str``) or one of the tagged values above.
type Entry = str | DropMarker | SkipMarker | LineNumber | StampedLine


def shown_text(entry: Entry) -> str | None:
    """What a reader shows for ``entry``: a line's text, a marker's wording (``[dropped N
    lines]``), None for a :class:`LineNumber` (never shown)."""
    match entry:
        case str():
            return entry
        case LineNumber():
            return None
        case _:
            return entry.text


MAX_LINE_BYTES = 65536
"""Longest logical line kept intact, in decoded characters."""

TRUNCATED_SUFFIX = " [truncated]"


class LineSplitter:
    """Turns a byte stream into capped, non-empty lines; the partial line never exceeds the cap.

    ``feed(data)`` takes bytes (any size, any split point, invalid UTF-8 allowed: replaced with
    U+FFFD) and returns the complete lines they finish, as a list of ``str``. ``flush()`` returns
    the pending partial line (and any undecodable tail bytes as U+FFFD), if any, and resets.
    ``peak_partial`` records the largest partial line ever held, in characters, for tests and
    benches. Used by :class:`FileTail` and by the docker log source (``live.sources``).
    """

    __slots__ = ("max_line", "_decoder", "_partial", "_skipping", "peak_partial")

    def __init__(self, max_line: int = MAX_LINE_BYTES):
        if max_line < 1:
            raise ValueError(f"max_line must be >= 1, got {max_line!r}")
        self.max_line = max_line
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""
        self._skipping = False
        self.peak_partial = 0

    @property
    def skipping(self) -> bool:
        """True while discarding the rest of an over-long logical line."""
        return self._skipping

    @property
    def partial(self) -> str:
        return self._partial

    def feed(self, data: bytes | bytearray) -> list[str]:
        if self._skipping:
            newline = data.find(b"\n")
            if newline < 0:
                return []
            data = data[newline + 1 :]
            self._skipping = False
            self._decoder.reset()
        text = self._decoder.decode(data)
        if not text:
            return []
        parts = text.split("\n")
        if self._partial:
            parts[0] = self._partial + parts[0]
            self._partial = ""
        rest = parts.pop()
        cap = self.max_line
        if parts:
            lines = list(filter(None, parts))
            if lines and max(map(len, lines)) > cap:
                lines = [line if len(line) <= cap else line[:cap] + TRUNCATED_SUFFIX for line in lines]
        else:
            lines = []
        if len(rest) > cap:
            # Over-long partial: emit now, discard the remainder of this logical line.
            lines.append(rest[:cap] + TRUNCATED_SUFFIX)
            self._skipping = True
            self._decoder.reset()
        else:
            self._partial = rest
            if len(rest) > self.peak_partial:
                self.peak_partial = len(rest)
        return lines

    def flush(self) -> list[str]:
        tail = self._decoder.decode(b"", final=True)
        text = "" if self._skipping else self._partial + tail
        self._partial = ""
        self._skipping = False
        self._decoder.reset()
        if not text:
            return []
        if len(text) > self.max_line:
            text = text[: self.max_line] + TRUNCATED_SUFFIX
        return [text]


def _line_offset(fd: int, want: int, number: int, offset: int, size: int) -> int | None:
    """The offset where line ``want`` starts, scanning from ``offset`` (a line start, where line
    ``number`` starts) to ``size``; None when the file has no such line yet."""
    line_start = offset
    at_line_start = True
    while offset < size:
        data = os.pread(fd, min(COUNT_CHUNK_BYTES, size - offset), offset)
        if not data:
            return None
        last = data.rfind(b"\n")
        if last >= 0:
            data = data[: last + 1]  # whole lines only: the next chunk starts at a line start
        n = count_lines(data, at_line_start)
        if number + n <= want or last < 0:
            number += n
            if last >= 0:
                line_start = offset + len(data)
            offset += len(data)
            at_line_start = last >= 0
            continue
        pos = 0
        while True:
            newline = data.find(b"\n", pos)
            if newline > pos or (pos == 0 and not at_line_start):
                if number == want:
                    return line_start
                number += 1
            pos = newline + 1
            line_start = offset + pos
            at_line_start = True
    return line_start if number == want else None


def read_lines_before(fd: int, before: int, limit: int, max_line: int = MAX_LINE_BYTES) -> tuple[int, int, list[str]]:
    """Up to ``limit`` lines of ``fd`` numbered below ``before`` (numbers of
    ``consolelog.cap.line_number_at``; the lines a :class:`FileTail` shows, capped the same way).

    Returns ``(oldest, first, lines)``: the first line the file still holds (lines a cut freed
    are gone), the number of ``lines[0]`` (``before`` when there are none). Reads the file from
    its kept start in chunks of ``consolelog.cap.COUNT_CHUNK_BYTES``, so it costs a scan of the file
    and at most ``limit`` capped lines of memory. Raises ``OSError`` from reading."""
    with numbering_lock(fd):
        oldest = cut_lines(fd) + 1
        want = max(oldest, before - limit)
        if want >= before:
            return oldest, before, []
        size = os.fstat(fd).st_size
        offset = _line_offset(fd, want, oldest, kept_start(fd), size)
        if offset is None:
            return oldest, before, []
        splitter = LineSplitter(max_line)
        lines: list[str] = []
        need = before - want
        while offset < size and len(lines) < need:
            data = os.pread(fd, min(COUNT_CHUNK_BYTES, size - offset), offset)
            if not data:
                break
            offset += len(data)
            lines.extend(splitter.feed(data))
        if len(lines) < need:
            lines.extend(splitter.flush())
        return oldest, want, lines[:need]


def split_lines(chunks: Iterable[bytes], max_line: int = MAX_LINE_BYTES) -> list[str]:
    """Split a finite sequence of byte chunks with the tail's rules (cap, skip empties, flush).

    Convenience for tests and for callers holding a whole log in memory.
    """
    splitter = LineSplitter(max_line)
    out: list[str] = []
    for chunk in chunks:
        out.extend(splitter.feed(chunk))
    out.extend(splitter.flush())
    return out


async def lines_of(batches: AsyncGenerator[Sequence[Entry]]) -> AsyncGenerator[Entry]:
    """Yield each line of each batch of ``batches`` in order; closing this iterator (or ending
    it) closes ``batches`` too (:func:`tail_file`, ``live.sources.docker_log_lines``)."""
    try:
        async for batch in batches:
            for line in batch:
                yield line
    finally:
        await batches.aclose()


MAX_QUEUED_LINES = 10000
"""Largest number of lines (marker included) waiting for the consumer."""


def take_oldest(q: deque, limit: int | None = None) -> list:
    """Remove and return up to ``limit`` (all if None) entries from the left of ``q``, oldest first.

    Shared by :meth:`LineQueue.take` and ``live.streams.ViewerBuffer.pop_batch``.
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
    counted). O(1) amortised per line (a deque).
    """

    __slots__ = ("maxlen", "_q", "_has_marker", "dropped")

    def __init__(self, maxlen: int = MAX_QUEUED_LINES):
        if maxlen < 2:
            raise ValueError(f"maxlen must be >= 2 (room for the marker), got {maxlen!r}")
        self.maxlen = maxlen
        self._q: deque[Entry] = deque()
        self._has_marker = False
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:
        return bool(self._q)

    def snapshot(self) -> list[Entry]:
        """A copy of the queued entries, oldest first (for tests)."""
        return list(self._q)

    def extend(self, lines: Sequence[Entry]) -> None:
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

    def take(self, limit: int | None = None) -> list[Entry]:
        """Remove and return up to ``limit`` (all if None) entries, oldest first."""
        if not self._q:
            return []
        out = take_oldest(self._q, limit)
        self._has_marker = False
        return out


MAX_READ_BYTES = 1024 * 1024
"""Largest slice read from the file per read, in bytes."""

POLL_INTERVAL = 0.1
"""Seconds between two looks at the file when no data is waiting."""


def _identity(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


Opener = Callable[[str, int], int]
"""``opener(path, flags) -> fd``: how :class:`FileTail` opens its file (``flags`` are ``os.open``'s)."""


def plain_open(path: str, flags: int) -> int:
    """``os.open(path, flags | O_CLOEXEC, 0o644)``: the default :data:`Opener`."""
    return os.open(path, flags | os.O_CLOEXEC, 0o644)


class FileTail:
    """Follows one file: a reader task fills a :class:`LineQueue`, the consumer takes batches.
    ``path``: created empty if missing unless ``create=False`` (then waited for); ``from_start`` /
    ``start_offset``: where to begin; ``poll_interval``, ``max_read``: how often and how much it reads;
    ``pace``, ``max_lag_bytes``: the pump's back-pressure; ``numbered``: queue :class:`LineNumber`
    markers; ``opener`` (:data:`Opener`): every open goes through it. Truncation, rotation, cuts,
    pacing and the counters: docs/console-log.md ("Following a file").
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        poll_interval: float = POLL_INTERVAL,
        from_start: bool = True,
        start_offset: int | None = None,
        max_line: int = MAX_LINE_BYTES,
        max_read: int = MAX_READ_BYTES,
        max_queued: int = MAX_QUEUED_LINES,
        pace: bool = False,
        max_lag_bytes: int | None = None,
        create: bool = True,
        opener: Opener = plain_open,
        numbered: bool = False,
    ):
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        if max_read < 1:
            raise ValueError(f"max_read must be >= 1 byte, got {max_read!r}")
        if max_lag_bytes is not None and (not pace or max_lag_bytes < 2 * max_read):
            raise ValueError(
                f"max_lag_bytes needs pace=True and at least 2 * max_read ({2 * max_read}) bytes, got {max_lag_bytes!r}"
            )
        self.pace = pace
        self.numbered = numbered
        self._number_due = False
        self.create = create
        self.opener = opener
        self.max_lag_bytes = max_lag_bytes
        self.skipped_bytes = 0
        self._taken = asyncio.Event()
        self._stop: asyncio.Event | None = None
        self.path = os.fspath(path)
        self.poll_interval = poll_interval
        self.max_read = max_read
        self.splitter = LineSplitter(max_line)
        self.queue = LineQueue(max_queued)
        self.reads = 0
        self.bytes_read = 0
        self.rotations = 0
        self.truncations = 0
        self.cuts = 0
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None
        self.offset = 0
        self._from_start = from_start
        self._start_offset = start_offset
        self._ready = asyncio.Event()
        self._reader_done = False

    @property
    def identity(self) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of the file being followed (None before it was opened)."""
        return self._identity

    # -- file handling -------------------------------------------------------------------------

    def _open(self) -> bool:
        """Open the file (creating it when ``create``); False if it is missing and not created."""
        if self.create:
            os.close(self.opener(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT))  # create if missing, empty
        try:
            fd = self.opener(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if self.create:
                raise
            return False
        st = os.fstat(fd)
        self._fd, self._identity = fd, _identity(st)
        if self._start_offset is not None:
            self.offset = min(max(0, self._start_offset), st.st_size)
            if self.offset > 0 and os.pread(fd, 1, self.offset - 1) != b"\n":
                self.splitter._skipping = True  # mid-line: resume at the next line boundary
        else:
            self.offset = 0 if self._from_start else st.st_size
        return True

    def _open_fd(self) -> int:
        """The descriptor of the followed file, which the caller has opened (:meth:`_open`)."""
        assert self._fd is not None, "the followed file is not open"
        return self._fd

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _push(self, lines: Sequence[Entry]) -> None:
        if lines:
            self.queue.extend(lines)
            self._ready.set()

    async def _push_number(self, live: bool = False) -> None:
        """Queue the :class:`LineNumber` of the line at :attr:`offset` (``live``: and note where
        the file ended)."""
        fd, offset = self._open_fd(), self.offset

        def numbers() -> tuple[int, int]:
            with numbering_lock(fd):
                number = line_number_at(fd, offset)
                return number, (line_number_at(fd, os.fstat(fd).st_size) if live else 0)

        number, live_from = await asyncio.to_thread(numbers)
        self._number_due = False
        self._push([LineNumber(number, live_from)])

    async def _read_slice(self, size: int) -> bool:
        """Read one slice of the current file; True when more data is already waiting."""
        if self._number_due:
            await self._push_number()
        fd = self._open_fd()
        first = data_start(fd)
        offset = data_start(fd, self.offset)  # past a range a cap freed (consolelog.cap)
        if offset >= size:
            self._pass_cut(offset - self.offset)
            return False
        length = min(self.max_read, size - offset)
        data = await asyncio.to_thread(os.pread, fd, length, offset)
        if not data:
            return False
        if data_start(fd) != first:
            return True  # a cut raced the read (part of it may read as NUL bytes): read again
        cut = leading_cut(data, first)
        if offset + cut > self.offset:
            self._pass_cut(offset + cut - self.offset)
            data = data[cut:]
            if self._number_due:
                await self._push_number()
            if not data:
                return self.offset < size
        self.reads += 1
        self.bytes_read += len(data)
        self.offset += len(data)
        lines = self.splitter.feed(data)
        # One slice of short lines can exceed the queue cap by itself: hand it over in halves of
        # the cap and let a waiting consumer run in between, so only a consumer that really is
        # slower than the file loses lines.
        step = max(1, self.queue.maxlen // 2)
        for start in range(0, len(lines), step):
            chunk = lines[start : start + step] if len(lines) > step else lines
            if self.pace:
                await self._wait_for_room(len(chunk))
            elif start:
                await asyncio.sleep(0)
            self._push(chunk)
        return self.offset < size

    async def _wait_for_room(self, count: int) -> None:
        """Paced: wait until ``count`` more lines fit in the queue (or the tail is stopping)."""
        stop = self._stop
        while len(self.queue) + count > self.queue.maxlen and not (stop is not None and stop.is_set()):
            self._taken.clear()
            waiter = asyncio.ensure_future(self._taken.wait())
            stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
            try:
                await asyncio.wait({f for f in (waiter, stopper) if f is not None}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                if stopper is not None:
                    stopper.cancel()

    def _pass_cut(self, skipped: int) -> None:
        """Step over ``skipped`` bytes a cap freed (``consolelog.cap.cap_file``): the partial line is
        dropped (its rest is gone) and the next byte is a line start."""
        if skipped <= 0:
            return
        self.offset += skipped
        self.skipped_bytes += skipped
        self.cuts += 1
        self.splitter.flush()
        self._push([SkipMarker(skipped)])
        self._number_due = self.numbered

    def _skip_ahead(self, size: int, max_lag_bytes: int) -> None:
        """Paced and too far behind: jump to ``max_lag_bytes / 2`` before the end, next line."""
        target = size - max_lag_bytes // 2
        skipped = target - self.offset
        self.offset = target
        self.skipped_bytes += skipped
        self.splitter.flush()  # the cut partial line is part of what is skipped
        self.splitter._skipping = True
        self._push([SkipMarker(skipped)])
        self._number_due = self.numbered

    async def _poll_once(self) -> bool:
        """Look at the file once, read at most one slice; True when more data is waiting."""
        size = os.fstat(self._open_fd()).st_size
        if self.max_lag_bytes is not None and size - self.offset > self.max_lag_bytes and not self.queue:
            self._skip_ahead(size, self.max_lag_bytes)
        try:
            current = _identity(os.stat(self.path))
        except FileNotFoundError:
            current = None
        if current is not None and current != self._identity:
            if self.offset < size:
                return await self._read_slice(size)  # drain the old file first
            self._push(self.splitter.flush())
            self._close()
            self._start_offset = None
            self._from_start = True
            self._open()
            self.rotations += 1
            self._number_due = self.numbered
            return True
        if size < self.offset:
            self._push(self.splitter.flush())
            self.offset = 0
            self.truncations += 1
            self._number_due = self.numbered
        if size > self.offset:
            return await self._read_slice(size)
        return False

    async def run(self, stop: asyncio.Event) -> None:
        """Open the file and fill :attr:`queue` until ``stop`` is set (the reader loop).

        :meth:`batches` runs this as a task; tests and benches may run it alone to observe the
        queue without a consumer. Raises ``OSError`` from opening or reading the file.
        """
        self._stop = stop
        try:
            while self._fd is None and not self._open():
                # Not created by us and not there yet (a VM still spawning): look again later.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_interval):
                        await stop.wait()
                if stop.is_set():
                    return
            if self.numbered:
                await self._push_number(live=True)
            while not stop.is_set():
                if self.pace and len(self.queue) >= self.queue.maxlen // 2:
                    # Paced: the file is the buffer; wait for the consumer instead of dropping.
                    await self._wait_for_room(self.queue.maxlen // 2 + 1)
                    continue
                if await self._poll_once():
                    await asyncio.sleep(0)  # let the consumer run between slices
                    continue
                try:
                    async with asyncio.timeout(self.poll_interval):
                        await stop.wait()
                except TimeoutError:
                    pass
        finally:
            self._reader_done = True
            self._ready.set()
            self._close()

    # -- consumer side -------------------------------------------------------------------------

    async def batches(
        self, stop: asyncio.Event | None = None, *, max_lines: int | None = None
    ) -> AsyncGenerator[list[Entry]]:
        """Yield lists of lines (never empty) as they arrive, until ``stop`` is set.

        On stop: what is queued is yielded, then the partial line. Breaking
        out of the iteration (or cancelling) stops the reader and closes the file.
        ``max_lines`` caps one batch (None: everything queued).
        """
        stop = stop if stop is not None else asyncio.Event()
        if self.create:
            self._open()  # a missing directory fails here, at the first iteration
        reader = asyncio.create_task(self.run(stop), name=f"tail:{self.path}")
        try:
            while True:
                await self._ready.wait()
                self._ready.clear()
                while self.queue:
                    batch = self.queue.take(max_lines)
                    self._taken.set()
                    yield batch
                if self._reader_done:
                    break
            failure = reader.exception() if reader.done() and not reader.cancelled() else None
            if failure is not None:
                raise failure
            last = self.queue.take() + self.splitter.flush()
            if last:
                yield last
        finally:
            if not reader.done():
                reader.cancel()
                try:
                    await reader
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - a cancelled reader's last error is moot
                    pass
            self._close()


async def tail_file(
    path: str | os.PathLike,
    *,
    stop: asyncio.Event | None = None,
    poll_interval: float = POLL_INTERVAL,
    from_start: bool = True,
) -> AsyncIterator[Entry]:
    """Yield the complete lines appended to ``path`` (created empty if missing, in a directory that must
    exist: ``FileNotFoundError``) until ``stop`` is set, then what is queued and any partial line.
    ``poll_interval``: seconds between looks (100 ms); ``from_start``: begin at offset 0 or the end.
    Yields ``str`` lines without their newline and the in-band markers (docs/live-streams.md, "The
    file tail's bounds"); invalid UTF-8 is replaced (U+FFFD), never raised. Truncation and rotation
    are followed as :class:`FileTail` does.
    """
    tail = FileTail(path, poll_interval=poll_interval, from_start=from_start)
    async with contextlib.aclosing(lines_of(tail.batches(stop))) as lines:
        async for line in lines:
            yield line
