"""Following one log file on disk: the reader loop and the consumer's batches (SPEC (i)).

The I/O half of the tail; the caps live in :mod:`agents.tail.lines` and :mod:`agents.tail.queue`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

from .lines import MAX_LINE_BYTES, LineSplitter, lines_of
from .markers import SkipMarker
from .queue import MAX_QUEUED_LINES, LineQueue

MAX_READ_BYTES = 1024 * 1024
"""Largest slice read from the file per read, in bytes (SPEC (i))."""

POLL_INTERVAL = 0.1
"""Seconds between two looks at the file when no data is waiting (SPEC (i): 100 ms)."""


def _identity(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


class FileTail:
    """Follows one file: a reader task fills a :class:`LineQueue`, the consumer takes batches.

    ``path``: the file; created empty (append mode) if missing, its directory must exist
    (``FileNotFoundError`` otherwise). With ``create=False`` a missing file (or directory) is
    waited for instead, polled every ``poll_interval`` (a viewer must not create files in a
    VM's chroot). ``from_start``: read existing content (True) or only what
    is appended after the start (False). ``start_offset``: explicit byte offset to start at
    (overrides ``from_start``; the first, possibly partial, line is skipped when it is > 0).

    The reader looks at the file every ``poll_interval`` seconds; while data is waiting it reads
    slice after slice (``max_read`` bytes each) without sleeping. If the file shrinks below the
    read offset (truncation) it flushes the partial line and follows from offset 0; if the path
    now names another file (rotation: rename + create), it drains the old file to its end,
    flushes the partial line and follows the new file from its start. While the path is missing
    the old file keeps being read.

    ``pace=True`` (not the reference's behaviour; used by the console pump): the reader stops
    reading while half the queue is full and resumes when the consumer takes lines, so nothing
    is dropped and no CPU is spent on lines that would be dropped — the file is the buffer.
    With ``max_lag_bytes`` a paced reader that falls further behind than that jumps to
    ``max_lag_bytes / 2`` before the end (at the next line) and queues a :class:`SkipMarker`,
    so a flooding guest costs neither memory nor unbounded lag.

    Counters for tests and benches: ``reads`` (slices read), ``bytes_read``, ``offset`` (bytes
    consumed of the current file), ``rotations``, ``truncations``, ``splitter.peak_partial``,
    ``queue.dropped``, ``skipped_bytes``.
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
        self.create = create
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
            with open(self.path, "ab"):
                pass  # create if missing, like the reference (append, empty)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
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

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _push(self, lines: list[str]) -> None:
        if lines:
            self.queue.extend(lines)
            self._ready.set()

    async def _read_slice(self, size: int) -> bool:
        """Read one slice of the current file; True when more data is already waiting."""
        fd, offset = self._fd, self.offset
        length = min(self.max_read, size - offset)
        data = await asyncio.to_thread(os.pread, fd, length, offset)
        if not data:
            return False
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

    def _skip_ahead(self, size: int) -> None:
        """Paced and too far behind: jump to ``max_lag_bytes / 2`` before the end, next line."""
        target = size - self.max_lag_bytes // 2
        skipped = target - self.offset
        self.offset = target
        self.skipped_bytes += skipped
        self.splitter.flush()  # the cut partial line is part of what is skipped
        self.splitter._skipping = True
        self._push([SkipMarker(skipped)])

    async def _poll_once(self) -> bool:
        """Look at the file once, read at most one slice; True when more data is waiting."""
        size = os.fstat(self._fd).st_size
        if self.max_lag_bytes is not None and size - self.offset > self.max_lag_bytes and not self.queue:
            self._skip_ahead(size)
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
            return True
        if size < self.offset:
            self._push(self.splitter.flush())
            self.offset = 0
            self.truncations += 1
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
    ) -> AsyncIterator[list[str]]:
        """Yield lists of lines (never empty) as they arrive, until ``stop`` is set.

        On stop: what is queued is yielded, then the partial line (SPEC (i) "Abort"). Breaking
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
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                raise reader.exception()
            last = self.queue.take() + self.splitter.flush()
            if last:
                yield last
        finally:
            if not reader.done():
                reader.cancel()
                try:
                    await reader
                except (asyncio.CancelledError, Exception):
                    pass
            self._close()


async def tail_file(
    path: str | os.PathLike,
    *,
    stop: asyncio.Event | None = None,
    poll_interval: float = POLL_INTERVAL,
    from_start: bool = True,
) -> AsyncIterator[str]:
    """Yield the complete lines appended to ``path`` until ``stop`` is set (seed file-tail.d.ts).

    ``path``: file to follow; created empty if missing (its directory must exist:
    ``FileNotFoundError``). ``stop``: when set, the tail stops watching, yields what is queued,
    then any remaining partial line, and ends (SPEC (i) "Abort"). ``poll_interval``: seconds
    between looks at the file (100 ms, SPEC (i)). ``from_start``: begin at offset 0 (the
    reference) or at the current end.

    Yields ``str`` lines without their newline; empty lines are skipped; over-long lines end in
    ``" [truncated]"``; when the consumer falls more than 10,000 lines behind, the oldest are
    dropped and a :class:`DropMarker` (``"[dropped N lines]"``, N cumulative) is yielded first.
    Invalid UTF-8 is replaced (U+FFFD), never raised. Truncation and replacement of the file are
    followed (see :class:`FileTail`).
    """
    tail = FileTail(path, poll_interval=poll_interval, from_start=from_start)
    async with contextlib.aclosing(lines_of(tail.batches(stop))) as lines:
        async for line in lines:
            yield line
