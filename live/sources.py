"""Where a console pump reads its lines from: a log file or a container's docker logs.

A source is a :data:`SourceFactory`: a zero-argument callable returning an async iterator of line
batches, with every cap of :mod:`lib.tail`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from lib.tail import MAX_LINE_BYTES, MAX_QUEUED_LINES, FileTail, LineQueue, LineSplitter, Opener, lines_of, plain_open

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


def _close_stream(stream: Any) -> None:
    close = getattr(stream, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            close()


async def docker_log_source(
    container: Any,
    *,
    tail: int | str = RING_LINES,
    max_line: int = MAX_LINE_BYTES,
    max_queued: int = MAX_QUEUED_LINES,
) -> AsyncIterator[list[str]]:
    """Follow a container's logs (stdout and stderr) as batches of capped lines.

    ``container``: a docker SDK ``Container``. ``tail``: how many existing lines of each stream to
    start with (``"all"`` for all). Stdout and stderr are read as two docker streams, each through
    its own :class:`lib.tail.LineSplitter` (64 Ki-character cap, ``" [truncated]"``, stateful
    UTF-8), so a stderr line written while a stdout line is still open is never spliced into it;
    lines of the two streams interleave in arrival order. Both feed one bounded
    :class:`lib.tail.LineQueue` (10,000 lines, ``[dropped N lines]`` marker), so a chatty
    container cannot grow this process. The blocking SDK streams run in threads. Ends when both
    log streams end; closing the iterator closes the docker streams. Docker errors are raised from
    the iterator.
    """
    loop = asyncio.get_running_loop()
    queue = LineQueue(max_queued)
    lock = threading.Lock()
    ready = asyncio.Event()
    closed = threading.Event()
    streams: list[Any] = []
    errors: list[BaseException] = []
    running = [2]

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # loop closed
            loop.call_soon_threadsafe(ready.set)

    def pump(stdout: bool) -> None:
        splitter = LineSplitter(max_line)
        try:
            stream = container.logs(stream=True, follow=True, stdout=stdout, stderr=not stdout, tail=tail)
            with lock:
                streams.append(stream)
            if closed.is_set():
                _close_stream(stream)
                return
            for chunk in stream:
                lines = splitter.feed(chunk)
                if lines:
                    with lock:
                        queue.extend(lines)
                    wake()
        except Exception as exc:  # noqa: BLE001 - handed to the async side
            if not closed.is_set():
                with lock:
                    errors.append(exc)
        finally:
            with lock:
                queue.extend(splitter.flush())
                running[0] -= 1
            wake()

    for stdout in (True, False):
        name = "docker-logs-stdout" if stdout else "docker-logs-stderr"
        threading.Thread(target=pump, args=(stdout,), name=name, daemon=True).start()
    try:
        while True:
            await ready.wait()
            ready.clear()
            with lock:
                lines = queue.take()
                done = running[0] == 0
            if lines:
                yield lines
            if done:
                if errors:
                    raise errors[0]
                return
    finally:
        closed.set()
        with lock:
            opened = list(streams)
        for stream in opened:
            await asyncio.to_thread(_close_stream, stream)


async def docker_log_lines(container: Any, **kwargs: Any) -> AsyncIterator[str]:
    """Follow a container's logs line by line; see :func:`docker_log_source` for the caps."""
    async with contextlib.aclosing(lines_of(docker_log_source(container, **kwargs))) as lines:
        async for line in lines:
            yield line


def docker_source(container: Any, **kwargs: Any) -> SourceFactory:
    """A :data:`SourceFactory` for :func:`docker_log_source`."""
    return lambda: docker_log_source(container, **kwargs)
