"""Live console streams and event fan-out, bounded end to end (issue 7, SPEC (h) and (i)).

Pure asyncio; Django is imported only by :func:`publish_event` / :func:`apublish_event`.

Shape of a console stream, for one ``(agent_id, stream)`` key:

* one **pump** task, in exactly one process (the owner of a Redis lock with TTL renewal, see
  :class:`RedisTransport`), reads the source — a file (:func:`file_source`: the VM's
  ``serial-console.log`` / ``vmm.log``, through :class:`agents.tail.FileTail`) or docker logs
  (:func:`docker_log_source`) — numbers the lines (``seq`` 1, 2, … per *generation*; every start of
  a pump is a new generation), flags failure lines, keeps the last 500 in a ring and publishes
  them in batches (≤ 1,000 lines, ≤ 256 KiB of text);
* every process with viewers of the key listens to the group once and hands each batch to its
  local **viewers**; each viewer has its own bounded :class:`ViewerBuffer` (2,000 lines) which turns
  overflow, and any gap in ``seq`` (a batch lost anywhere), into one ``… N lines dropped`` row;
* the pump is started when the first viewer subscribes and cancelled when the last one (in any
  process) leaves.

:class:`ConsoleHub` holds that logic; a transport carries it: :class:`LocalTransport` (one process,
in memory: unit tests, single-process tools) or :class:`RedisTransport` (the Channels Redis layer
for batches, plain Redis keys for the lock, the ring and the viewer register).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import threading
import time
import uuid
from bisect import bisect_right
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import msgpack

from .tail import MAX_LINE_BYTES, MAX_QUEUED_LINES, DropMarker, FileTail, LineQueue, LineSplitter, SkipMarker

log = logging.getLogger(__name__)

RING_LINES = 500
"""Lines kept per stream for viewers that join late (issue 7)."""

VIEWER_BUFFER_LINES = 2000
"""Lines buffered per viewer before the oldest are replaced by a drop row."""

BATCH_LINES = 1000
"""Most lines in one published batch."""

BATCH_CHARS = 256 * 1024
"""Most characters of text in one published batch (a 64 KiB line still fits alone)."""

BACKLOG_BYTES = 256 * 1024
"""How much of an existing file a new pump reads before following it (the rest: download)."""

STALE_BATCH_SECONDS = 2.0
"""A batch older than this when it reaches a process is skipped there (the process is behind)."""

MAX_LAG_BYTES = 4 * 1024 * 1024
"""How far a console pump may fall behind a file before it skips ahead (``[skipped N bytes]``)."""

LEVEL_DEBUG = "debug"
LEVEL_ERROR = "error"
LEVEL_DROPPED = "dropped"

#: Serial-console fragments that make a line an error (SPEC (h), case-insensitive).
FAILURE_PATTERNS = (
    "Kernel panic",
    "Failed to execute /init",
    "failed to start",
    "systemd[1]: Failed",
    "VFS: Unable to mount root fs",
    "not syncing",
)
_FAILURE_RE = re.compile("|".join(map(re.escape, FAILURE_PATTERNS)), re.IGNORECASE)
_FAILURE_FOLDED = tuple(p.casefold() for p in FAILURE_PATTERNS)


def failure_indexes(texts: Sequence[str]) -> list[int]:
    """Indexes of the failure lines in ``texts``; one casefolded ``find`` per pattern on the
    whole batch first (a case-insensitive regex over 100 KB costs milliseconds)."""
    folded = "\n".join(texts).casefold()
    if not any(p in folded for p in _FAILURE_FOLDED):
        return []
    return [i for i, text in enumerate(texts) if _FAILURE_RE.search(text)]

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,80}$")


def is_failure_line(text: str) -> bool:
    """True when ``text`` contains one of :data:`FAILURE_PATTERNS` (SPEC (h), any case)."""
    return _FAILURE_RE.search(text) is not None


class Line(NamedTuple):
    """One console row: ``text``; ``seq`` (1-based within its generation); ``level``.

    ``level`` is ``"debug"`` (plain), ``"error"`` (a failure pattern, serial console only) or
    ``"dropped"`` (an in-band marker). A viewer drop row has ``dropped`` = how many lines it
    stands for and ``seq`` = the first of them; it is not a line of the stream. (A named tuple:
    hundreds of thousands are made per second.)
    """

    text: str
    seq: int
    level: str = LEVEL_DEBUG
    dropped: int = 0


def drop_row(count: int, seq: int = 0, noun: str = "lines") -> Line:
    """The ``… N lines dropped`` row a viewer gets instead of ``count`` lines it was too slow for."""
    return Line(f"… {count} {noun} dropped", seq, LEVEL_DROPPED, count)


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


# --- per-viewer buffer ---------------------------------------------------------------------------


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
        q = self._q
        if max_rows is None or max_rows >= len(q):
            rows = list(q)
            q.clear()
        else:
            popleft = q.popleft
            rows = [popleft() for _ in range(max_rows)]
        reset, self._reset = self._reset, False
        if not q:
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


# --- sources -----------------------------------------------------------------------------------

SourceFactory = Callable[[], AsyncIterator[Sequence[str]]]
"""A zero-argument callable returning an async iterator of line batches (lists of ``str``)."""


def file_source(
    path: str | os.PathLike,
    *,
    backlog_bytes: int = BACKLOG_BYTES,
    poll_interval: float = 0.1,
    max_lag_bytes: int | None = MAX_LAG_BYTES,
) -> SourceFactory:
    """A source following ``path`` with :class:`agents.tail.FileTail` (all of SPEC (i)'s caps).

    A new pump starts ``backlog_bytes`` before the end of the file (at the next line start) so a
    viewer sees the recent past at once; older content is for the download link. A missing file
    is waited for, never created (the spawn creates it).
    The tail is paced by the pump (nothing read is dropped); when the pump falls more than
    ``max_lag_bytes`` behind a flooding guest it skips ahead with a ``[skipped N bytes]`` marker
    (None: never skip).
    """

    def open_source() -> AsyncIterator[Sequence[str]]:
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            size = 0
        tail = FileTail(
            path,
            poll_interval=poll_interval,
            start_offset=max(0, size - backlog_bytes),
            pace=True,
            max_lag_bytes=max_lag_bytes,
            create=False,
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

    ``container``: a docker SDK ``Container``. ``tail``: how many existing lines to start with
    (``"all"`` for all). The blocking SDK stream runs in a thread; its bytes go through the same
    :class:`agents.tail.LineSplitter` (64 Ki-character cap, ``" [truncated]"``, stateful UTF-8)
    and a bounded :class:`agents.tail.LineQueue` (10,000 lines, ``[dropped N lines]`` marker), so a
    chatty container cannot grow this process. Ends when the container's log stream ends;
    closing the iterator closes the docker stream. Docker errors are raised from the iterator.
    """
    loop = asyncio.get_running_loop()
    splitter = LineSplitter(max_line)
    queue = LineQueue(max_queued)
    lock = threading.Lock()
    ready = asyncio.Event()
    state: dict[str, Any] = {"done": False, "error": None, "stream": None, "closed": False}

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # loop closed
            loop.call_soon_threadsafe(ready.set)

    def pump() -> None:
        try:
            stream = container.logs(stream=True, follow=True, stdout=True, stderr=True, tail=tail)
            state["stream"] = stream
            if state["closed"]:
                _close_stream(stream)
                return
            for chunk in stream:
                lines = splitter.feed(chunk)
                if lines:
                    with lock:
                        queue.extend(lines)
                    wake()
        except Exception as exc:  # noqa: BLE001 - handed to the async side
            if not state["closed"]:
                state["error"] = exc
        finally:
            with lock:
                queue.extend(splitter.flush())
            state["done"] = True
            wake()

    thread = threading.Thread(target=pump, name="docker-logs", daemon=True)
    thread.start()
    try:
        while True:
            await ready.wait()
            ready.clear()
            with lock:
                lines = queue.take()
            if lines:
                yield lines
            if state["done"]:
                with lock:
                    lines = queue.take()
                if lines:
                    yield lines
                if state["error"] is not None:
                    raise state["error"]
                return
    finally:
        state["closed"] = True
        if state["stream"] is not None:
            await asyncio.to_thread(_close_stream, state["stream"])


async def docker_log_lines(container: Any, **kwargs: Any) -> AsyncIterator[str]:
    """Follow a container's logs line by line; see :func:`docker_log_source` for the caps."""
    source = docker_log_source(container, **kwargs)
    try:
        async for batch in source:
            for line in batch:
                yield line
    finally:
        await source.aclose()


def docker_source(container: Any, **kwargs: Any) -> SourceFactory:
    """A :data:`SourceFactory` for :func:`docker_log_source`."""
    return lambda: docker_log_source(container, **kwargs)


def split_batches(texts: Sequence[str], max_lines: int = BATCH_LINES, max_chars: int = BATCH_CHARS) -> list[Sequence[str]]:
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


# --- transports ----------------------------------------------------------------------------------

Listener = Callable[[dict], None]


class Transport(Protocol):
    """What :class:`ConsoleHub` needs from the world (see :class:`LocalTransport`)."""

    async def listen(self, group: str, callback: Listener) -> None: ...
    async def unlisten(self, group: str, callback: Listener) -> None: ...
    async def acquire(self, key: StreamKey) -> bool: ...
    async def renew(self, key: StreamKey) -> bool: ...
    async def release(self, key: StreamKey) -> None: ...
    async def heartbeat(self, key: StreamKey, viewer_ids: Iterable[str]) -> None: ...
    async def leave(self, key: StreamKey, viewer_id: str) -> None: ...
    async def viewer_count(self, key: StreamKey, local: int) -> int: ...
    async def begin(self, key: StreamKey) -> int: ...
    async def publish_lines(self, key: StreamKey, message: dict) -> None: ...
    async def snapshot(self, key: StreamKey) -> tuple[int | None, list[Line]]: ...
    async def aclose(self) -> None: ...


def lines_from_message(message: dict) -> list[Line]:
    """The :class:`Line` list of a ``console.lines`` message (``seq``, ``texts``, ``marks``)."""
    first = message["seq"]
    texts = message["texts"]
    lines = list(map(Line, texts, range(first, first + len(texts))))
    for index, level in message.get("marks") or ():
        line = lines[index]
        lines[index] = Line(line.text, line.seq, level)
    return lines


def ring_blob(message: dict, keep: int = RING_LINES) -> tuple[bytes, int]:
    """The last ``keep`` lines of a ``console.lines`` message packed as one ring entry.

    Returns ``(blob, line_count)``; :func:`lines_from_blobs` reads them back.
    """
    texts = message["texts"]
    start = max(0, len(texts) - keep)
    marks = [[i - start, level] for i, level in message.get("marks") or () if i >= start]
    return msgpack.packb([message["seq"] + start, texts[start:], marks]), len(texts) - start


def lines_from_blobs(blobs: Iterable[bytes], keep: int = RING_LINES) -> list[Line]:
    """The last ``keep`` lines stored in ring entries (oldest entry first)."""
    lines: list[Line] = []
    for blob in blobs:
        first, texts, marks = msgpack.unpackb(blob)
        lines.extend(lines_from_message({"seq": first, "texts": texts, "marks": marks}))
    return lines[-keep:]


class LocalTransport:
    """Everything in this process: the ring in memory, ownership always granted.

    For unit tests and single-process use; a multi-process deployment needs
    :class:`RedisTransport`.
    """

    def __init__(self, ring_size: int = RING_LINES):
        self.ring_size = ring_size
        self._listeners: dict[str, list[Listener]] = {}
        self._rings: dict[StreamKey, deque[Line]] = {}
        self._gens: dict[StreamKey, int] = {}

    async def listen(self, group, callback):
        self._listeners.setdefault(group, []).append(callback)

    async def unlisten(self, group, callback):
        listeners = self._listeners.get(group, [])
        with contextlib.suppress(ValueError):
            listeners.remove(callback)
        if not listeners:
            self._listeners.pop(group, None)

    async def acquire(self, key):
        return True

    async def renew(self, key):
        return True

    async def release(self, key):
        return None

    async def heartbeat(self, key, viewer_ids):
        return None

    async def leave(self, key, viewer_id):
        return None

    async def viewer_count(self, key, local):
        return local

    async def begin(self, key):
        self._gens[key] = self._gens.get(key, 0) + 1
        self._rings[key] = deque(maxlen=self.ring_size)
        return self._gens[key]

    async def publish_lines(self, key, message):
        self._rings.setdefault(key, deque(maxlen=self.ring_size)).extend(lines_from_message(message))
        self.deliver(message)

    def deliver(self, message: dict) -> None:
        for callback in list(self._listeners.get(message.get("group"), ())):
            try:
                callback(message)
            except Exception:  # noqa: BLE001 - one broken listener must not starve the others
                log.exception("console listener failed")

    async def send_group(self, group: str, message: dict) -> None:
        self.deliver({**message, "group": group})

    async def snapshot(self, key):
        return self._gens.get(key), list(self._rings.get(key, ()))

    async def aclose(self):
        self._listeners.clear()


# Append one packed batch to the ring, then drop the oldest entries while the rest still holds
# at least ARGV[3] lines. KEYS: ring, counts. ARGV: blob, its line count, ring size, ttl seconds.
_RING_PUSH = """
redis.call('rpush', KEYS[1], ARGV[1])
redis.call('rpush', KEYS[2], ARGV[2])
local total = 0
for _, n in ipairs(redis.call('lrange', KEYS[2], 0, -1)) do total = total + tonumber(n) end
while true do
  local oldest = tonumber(redis.call('lindex', KEYS[2], 0))
  if oldest == nil or total - oldest < tonumber(ARGV[3]) then break end
  total = total - oldest
  redis.call('lpop', KEYS[2])
  redis.call('lpop', KEYS[1])
end
redis.call('expire', KEYS[1], ARGV[4])
redis.call('expire', KEYS[2], ARGV[4])
return total
"""
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


class RedisTransport:
    """Channels Redis layer + Redis keys: batches between processes, one pump per key cluster-wide.

    ``layer``: a Channels layer (``channels_redis``); ``redis``: a ``redis.asyncio.Redis`` client.
    One process-wide channel (``layer.new_channel()``) joins each group that has local listeners,
    so a batch crosses Redis once per process, not once per viewer. Keys (prefix
    ``kici:console:<agent_id>:<stream>:``): ``owner`` (lock: random token, ``lock_ttl`` seconds,
    renewed by the hub every ``lock_ttl / 3``), ``ring`` (the last batches, packed, holding at
    least the last ``ring_size`` lines; ``ring-counts`` their sizes), ``gen`` (generation counter), ``viewers`` (sorted set of viewer ids
    scored by expiry, refreshed by each process). The ring is written before the batch is sent,
    so a viewer that reads the snapshot after joining misses nothing.
    """

    def __init__(self, layer: Any, redis: Any, *, lock_ttl: float = 6.0, viewer_ttl: float = 15.0, ring_size: int = RING_LINES, prefix: str = "kici:console"):
        self.layer = layer
        self.redis = redis
        self.lock_ttl = lock_ttl
        self.viewer_ttl = viewer_ttl
        self.ring_size = ring_size
        self.prefix = prefix
        self.token = uuid.uuid4().hex
        self.channel: str | None = None
        self._listeners: dict[str, list[Listener]] = {}
        self._receiver: asyncio.Task | None = None
        self._start_lock = asyncio.Lock()
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)
        self._ring_push = redis.register_script(_RING_PUSH)

    def _key(self, key: StreamKey, what: str) -> str:
        return f"{self.prefix}:{key.agent_id}:{key.stream}:{what}"

    async def _ensure_channel(self) -> str:
        async with self._start_lock:
            if self.channel is None:
                self.channel = await self.layer.new_channel()
                self._receiver = asyncio.create_task(self._receive_loop(), name="console-relay")
        return self.channel

    async def _receive_loop(self) -> None:
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - Redis hiccup: retry, do not kill the relay
                log.warning("console relay: receive failed, retrying", exc_info=True)
                await asyncio.sleep(1)
                continue
            self.deliver(message)
            await asyncio.sleep(0)  # let the viewers' writers run between two batches

    def deliver(self, message: dict) -> None:
        for callback in list(self._listeners.get(message.get("group"), ())):
            try:
                callback(message)
            except Exception:  # noqa: BLE001
                log.exception("console listener failed")

    async def listen(self, group, callback):
        channel = await self._ensure_channel()
        listeners = self._listeners.setdefault(group, [])
        if not listeners:
            await self.layer.group_add(group, channel)
        listeners.append(callback)

    async def unlisten(self, group, callback):
        listeners = self._listeners.get(group)
        if not listeners:
            return
        with contextlib.suppress(ValueError):
            listeners.remove(callback)
        if not listeners:
            del self._listeners[group]
            await self.layer.group_discard(group, self.channel)

    async def refresh_groups(self) -> None:
        """Re-join every listened group (Channels forgets memberships after ``group_expiry``)."""
        for group in list(self._listeners):
            await self.layer.group_add(group, self.channel)

    async def acquire(self, key):
        return bool(await self.redis.set(self._key(key, "owner"), self.token, nx=True, px=int(self.lock_ttl * 1000)))

    async def renew(self, key):
        return bool(await self._renew(keys=[self._key(key, "owner")], args=[self.token, int(self.lock_ttl * 1000)]))

    async def release(self, key):
        await self._release(keys=[self._key(key, "owner")], args=[self.token])

    async def heartbeat(self, key, viewer_ids):
        members = {f"{self.token}:{vid}": time.time() + self.viewer_ttl for vid in viewer_ids}
        if members:
            name = self._key(key, "viewers")
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zadd(name, members)
                pipe.expire(name, int(self.viewer_ttl) + 60)
                await pipe.execute()

    async def leave(self, key, viewer_id):
        await self.redis.zrem(self._key(key, "viewers"), f"{self.token}:{viewer_id}")

    async def viewer_count(self, key, local):
        name = self._key(key, "viewers")
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(name, "-inf", time.time())
            pipe.zcard(name)
            _, count = await pipe.execute()
        return int(count)

    async def begin(self, key):
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.incr(self._key(key, "gen"))
            pipe.expire(self._key(key, "gen"), 7 * 86400)
            pipe.delete(self._key(key, "ring"), self._key(key, "ring-counts"))
            gen, _, _ = await pipe.execute()
        return int(gen)

    async def publish_lines(self, key, message):
        blob, count = ring_blob(message, self.ring_size)
        await self._ring_push(keys=[self._key(key, "ring"), self._key(key, "ring-counts")], args=[blob, count, self.ring_size, 86400])
        await self.layer.group_send(message["group"], message)

    async def send_group(self, group: str, message: dict) -> None:
        await self.layer.group_send(group, {**message, "group": group})

    async def snapshot(self, key):
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.get(self._key(key, "gen"))
            pipe.lrange(self._key(key, "ring"), 0, -1)
            gen, blobs = await pipe.execute()
        return (int(gen) if gen is not None else None), lines_from_blobs(blobs, self.ring_size)

    async def aclose(self):
        if self._receiver is not None:
            self._receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._receiver
            self._receiver = None
        for group in list(self._listeners):
            with contextlib.suppress(Exception):
                await self.layer.group_discard(group, self.channel)
        self._listeners.clear()
        self.channel = None


