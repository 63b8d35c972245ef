"""Where a console pump reads its lines from: a log file or a container's docker logs.

A source is a :data:`SourceFactory`: a zero-argument callable returning an async iterator of line
batches, with every cap of :mod:`lib.tail`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from lib.dockerlogs import CHECKPOINT_LINES, Checkpoint, LogMessages, MarkGone, Numberer, RedisCheckpoints, read_from
from lib.tail import (
    MAX_LINE_BYTES,
    MAX_QUEUED_LINES,
    DropMarker,
    FileTail,
    LineNumber,
    LineQueue,
    Opener,
    StampedText,
    lines_of,
    plain_open,
)

from .streams import RING_LINES

BACKLOG_BYTES = 256 * 1024
"""How much of an existing file a new pump reads before following it (the rest: download)."""

MAX_LAG_BYTES = 4 * 1024 * 1024
"""How far a console pump may fall behind a file before it skips ahead (``[skipped N bytes]``)."""

SourceFactory = Callable[[], AsyncIterator[Sequence[str]]]
"""A zero-argument callable returning an async iterator of line batches (lists of ``str``)."""


def file_source(
    path: str | os.PathLike,
    *,
    backlog_bytes: int = BACKLOG_BYTES,
    poll_interval: float = 0.1,
    max_lag_bytes: int | None = MAX_LAG_BYTES,
    opener: Opener = plain_open,
) -> SourceFactory:
    """A source following ``path`` with :class:`lib.tail.FileTail` (all of its caps).

    A new pump starts ``backlog_bytes`` before the end of the file (at the next line start) so a
    viewer sees the recent past at once; older content is for the download link. A missing file
    is waited for, never created (the spawn creates it).
    The tail is paced by the pump (nothing read is dropped); when the pump falls more than
    ``max_lag_bytes`` behind a flooding guest it skips ahead with a ``[skipped N bytes]`` marker
    (None: never skip). Lines are numbered by their place in the file (``lib.tail.LineNumber``).
    ``opener``: every open of the file (``lib.tail.Opener``); a VM's logs
    are opened without following links, and its refusal ends the stream with its message.
    """

    def open_source() -> AsyncIterator[Sequence[str]]:
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
) -> AsyncIterator[list[str]]:
    """Follow a container's logs (stdout and stderr) as batches of numbered, stamped lines.

    ``container``: a docker SDK ``Container``; ``checkpoints``: its console's
    (:class:`lib.dockerlogs.RedisCheckpoints`). Lines are :class:`lib.tail.StampedText`,
    numbered by their place in the container's output (``lib.dockerlogs``: counted from the latest
    checkpoint, or from the start of docker's kept log by the first reader, leaving checkpoints),
    each batch headed by the :class:`lib.tail.LineNumber` of its first line. The last ``backlog``
    lines docker holds come first, then the lines as they are written. Each stream has its own
    :class:`lib.tail.LineSplitter` (64 Ki-character cap, ``" [truncated]"``, stateful UTF-8).
    Lines wait in one bounded :class:`lib.tail.LineQueue` (10,000 lines): on overflow the oldest
    go, and the next batch's number jumps over them (the ``[dropped N lines]`` marker is left
    out, as for a file), so a chatty container cannot grow this process. The blocking docker
    requests and the Redis writes run in a thread. Ends when the container's log ends; closing the
    iterator closes the docker request. Docker errors are raised from the iterator.
    """
    loop = asyncio.get_running_loop()
    queue = LineQueue(max_queued)
    lock = threading.Lock()
    ready = asyncio.Event()
    closed = threading.Event()
    requests: list[LogMessages] = []
    errors: list[BaseException] = []
    done = [False]

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # loop closed
            loop.call_soon_threadsafe(ready.set)

    def push(lines: Sequence[StampedText]) -> None:
        if lines:
            with lock:
                queue.extend(list(lines))
            wake()

    def open_read(checkpoint, *, follow: bool, include_mark: bool = True):
        messages, iterator = read_from(container, checkpoint, follow=follow, include_mark=include_mark)
        with lock:
            requests.append(messages)
        if closed.is_set():
            messages.close()
            return iter(())
        return iterator

    def scan(checkpoint, numberer: Numberer):
        """Count what docker holds now from ``checkpoint`` on; the last ``backlog`` lines and the
        ``(stream, stamp)`` of the last message read."""
        recent: deque[StampedText] = deque(maxlen=backlog)
        last = None
        for stream, stamp, content in open_read(checkpoint, follow=False):
            last = (stream, stamp)
            recent.extend(numberer.feed(stream, stamp, content))
        return recent, last

    def save(numberer: Numberer) -> None:
        """Store the checkpoints ``numberer`` noted and the highest number it gave."""
        checkpoints.add(numberer.new_checkpoints)
        numberer.new_checkpoints.clear()
        checkpoints.set_top(numberer.next - 1)

    def run() -> None:
        numberer = None
        try:
            top = checkpoints.top()
            latest = checkpoints.at_or_before(max(1, top - backlog + 1))  # room for the backlog
            if latest is not None:
                try:
                    numberer = Numberer(latest.number, max_line=max_line)
                    recent, last = scan(latest, numberer)
                except MarkGone:  # rotated past it: number the kept log after every number given
                    numberer = None
            if numberer is None:
                numberer = Numberer(top + 1, max_line=max_line, checkpoint_first=True)
                recent, last = scan(None, numberer)
            save(numberer)
            push(recent)
            mark = Checkpoint(0, last[0], last[1].decode()) if last is not None else None
            try:
                follow = open_read(mark, follow=True, include_mark=False)
                first = next(follow, None)
            except MarkGone:  # rotated since the scan: go on with the kept log, checkpointed at once
                numberer.since_checkpoint = CHECKPOINT_LINES
                follow = open_read(None, follow=True)
                first = next(follow, None)
            noted = time.monotonic()
            message = first
            while message is not None:
                push(numberer.feed(*message))
                if numberer.new_checkpoints or time.monotonic() - noted > 1:
                    save(numberer)
                    noted = time.monotonic()
                message = next(follow, None)
            push(numberer.flush())
        except Exception as exc:  # noqa: BLE001 - handed to the async side
            if not closed.is_set():
                with lock:
                    errors.append(exc)
        finally:
            if numberer is not None:
                with contextlib.suppress(Exception):
                    save(numberer)
            with lock:
                done[0] = True
            wake()

    threading.Thread(target=run, name="docker-logs", daemon=True).start()
    try:
        while True:
            await ready.wait()
            ready.clear()
            with lock:
                lines = queue.take()
                finished = done[0]
            if lines and isinstance(lines[0], DropMarker):
                lines = lines[1:]  # the jump in numbers stands for it
            if lines:
                yield [LineNumber(lines[0].n), *lines]
            if finished:
                if errors:
                    raise errors[0]
                return
    finally:
        closed.set()
        with lock:
            opened = list(requests)
        for messages in opened:
            await asyncio.to_thread(_close_quietly, messages)


def _close_quietly(messages: LogMessages) -> None:
    with contextlib.suppress(Exception):
        messages.close()


async def docker_log_lines(container: Any, checkpoints: RedisCheckpoints, **kwargs: Any) -> AsyncIterator[StampedText]:
    """Follow a container's logs line by line; see :func:`docker_log_source` for the caps."""
    async with contextlib.aclosing(lines_of(docker_log_source(container, checkpoints, **kwargs))) as lines:
        async for line in lines:
            if line.__class__ is not LineNumber:
                yield line
