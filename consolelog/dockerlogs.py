"""A container's console: its docker logs, each line numbered by its place in the container's output.
Docker keeps no line count, so the first reader counts and leaves sparse checkpoints in Redis
(every :data:`CHECKPOINT_LINES` lines), and later readers count from the nearest one, so every
reader gives a line the same number. Both streams come in one request, in docker's order, each with
its own splitter; a line's time is docker's stamp of its first message. Blocking: the readers run
in threads. Design: docs/live-streams.md ("Line numbers and times": container consoles).
"""

from __future__ import annotations

import calendar
import struct
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, NamedTuple

from .tail import MAX_LINE_BYTES, LineSplitter, StampedLine

CHECKPOINT_LINES = 1000
"""Lines between two checkpoints: what a reader counts at most before the lines it wants."""

CHECKPOINT_TTL_SECONDS = 7 * 86400
"""How long a container's checkpoints outlive their last write (refreshed by every write)."""

SINCE_MARGIN_NS = 100_000_000
"""How far before a checkpoint's timestamp a read starts (100 ms): docker takes a message's time
before it writes it, so two messages of the two streams may be written in the other order."""

STDOUT, STDERR = 1, 2


def stamp_ns(stamp: bytes | str, _seconds: dict = {}) -> int:  # noqa: B006 - a per-second cache
    """Nanoseconds since the epoch of a docker log timestamp (RFC 3339 in UTC,
    ``2026-12-01T18:59:55.123456789Z``); ValueError naming it when it is not one."""
    if isinstance(stamp, str):
        stamp = stamp.encode()
    head = stamp[:19]
    seconds = _seconds.get(head)
    try:
        if seconds is None:
            seconds = calendar.timegm(time.strptime(head.decode(), "%Y-%m-%dT%H:%M:%S"))
            if len(_seconds) > 4096:
                _seconds.clear()
            _seconds[head] = seconds
        if stamp[-1:] != b"Z":
            raise ValueError("not in UTC")
        fraction = stamp[20:-1] if stamp[19:20] == b"." else b""
        return seconds * 1_000_000_000 + int(fraction.ljust(9, b"0")[:9] or b"0")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"docker log timestamp {stamp!r} is not RFC 3339 in UTC: {exc}") from None


def _since(ns: int) -> str:
    """Docker's ``since``/``until`` form of ``ns``: ``seconds.nanoseconds``."""
    ns = max(ns, 1)
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


class Checkpoint(NamedTuple):
    """Reading a container's messages from the one of ``stream`` stamped ``stamp`` on, with no line
    open in either stream, the first line read is line ``number``."""

    number: int
    stream: int
    stamp: str

    def member(self) -> str:
        return f"{self.number} {self.stream} {self.stamp}"

    @classmethod
    def parse(cls, raw: bytes | str) -> Checkpoint:
        text = raw.decode() if isinstance(raw, bytes) else raw
        number, stream, stamp = text.split(" ")
        return cls(int(number), int(stream), stamp)


def checkpoint_keys(agent_id: str) -> tuple[str, str]:
    """The Redis keys of the checkpoints of agent ``agent_id``'s container console: its sorted set
    and its highest number, ``kici:console:<agent_id>:console:marks`` and ``...:top`` (in the key
    space of the console stream, ``live.transport.stream_key_name``)."""
    return f"kici:console:{agent_id}:console:marks", f"kici:console:{agent_id}:console:top"


class RedisCheckpoints:
    """The checkpoints of one container console in Redis (:func:`checkpoint_keys`), with a
    synchronous ``redis.Redis`` ``client`` (the readers run in threads): a sorted set of
    :meth:`Checkpoint.member` scored by line number, and the highest line number given so far,
    both expiring :data:`CHECKPOINT_TTL_SECONDS` after their last write."""

    def __init__(self, client: Any, agent_id: str):
        self.client = client
        self.marks, self.top_key = checkpoint_keys(agent_id)

    def latest(self) -> Checkpoint | None:
        found = self.client.zrevrange(self.marks, 0, 0)
        return Checkpoint.parse(found[0]) if found else None

    def at_or_before(self, number: int) -> Checkpoint | None:
        """The latest checkpoint at or before line ``number``, else the first one (None: none)."""
        found = self.client.zrevrangebyscore(self.marks, number, "-inf", start=0, num=1) or self.client.zrange(
            self.marks, 0, 0
        )
        return Checkpoint.parse(found[0]) if found else None

    def earliest(self) -> int:
        """The number of the first checkpoint (1 when there is none)."""
        found = self.client.zrange(self.marks, 0, 0)
        return Checkpoint.parse(found[0]).number if found else 1

    def starts(self, want: int, before: int) -> list[Checkpoint]:
        """Where to read lines ``[want, before)`` from: the latest checkpoint at or before
        ``want``, then the later ones below ``before`` (in case docker no longer holds the first)."""
        first = self.client.zrevrangebyscore(self.marks, want, "-inf", start=0, num=1)
        later = self.client.zrangebyscore(self.marks, f"({want}", f"({before}")
        return [Checkpoint.parse(raw) for raw in [*first, *later]]

    def add(self, checkpoints: list[Checkpoint]) -> None:
        if checkpoints:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.zadd(self.marks, {c.member(): c.number for c in checkpoints})
                pipe.expire(self.marks, CHECKPOINT_TTL_SECONDS)
                pipe.execute()

    def all(self) -> list[bytes]:
        """Every checkpoint, as stored (:meth:`Checkpoint.parse` reads one)."""
        return self.client.zrange(self.marks, 0, -1)

    def top(self) -> int:
        raw = self.client.get(self.top_key)
        return int(raw) if raw is not None else 0

    def set_top(self, number: int) -> None:
        self.client.set(self.top_key, number, ex=CHECKPOINT_TTL_SECONDS)