# --- the hub -------------------------------------------------------------------------------------


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
    """Shares one pump per console stream among its viewers (issue 7); see the module docstring.

    ``transport``: :class:`LocalTransport` (default) or :class:`RedisTransport`.
    ``viewer_lines``: per-viewer buffer (2,000). ``batch_lines`` / ``batch_chars``: most lines /
    characters per published batch. ``tick``: seconds between ownership checks (lock renewal,
    viewer heartbeats, takeover of a dead owner's pump); a third of the lock TTL or less.

    A process that receives a batch more than :data:`STALE_BATCH_SECONDS` old skips it
    undecoded (counted in ``stale_batches``): a process that fell behind catches up at once, and
    its viewers get a drop row for the gap.

    ``subscribe(key, source, flag_failures=...)`` returns a :class:`Viewer` whose ``snapshot``
    holds up to 500 recent lines; ``unsubscribe(viewer)`` (idempotent) removes it, and the pump
    stops when no viewer is left anywhere. ``pump_task(key)`` exposes the running pump (tests).
    """

    def __init__(self, transport: Transport | None = None, *, viewer_lines: int = VIEWER_BUFFER_LINES, batch_lines: int = BATCH_LINES, batch_chars: int = BATCH_CHARS, tick: float = 2.0):
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
                except Exception:  # noqa: BLE001 - Redis hiccup: try again next tick
                    log.warning("console %s: keeper step failed", key.group, exc_info=True)
                async with self._lock:
                    if st.pump is None and not st.viewers:
                        if self._streams.get(key) is st:
                            del self._streams[key]
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
        """Read the source and publish numbered batches until cancelled or the source ends."""
        key = st.key
        seq = 0
        try:
            async with contextlib.aclosing(st.source()) as source:
                async for texts in source:
                    if not texts:
                        continue
                    head_marker = isinstance(texts[0], (DropMarker, SkipMarker))
                    for chunk in split_batches(texts, self.batch_lines, self.batch_chars):
                        marks = []
                        if head_marker:
                            marks.append([0, LEVEL_DROPPED])
                            head_marker = False
                        if st.flag_failures:
                            marks.extend([i, LEVEL_ERROR] for i in failure_indexes(chunk))
                        await self._publish(key, gen, seq + 1, list(chunk), marks)
                        seq += len(chunk)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - shown to the viewers instead of a silent stop
            log.warning("console %s: source failed: %s", key.group, exc)
            with contextlib.suppress(Exception):
                await self._publish(key, gen, seq + 1, [f"[console source failed: {exc}]"], [[0, LEVEL_ERROR]])
        st.finished = True

    async def _publish(self, key: StreamKey, gen: int, first: int, texts: list[str], marks: list) -> None:
        message = {"type": "console.lines", "group": key.group, "gen": gen, "seq": first, "texts": texts, "marks": marks, "ts": time.time()}
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
            with contextlib.suppress(Exception):
                await self.transport.unlisten(st.key.group, st.listener)
        self._streams.clear()


