"""What carries a :class:`~live.hub.ConsoleHub`: in one process, or across processes on Redis.

:class:`LocalTransport` keeps everything in memory (unit tests, single-process tools);
:class:`RedisTransport` sends batches through the Channels Redis layer and keeps the pump lock,
the ring and the viewer register in plain Redis keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from consolelog.times import console_key_name, times_of

from .streams import RING_LINES, Line, StreamKey, lines_from_blobs, lines_from_message, ring_blob

log = logging.getLogger(__name__)

Listener = Callable[[dict], None]


def deliver_to(listeners: dict[str, list[Listener]], message: dict) -> None:
    """Call every listener of ``message["group"]`` with ``message``; a listener that raises is
    logged and the others still run (one broken listener must not starve the others)."""
    group = message.get("group")
    if group is None:
        return
    for callback in list(listeners.get(group, ())):
        try:
            callback(message)
        except Exception:
            log.exception("console listener failed")


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
    async def line_times(self, key: StreamKey, first: int, stop: int) -> dict[int, int]: ...
    async def aclose(self) -> None: ...


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
        self.times: dict[StreamKey, deque[str]] = {}

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
        entry = times_member(message)
        if entry is not None:
            self.times.setdefault(key, deque(maxlen=TIMES_KEPT)).append(entry[1])
        self.deliver(message)

    def deliver(self, message: dict) -> None:
        deliver_to(self._listeners, message)

    async def send_group(self, group: str, message: dict) -> None:
        self.deliver({**message, "group": group})

    async def snapshot(self, key):
        return self._gens.get(key), list(self._rings.get(key, ()))

    async def line_times(self, key, first, stop):
        return times_of(self.times.get(key, ()), first, stop)

    async def aclose(self):
        self._listeners.clear()


TIMES_KEPT = 20000
"""Batches whose receive time is kept per stream, for the lines read back from the file."""


def times_member(message: dict) -> tuple[int, str] | None:
    """The ``times`` entry of a ``console.lines`` message: ``(first live line, "first:count:ms")``,
    or None when none of its lines was received live (``born``)."""
    born = message.get("born", 0)
    count = len(message["texts"]) - born
    if count <= 0:
        return None
    first = message["seq"] + born
    return first, f"{first}:{count}:{round(message['ts'] * 1000)}"


def stream_key_name(key: StreamKey, what: str, prefix: str = "kici:console") -> str:
    """The Redis key ``<prefix>:<agent_id>:<stream>:<what>`` of a console stream
    (``consolelog.times.console_key_name``)."""
    return console_key_name(key.agent_id, key.stream, what, prefix)


# Append one packed batch to the ring, then drop the oldest entries while the rest still holds
# at least ARGV[3] lines; record the batch's receive time (KEYS[3], when ARGV[5] is not empty),
# keeping the last ARGV[7] entries. KEYS: ring, counts, times. ARGV: blob, its line count, ring
# size, ttl seconds, times score, times member, times kept.
_RING_PUSH = """
if ARGV[5] ~= '' then
  redis.call('zadd', KEYS[3], ARGV[5], ARGV[6])
  redis.call('zremrangebyrank', KEYS[3], 0, -tonumber(ARGV[7]) - 1)
  redis.call('expire', KEYS[3], ARGV[4])
end
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
_RENEW = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
)
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


class RedisTransport:
    """Channels Redis layer + Redis keys: batches between processes, one pump per key cluster-wide.
    ``layer``: a ``channels_redis`` layer; ``redis``: a ``redis.asyncio.Redis`` client. A batch
    crosses Redis once per process, and the ring is written before the batch is sent, so a viewer that
    reads the snapshot after joining misses nothing. The keys: docs/console-log.md ("A stream's Redis
    keys").
    """

    def __init__(
        self,
        layer: Any,
        redis: Any,
        *,
        lock_ttl: float = 6.0,
        viewer_ttl: float = 15.0,
        ring_size: int = RING_LINES,
        prefix: str = "kici:console",
    ):
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
        return stream_key_name(key, what, self.prefix)

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
            except Exception:  # Redis hiccup: retry, do not kill the relay
                log.warning("console relay: receive failed, retrying", exc_info=True)
                await asyncio.sleep(1)
                continue
            self.deliver(message)
            await asyncio.sleep(0)  # let the viewers' writers run between two batches

    def deliver(self, message: dict) -> None:
        deliver_to(self._listeners, message)

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
        score, member = times_member(message) or ("", "")
        await self._ring_push(
            keys=[self._key(key, "ring"), self._key(key, "ring-counts"), self._key(key, "times")],
            args=[blob, count, self.ring_size, 86400, score, member, TIMES_KEPT],
        )
        await self.layer.group_send(message["group"], message)

    async def send_group(self, group: str, message: dict) -> None:
        await self.layer.group_send(group, {**message, "group": group})

    async def snapshot(self, key):
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.get(self._key(key, "gen"))
            pipe.lrange(self._key(key, "ring"), 0, -1)
            gen, blobs = await pipe.execute()
        return (int(gen) if gen is not None else None), lines_from_blobs(blobs, self.ring_size)

    async def line_times(self, key, first, stop):
        """``consolelog.times.line_times`` (the same read, asynchronous)."""
        name = self._key(key, "times")
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrevrangebyscore(name, first, "-inf", start=0, num=1)
            pipe.zrangebyscore(name, f"({first}", f"({stop}")
            before, inside = await pipe.execute()
        return times_of([*before, *inside], first, stop)

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