class LogMessages:
    """One docker logs request of ``container`` (both streams, with timestamps), iterated as ``(stream,
    stamp, content)``: ``stream`` 1 (stdout) or 2 (stderr), docker's ``stamp`` (bytes), the message's
    bytes (with its newline when it ends a line). ``since_ns``: only messages stamped then or later;
    ``follow``: keep reading. ``close()`` (any thread) ends the request. The SDK's ``Container.logs``
    drops each frame's stream, so this reads the frames itself. Raises the SDK's errors; ValueError for
    a container with a TTY (no stream in its frames).
    """

    def __init__(self, container: Any, *, follow: bool, since_ns: int | None = None):
        from docker.types import CancellableStream

        if (container.attrs.get("Config") or {}).get("Tty"):
            raise ValueError(f"container {container.name} has a TTY: its log does not say which stream a line is from")
        api = container.client.api
        params = {"stdout": 1, "stderr": 1, "timestamps": 1, "follow": int(follow), "tail": "all"}
        if since_ns is not None:
            params["since"] = _since(since_ns)
        response = api._get(api._url("/containers/{0}/logs", container.id), params=params, stream=True)
        api._raise_for_status(response)
        self._stream = CancellableStream(self._frames(response), response)

    @staticmethod
    def _frames(response) -> Iterator[tuple[int, bytes, bytes]]:
        raw = response.raw
        while True:
            header = raw.read(8)
            if len(header) < 8:
                return
            stream, length = struct.unpack(">BxxxL", header)
            if not length:
                continue
            data = raw.read(length)
            if len(data) < length:
                return
            stamp, _, content = data.partition(b" ")
            yield stream, stamp, content

    def __iter__(self):
        return self._stream

    def close(self) -> None:
        self._stream.close()


class Numberer:
    """Turns docker messages into :class:`consolelog.tail.StampedLine` lines numbered from ``number``,
    each stream through its own :class:`consolelog.tail.LineSplitter` (capped like every console line,
    empty lines skipped and not counted). Notes a :class:`Checkpoint` in ``new_checkpoints`` at
    the first message where no line is open once :data:`CHECKPOINT_LINES` lines were numbered
    since the last one (``checkpoint_first``: at the first message too)."""

    def __init__(self, number: int, *, max_line: int = MAX_LINE_BYTES, checkpoint_first: bool = False):
        self.next = number
        self.splitters = {STDOUT: LineSplitter(max_line), STDERR: LineSplitter(max_line)}
        self.started = {STDOUT: 0, STDERR: 0}
        self.since_checkpoint = CHECKPOINT_LINES if checkpoint_first else 0
        self.new_checkpoints: list[Checkpoint] = []

    def open(self) -> bool:
        """True while a line of either stream is open (its end not read yet)."""
        return any(s.partial or s.skipping for s in self.splitters.values())

    def feed(self, stream: int, stamp: bytes, content: bytes) -> list[StampedLine]:
        stream = STDERR if stream == STDERR else STDOUT  # docker sends no other stream in logs
        splitter = self.splitters[stream]
        if self.since_checkpoint >= CHECKPOINT_LINES and not self.open():
            self.new_checkpoints.append(Checkpoint(self.next, stream, stamp.decode()))
            self.since_checkpoint = 0
        if not splitter.partial and not splitter.skipping:
            self.started[stream] = stamp_ns(stamp) // 1_000_000
        texts = splitter.feed(content)
        if not texts:
            return []
        ms = self.started[stream]
        first = self.next
        self.next += len(texts)
        self.since_checkpoint += len(texts)
        return [StampedLine(text, first + i, ms) for i, text in enumerate(texts)]

    def flush(self) -> list[StampedLine]:
        """The open lines of both streams (the log ended)."""
        out = []
        for stream, splitter in self.splitters.items():
            for text in splitter.flush():
                out.append(StampedLine(text, self.next, self.started[stream]))
                self.next += 1
        return out


class MarkGone(Exception):
    """Docker no longer holds a checkpoint's message: its log rotated past it."""


