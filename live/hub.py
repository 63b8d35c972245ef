"""One pump per console stream shared among its viewers; see ``docs/live-streams.md``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from consolelog.tail import DropMarker, Entry, LineNumber, SkipMarker, StampedLine

from .sources import SourceFactory
from .streams import (
    BATCH_CHARS,
    BATCH_LINES,
    LEVEL_DROPPED,
    LEVEL_ERROR,
    VIEWER_BUFFER_LINES,
    Line,
    StreamKey,
    ViewerBuffer,
    failure_indexes,
    lines_from_message,
    split_batches,
)
from .transport import Listener, LocalTransport, Transport

log = logging.getLogger(__name__)

STALE_BATCH_SECONDS = 2.0
"""A batch older than this when it reaches a process is skipped there (the process is behind)."""


def _runs(texts: Sequence[Entry], numbered: bool) -> tuple[list, bool]:
    """``texts`` as ``(number, live_from, run)`` parts: each :class:`consolelog.tail.LineNumber` starts a
    part (``number``/``live_from`` from it; None for the part before the first). In a numbered
    stream (``numbered``, or once a number was seen) skip and drop markers are left out: the jump
    in numbers stands for them. Returns the parts and whether the stream is numbered."""
    if all(isinstance(text, str) for text in texts):
        return [(None, None, texts)], numbered
    parts: list = []
    current: list = []
    number = live_from = None
    for text in texts:
        if isinstance(text, LineNumber):
            if current or number is not None:
                parts.append((number, live_from, current))
            number, live_from, current, numbered = text.number, text.live_from, [], True
        elif numbered and isinstance(text, (DropMarker, SkipMarker)):
            continue
        else:
            current.append(text)
    parts.append((number, live_from, current))
    return parts, numbered


class Viewer:
    """One subscriber of a console stream: ``snapshot`` (the ring when it joined), then batches.

    ``await viewer.next_batch(max_rows)`` → ``(rows, reset)`` (see :class:`ViewerBuffer`).
    """

    def __init__(self, key: StreamKey, buffer: ViewerBuffer):
        self.key = key
        self.id = uuid.uuid4().hex
        self.buffer = buffer
        self.snapshot: list[Line] = []
        self.snapshot_gen: int | None = None

    async def next_batch(self, max_rows: int | None = None) -> tuple[list[Line], bool]:
        return await self.buffer.next_batch(max_rows)


@dataclass(eq=False)
class _Stream:
    key: StreamKey
    source: SourceFactory
    flag_failures: bool
    viewers: dict[str, Viewer] = field(default_factory=dict)
    pump: asyncio.Task | None = None
    keeper: asyncio.Task | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False  # the source ended or failed: do not restart while we own it
    listener: Listener | None = None
    rounds_started: int = 0
    rounds_done: int = 0
    progress: asyncio.Event = field(default_factory=asyncio.Event)


class ConsoleHub:
    """Shares one pump per console stream among its viewers (docs/live-streams.md, "One console stream").
    ``transport``: :class:`LocalTransport` (default) or :class:`RedisTransport`; ``viewer_lines``:
    per-viewer buffer (2,000); ``batch_lines``/``batch_chars``: the most per published batch; ``tick``:
    seconds between ownership checks, and stale batches are skipped (docs/console-log.md, "A stream's
    Redis keys"). ``subscribe(key, source, flag_failures=...)`` returns a :class:`Viewer` whose
    ``snapshot`` holds up to 500 recent lines; ``unsubscribe(viewer)`` (idempotent) removes it, and
    the pump stops when no viewer is left anywhere. ``pump_task(key)``: the running pump (tests).
    """

    def __init__(
        self,
        transport: Transport | None = None,
        *,
        viewer_lines: int = VIEWER_BUFFER_LINES,
        batch_lines: int = BATCH_LINES,
        batch_chars: int = BATCH_CHARS,
        tick: float = 2.0,
    ):
        self.transport = transport if transport is not None else LocalTransport()
        self.viewer_lines = viewer_lines
        self.batch_lines = batch_lines
        self.batch_chars = batch_chars
        self.tick = tick
        self._streams: dict[StreamKey, _Stream] = {}
        self._lock = asyncio.Lock()
        self.pumps_started = 0
        self.stale_batches = 0

    def pump_task(self, key: StreamKey) -> asyncio.Task | None:
        st = self._streams.get(key)
        return st.pump if st is not None else None

    def viewers(self, key: StreamKey) -> int:
        st = self._streams.get(key)
        return len(st.viewers) if st is not None else 0

    async def subscribe(self, key: StreamKey, source: SourceFactory, *, flag_failures: bool = False) -> Viewer:
        viewer = Viewer(key, ViewerBuffer(self.viewer_lines))
        async with self._lock:
            st = self._streams.get(key)
            if st is None:
                st = _Stream(key, source, flag_failures)
                st.listener = lambda message, st=st: self._on_message(st, message)
                self._streams[key] = st
                await self.transport.listen(key.group, st.listener)
                st.viewers[viewer.id] = viewer
                await self.transport.heartbeat(key, [viewer.id])
                if await self.transport.acquire(key):
                    await self._start_pump(st)
                st.keeper = asyncio.create_task(self._keep(st), name=f"console-keeper:{key.group}")
            else:
                st.viewers[viewer.id] = viewer
                await self.transport.heartbeat(key, [viewer.id])
        gen, lines = await self.transport.snapshot(key)
        viewer.snapshot, viewer.snapshot_gen = lines, gen
        viewer.buffer.start_after(gen, lines[-1].seq if lines else None)
        st.wake.set()
        return viewer

    async def unsubscribe(self, viewer: Viewer) -> None:
        st = self._streams.get(viewer.key)
        if st is None or st.viewers.pop(viewer.id, None) is None:
            return
        with contextlib.suppress(Exception):
            await self.transport.leave(viewer.key, viewer.id)
        if not st.viewers:
            # The last local viewer: let the keeper look now (it stops the pump when nobody is
            # left anywhere) and wait for that look, so a disconnect returns with the pump gone.
            await self._keeper_round(st)
        else:
            st.wake.set()

    async def _keeper_round(self, st: _Stream, timeout: float = 5.0) -> None:
        want = st.rounds_started + 1
        st.wake.set()
        keeper = st.keeper
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while st.rounds_done < want and keeper is not None and not keeper.done():
                    st.progress.clear()
                    await st.progress.wait()

    async def _start_pump(self, st: _Stream) -> None:
        gen = await self.transport.begin(st.key)
        st.finished = False
        st.pump = asyncio.create_task(self._pump(st, gen), name=f"console-pump:{st.key.group}")
        self.pumps_started += 1

    async def _stop_pump(self, st: _Stream) -> None:
        pump, st.pump = st.pump, None
        if pump is not None and not pump.done():
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump

    async def _keep(self, st: _Stream) -> None:
        key, transport = st.key, self.transport
        try:
            while True:
                st.wake.clear()  # a wake during this round makes the next one start at once
                st.rounds_started += 1
                try:
                    if st.viewers:
                        await transport.heartbeat(key, list(st.viewers))
                    if st.pump is not None:
                        if not await transport.renew(key):
                            log.warning("console %s: lost the pump lock, stopping the pump", key.group)
                            await self._stop_pump(st)
                        elif await transport.viewer_count(key, len(st.viewers)) == 0:
                            await self._stop_pump(st)
                            await transport.release(key)
                    if st.pump is None and st.viewers and await transport.acquire(key):
                        await self._start_pump(st)
                except asyncio.CancelledError:
                    raise
                except Exception:  # Redis hiccup: try again next tick
                    log.warning("console %s: keeper step failed", key.group, exc_info=True)
                async with self._lock:
                    if st.pump is None and not st.viewers:
                        if self._streams.get(key) is st:
                            del self._streams[key]
                        if st.listener is not None:
                            with contextlib.suppress(Exception):
                                await transport.unlisten(key.group, st.listener)
                        return
                st.rounds_done = st.rounds_started
                st.progress.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.tick):
                        await st.wake.wait()
        finally:
            st.rounds_done = st.rounds_started
            st.progress.set()
            if st.pump is not None:
                await self._stop_pump(st)
                with contextlib.suppress(Exception):
                    await transport.release(key)

    def _on_message(self, st: _Stream, message: dict) -> None:
        if message.get("type") != "console.lines" or not st.viewers:
            return
        if time.time() - message.get("ts", 0) > STALE_BATCH_SECONDS:
            # This process is behind: drop the batch undecoded so the backlog drains fast; the
            # viewers see the gap in seq as one "… N lines dropped" row.
            self.stale_batches += 1
            return
        lines = lines_from_message(message)
        gen = message["gen"]
        for viewer in list(st.viewers.values()):
            viewer.buffer.push(lines, gen)

    async def _pump(self, st: _Stream, gen: int) -> None:
        """Read the source and publish numbered batches until cancelled or the source ends.

        A numbered source (``consolelog.tail.LineNumber`` markers: a file, a container's docker logs)
        gives each line its number in the file or the container's output; its skip and drop
        markers are not published, the jump in numbers stands for them. Lines that carry their
        own time (``consolelog.tail.StampedLine``: docker's) are published with it. Any other source
        is numbered 1, 2, … from the start of the pump, markers included.
        """
        key = st.key
        seq = 0
        live_from = 0
        numbered = False
        try:
            async with contextlib.aclosing(st.source()) as source:
                async for texts in source:
                    if not texts:
                        continue
                    parts, numbered = _runs(texts, numbered)
                    for number, start, run in parts:
                        if number is not None:
                            seq, live_from = number - 1, start
                        head_marker = bool(run) and isinstance(run[0], (DropMarker, SkipMarker))
                        shown = [entry if isinstance(entry, str) else entry.text for entry in run]
                        offset = 0
                        for chunk in split_batches(shown, self.batch_lines, self.batch_chars) if shown else ():
                            marks = []
                            if head_marker:
                                marks.append([0, LEVEL_DROPPED])
                                head_marker = False
                            if st.flag_failures:
                                marks.extend([i, LEVEL_ERROR] for i in failure_indexes(chunk))
                            born = min(len(chunk), max(0, live_from - seq - 1))
                            stamps = None
                            entries = run[offset : offset + len(chunk)]
                            if isinstance(entries[0], StampedLine):  # each line knows its own time
                                born = len(chunk)
                                stamps = [e.ms if isinstance(e, StampedLine) else 0 for e in entries]
                            elif born:  # backlog: the times an earlier pump received it, if any
                                known = await self.transport.line_times(key, seq + 1, seq + 1 + born)
                                stamps = [known.get(n, 0) for n in range(seq + 1, seq + 1 + born)]
                            await self._publish(key, gen, seq + 1, list(chunk), marks, born, stamps)
                            seq += len(chunk)
                            offset += len(chunk)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - shown to the viewers instead of a silent stop
            log.warning("console %s: source failed: %s", key.group, exc)
            with contextlib.suppress(Exception):
                await self._publish(key, gen, seq + 1, [f"[console source failed: {exc}]"], [[0, LEVEL_ERROR]])
        st.finished = True

    async def _publish(
        self,
        key: StreamKey,
        gen: int,
        first: int,
        texts: list[str],
        marks: list,
        born: int = 0,
        stamps: list[int] | None = None,
    ) -> None:
        message = {
            "type": "console.lines",
            "group": key.group,
            "gen": gen,
            "seq": first,
            "texts": texts,
            "marks": marks,
            "ts": time.time(),
            "born": born,
        }
        if stamps:
            message["stamps"] = stamps
        await self.transport.publish_lines(key, message)

    async def aclose(self) -> None:
        """Stop every keeper and pump (tests, shutdown)."""
        for st in list(self._streams.values()):
            st.viewers.clear()
            if st.keeper is not None:
                st.keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await st.keeper
            await self._stop_pump(st)
            if st.listener is not None:
                with contextlib.suppress(Exception):
                    await self.transport.unlisten(st.key.group, st.listener)
        self._streams.clear()