# --- events --------------------------------------------------------------------------------------

EVENTS_GLOBAL_GROUP = "events.global"


def events_agent_group(agent_id: str) -> str:
    """``events.agent.<agent_id>``: the group of one agent's timeline."""
    StreamKey(agent_id, "events")  # validates the id
    return f"events.agent.{agent_id}"


def event_groups(agent_ref: str | None) -> list[str]:
    groups = [EVENTS_GLOBAL_GROUP]
    if agent_ref:
        groups.append(events_agent_group(agent_ref))
    return groups


def event_message(event: Any) -> dict:
    """The ``event.message`` group message for a stored ``ScalerEvent``, rendered once here.

    ``{"type": "event.message", "event_id": pk, "agent_ref": id, "html": <agents.render
    .render_live_update(event)>}``. When rendering fails the message goes without ``html`` and
    each receiving process renders it from the database instead.
    """
    message = {"type": "event.message", "event_id": event.pk, "agent_ref": event.agent_ref or ""}
    try:
        from .render import render_live_update

        message["html"] = render_live_update(event)
    except Exception:  # noqa: BLE001 - the receivers can still render from the database
        log.warning("could not render event %s for the live push", event.pk, exc_info=True)
    return message


async def apublish_message(message: dict, groups: Iterable[str], layer: Any = None) -> None:
    """Send ``message`` to each of ``groups`` (the message gets a ``group`` field per group)."""
    if layer is None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
    for group in groups:
        await layer.group_send(group, {**message, "group": group})


async def apublish_event(event: Any, layer: Any = None) -> None:
    """Async :func:`publish_event` (for async producers)."""
    from asgiref.sync import sync_to_async

    message = await sync_to_async(event_message)(event)
    await apublish_message(message, event_groups(message["agent_ref"]), layer)


def publish_event(event: Any) -> None:
    """Push a stored ``ScalerEvent`` to ``events.global`` and ``events.agent.<agent_id>`` (sync).

    Called by ``agents.events.record_event`` after commit. Renders the live HTML once (see
    :func:`event_message`), then ``async_to_sync(channel_layer.group_send)`` per group. Raises
    whatever the channel layer raises (the caller logs it).
    """
    from asgiref.sync import async_to_sync

    message = event_message(event)
    async_to_sync(apublish_message)(message, event_groups(message["agent_ref"]))