def read_from(container: Any, checkpoint: Checkpoint | None, *, follow: bool, include_mark: bool = True):
    """A :class:`LogMessages` request and its messages from ``checkpoint``'s message on (itself
    included when ``include_mark``; None: from the start of docker's kept log). Iterating raises
    :class:`MarkGone` at once when docker no longer holds that message."""
    if checkpoint is None:
        messages = LogMessages(container, follow=follow)
        return messages, iter(messages)
    mark_ns = stamp_ns(checkpoint.stamp)
    messages = LogMessages(container, follow=follow, since_ns=mark_ns - SINCE_MARGIN_NS)
    return messages, _from_mark(messages, (checkpoint.stream, checkpoint.stamp.encode()), mark_ns, include_mark)


def _from_mark(messages, mark: tuple[int, bytes], mark_ns: int, include_mark: bool):
    iterator = iter(messages)
    first = True
    for message in iterator:
        stream, stamp, _ = message
        if (stream, stamp) == mark:
            if include_mark:
                yield message
            yield from iterator
            return
        if first and stamp_ns(stamp) > mark_ns:
            raise MarkGone(f"docker no longer holds the message of {stream} stamped {mark[1].decode()}")
        first = False


class Page(NamedTuple):
    oldest: int
    first: int
    lines: list[StampedLine]


def read_lines_before(
    container: Any, checkpoints: RedisCheckpoints, before: int, limit: int, *, max_line: int = MAX_LINE_BYTES
) -> Page:
    """Up to ``limit`` lines of ``container``'s console numbered below ``before``, read from the
    nearest checkpoint (:meth:`RedisCheckpoints.starts`; none yet: from the start of docker's kept
    log, as the first pump would, leaving checkpoints). ``oldest``: about the number of the first
    line that can still be read (lines docker rotated away, or older than the container's first
    checkpoint, cannot). ``first``: the number of ``lines[0]`` (``before`` when there are none).
    Raises the SDK's errors."""
    want = max(1, before - limit)
    starts: list[Checkpoint | None] = list(checkpoints.starts(want, before))
    if not starts and checkpoints.latest() is None:
        starts = [None]
    for index, checkpoint in enumerate(starts):
        number = checkpoint.number if checkpoint is not None else checkpoints.top() + 1
        numberer = Numberer(number, max_line=max_line, checkpoint_first=checkpoint is None)
        lines: deque[StampedLine] = deque(maxlen=limit)
        messages, iterator = read_from(container, checkpoint, follow=False)
        try:
            for stream, stamp, content in iterator:
                if numberer.next >= before:
                    break
                lines.extend(line for line in numberer.feed(stream, stamp, content) if line.n < before)
            else:
                lines.extend(line for line in numberer.flush() if line.n < before)
        except MarkGone:
            continue
        finally:
            messages.close()
            checkpoints.add(numberer.new_checkpoints)
        kept = [line for line in lines if want <= line.n < before]
        if checkpoint is None or index or checkpoint.number > want:
            oldest = number
        else:
            oldest = checkpoints.earliest()
        return Page(oldest, kept[0].n if kept else before, kept)
    return Page(before, before, [])


def container_lines(
    container: Any, checkpoints: RedisCheckpoints, *, max_line: int = MAX_LINE_BYTES
) -> list[StampedLine]:
    """Every line docker holds of ``container``'s console, as the console shows them (capped, one
    per ``\\n``, empty ones skipped), each with its console number (``n``) and docker's time
    (``ms``): numbered from the first of its checkpoints docker still holds (none kept but some
    given: after every number given, as a pump would number them; none given: from 1). For the
    archive kept when the container is removed and for a search of the whole output. Raises the
    SDK's errors."""
    known = {(c.stream, c.stamp.encode()): c.number for c in map(Checkpoint.parse, checkpoints.all())}
    numberer = Numberer(1, max_line=max_line)
    offset = None
    lines: list[StampedLine] = []
    messages = LogMessages(container, follow=False)
    try:
        for stream, stamp, content in messages:
            if offset is None and (stream, stamp) in known and not numberer.open():
                offset = known[stream, stamp] - numberer.next
            lines.extend(numberer.feed(stream, stamp, content))
        lines.extend(numberer.flush())
    finally:
        messages.close()
    if offset is None:
        offset = checkpoints.top() if known else 0
    return [StampedLine(line.text, line.n + offset, line.ms) for line in lines] if offset else lines


def container_output(
    container: Any, checkpoints: RedisCheckpoints, *, max_line: int = MAX_LINE_BYTES
) -> tuple[int, bytes, list[tuple[int, int, int]]]:
    """:func:`container_lines` as the archive keeps them: how many lines of the output came before
    them, their text (one per ``\\n``) and their times as runs ``(first number, count, ms)``
    (``agents.archive.write_archive``). Raises the SDK's errors."""
    lines = container_lines(container, checkpoints, max_line=max_line)
    runs: list[tuple[int, int, int]] = []
    for line in lines:
        if runs and runs[-1][2] == line.ms and runs[-1][0] + runs[-1][1] == line.n:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, line.ms)
        else:
            runs.append((line.n, 1, line.ms))
    before = lines[0].n - 1 if lines else 0
    return before, "".join(f"{line.text}\n" for line in lines).encode(), runs
