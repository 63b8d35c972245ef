"""Where a console pump reads its lines from: a log file or a container's docker logs.

A source is a :data:`SourceFactory`: a zero-argument callable returning an async iterator of line
batches, with every cap of :mod:`consolelog.tail`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

from consolelog.dockerlogs import (
    CHECKPOINT_LINES,
    Checkpoint,
    LogMessages,
    MarkGone,
    Numberer,
    RedisCheckpoints,
    read_from,
)
from consolelog.tail import (
    MAX_LINE_BYTES,
    MAX_QUEUED_LINES,
    DropMarker,
    Entry,
    FileTail,
    LineNumber,
    LineQueue,
    Opener,
    StampedLine,
    lines_of,
    plain_open,
)

from .streams import RING_LINES

BACKLOG_BYTES = 256 * 1024
"""How much of an existing file a new pump reads before following it (the rest: download)."""

MAX_LAG_BYTES = 4 * 1024 * 1024
"""How far a console pump may fall behind a file before it skips ahead (``[skipped N bytes]``)."""

SourceFactory = Callable[[], AsyncGenerator[Sequence[Entry], None]]
"""A zero-argument callable returning an async generator of line batches (lists of ``str``): the
hub closes it (``aclose``) when the pump stops."""


def file_source(
    path: str | os.PathLike,
    *,
    backlog_bytes: int = BACKLOG_BYTES,
    poll_interval: float = 0.1,
    max_lag_bytes: int | None = MAX_LAG_BYTES,
    opener: Opener = plain_open,
) -> SourceFactory:
    """A source following ``path`` with :class:`consolelog.tail.FileTail` (all of its caps), paced by the
    pump and numbered. A new pump starts ``backlog_bytes`` before the end (at a line start); a missing
    file is waited for, never created; a pump more than ``max_lag_bytes`` behind skips ahead with a
    ``[skipped N bytes]`` marker (None: never). ``opener``: every open of the file (a VM's logs are
    opened without following links; a refusal ends the stream with its message).
    """

    def open_source() -> AsyncGenerator[Sequence[Entry], None]:
        try:
            fd = opener(os.fspath(path), os.O_RDONLY)
        except FileNotFoundError:
            size = 0
        else:
            try:
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
        tail = FileTail(
            path,
            poll_interval=poll_interval,
            start_offset=max(0, size - backlog_bytes),
            pace=True,
            max_lag_bytes=max_lag_bytes,
            create=False,
            opener=opener,
            numbered=True,
        )
        return tail.batches()

    return open_source


async def docker_log_source(
    container: Any,
    checkpoints: RedisCheckpoints,
    *,
    backlog: int = RING_LINES,
    max_line: int = MAX_LINE_BYTES,
    max_queued: int = MAX_QUEUED_LINES,
) -> AsyncGenerator[list[Entry], None]:
    """Follow a container's logs (both streams) as batches of :class:`consolelog.tail.StampedLine`,
    numbered by their place in its output from ``checkpoints`` (docs/live-streams.md, "Line numbers and
    times"), each batch headed by its first line's :class:`consolelog.tail.LineNumber`: the last
    ``backlog`` lines first, then as written. One bounded queue (``max_queued``) drops the oldest on
    overflow, the next number jumping over them, so a chatty container cannot grow this process. The
    docker and Redis calls run in a thread; ends with the container's log; raises docker's errors.
    """
    reader = _DockerLogReader(
        asyncio.get_running_loop(), container, checkpoints, backlog=backlog, max_line=max_line, max_queued=max_queued
    )
    threading.Thread(target=reader.run, name="docker-logs", daemon=True).start()
    try:
        while True:
            await reader.ready.wait()
            reader.ready.clear()
            lines, finished = reader.take()
            if lines and isinstance(lines[0], DropMarker):
                lines = lines[1:]  # the jump in numbers stands for it
            if lines:
                yield [LineNumber(lines[0].n), *lines]
            if finished:
                if reader.errors:
                    raise reader.errors[0]
                return
    finally:
        for messages in reader.close():
            await asyncio.to_thread(_close_quietly, messages)


class _DockerLogReader:
    """The thread side of :func:`docker_log_source`: reads a container's log with blocking docker
    requests, numbers its lines, stores the checkpoints in Redis, and hands the lines to the event
    loop through a bounded queue (``ready`` is set on ``loop`` whenever there is news)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        container: Any,
        checkpoints: RedisCheckpoints,
        *,
        backlog: int,
        max_line: int,
        max_queued: int,
    ):
        self.loop = loop
        self.container = container
        self.checkpoints = checkpoints
        self.backlog = backlog
        self.max_line = max_line
        self.queue = LineQueue(max_queued)
        self.lock = threading.Lock()
        self.ready = asyncio.Event()
        self.closed = threading.Event()
        self.requests: list[LogMessages] = []
        self.errors: list[BaseException] = []
        self.done = False
        self.numberer: Numberer | None = None

    # ---- the event loop's side

    def take(self) -> tuple[list, bool]:
        """The lines queued so far, and whether the reader has finished."""
        with self.lock:
            return self.queue.take(), self.done

    def close(self) -> list[LogMessages]:
        """Tell the reader to stop; returns the docker requests it opened (the caller closes them)."""
        self.closed.set()
        with self.lock:
            return list(self.requests)

    # ---- the thread's side

    def run(self) -> None:
        """Read the backlog, then follow the log to its end. An error is kept for the event loop
        (unless closed); the checkpoints reached are saved either way."""
        try:
            recent, last = self._scan_backlog()
            self._save()
            self._push(recent)
            self._follow(last)
        except Exception as exc:  # noqa: BLE001 - handed to the async side
            if not self.closed.is_set():
                with self.lock:
                    self.errors.append(exc)
        finally:
            if self.numberer is not None:
                with contextlib.suppress(Exception):
                    self._save()
            with self.lock:
                self.done = True
            self._wake()

    def _scan_backlog(self) -> tuple[deque[StampedLine], tuple | None]:
        """Number from the latest checkpoint that leaves room for the backlog; without one, or when
        docker rotated past it, number the whole kept log after every number given. Returns the
        last ``backlog`` lines and the ``(stream, stamp)`` of the last message read."""
        top = self.checkpoints.top()
        latest = self.checkpoints.at_or_before(max(1, top - self.backlog + 1))  # room for the backlog
        if latest is not None:
            try:
                self.numberer = Numberer(latest.number, max_line=self.max_line)
                return self._scan(latest, self.numberer)
            except MarkGone:  # rotated past it: number the kept log after every number given
                self.numberer = None
        self.numberer = Numberer(top + 1, max_line=self.max_line, checkpoint_first=True)
        return self._scan(None, self.numberer)

    def _scan(self, checkpoint, numberer: Numberer) -> tuple[deque[StampedLine], tuple | None]:
        """Count what docker holds now from ``checkpoint`` on with ``numberer``; the last
        ``backlog`` lines and the ``(stream, stamp)`` of the last message read."""
        recent: deque[StampedLine] = deque(maxlen=self.backlog)
        last = None
        for stream, stamp, content in self._open_read(checkpoint, follow=False):
            last = (stream, stamp)
            recent.extend(numberer.feed(stream, stamp, content))
        return recent, last

    def _follow(self, last: tuple | None) -> None:
        """Follow the log after the last message scanned (``last``) to its end, saving checkpoints
        as they are noted and the top number at least every second."""
        numberer = self.numberer
        assert numberer is not None, "set by _scan_backlog, which runs first"
        mark = Checkpoint(0, last[0], last[1].decode()) if last is not None else None
        try:
            follow = self._open_read(mark, follow=True, include_mark=False)
            first = next(follow, None)
        except MarkGone:  # rotated since the scan: go on with the kept log, checkpointed at once
            numberer.since_checkpoint = CHECKPOINT_LINES
            follow = self._open_read(None, follow=True)
            first = next(follow, None)
        noted = time.monotonic()
        message = first
        while message is not None:
            self._push(numberer.feed(*message))
            if numberer.new_checkpoints or time.monotonic() - noted > 1:
                self._save()
                noted = time.monotonic()
            message = next(follow, None)
        self._push(numberer.flush())

    def _open_read(self, checkpoint, *, follow: bool, include_mark: bool = True):
        """A docker log request from ``checkpoint`` on, remembered for closing; empty when closed."""
        messages, iterator = read_from(self.container, checkpoint, follow=follow, include_mark=include_mark)
        with self.lock:
            self.requests.append(messages)
        if self.closed.is_set():
            messages.close()
            return iter(())
        return iterator

    def _save(self) -> None:
        """Store the checkpoints the numberer noted and the highest number it gave."""
        numberer = self.numberer
        assert numberer is not None, "set by _scan_backlog, which runs first"
        self.checkpoints.add(numberer.new_checkpoints)
        numberer.new_checkpoints.clear()
        self.checkpoints.set_top(numberer.next - 1)

    def _push(self, lines: Sequence[StampedLine]) -> None:
        """Queue ``lines`` for the event loop and wake it."""
        if lines:
            with self.lock:
                self.queue.extend(list(lines))
            self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # loop closed
            self.loop.call_soon_threadsafe(self.ready.set)


def _close_quietly(messages: LogMessages) -> None:
    with contextlib.suppress(Exception):
        messages.close()


async def docker_log_lines(container: Any, checkpoints: RedisCheckpoints, **kwargs: Any) -> AsyncIterator[StampedLine]:
    """Follow a container's logs line by line; see :func:`docker_log_source` for the caps."""
    async with contextlib.aclosing(lines_of(docker_log_source(container, checkpoints, **kwargs))) as lines:
        async for line in lines:
            if isinstance(line, StampedLine):  # the rest of a batch after its LineNumber
                yield line
