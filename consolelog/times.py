"""When a console line was received: the ``times`` key of each console stream in Redis.

Each pump records the time it read a batch as one ``first:count:ms`` entry of the sorted set
``kici:console:<agent_id>:<stream>:times``, scored by the batch's first line number
(``live.transport``). Whoever reads lines back by number (the lines endpoint, the search, the
archive kept at teardown) reads their times here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from .cap import count_lines, read_end_numbered

log = logging.getLogger(__name__)


def console_key_name(agent_id: str, stream: str, what: str, prefix: str = "kici:console") -> str:
    """The Redis key ``<prefix>:<agent_id>:<stream>:<what>`` of a console stream."""
    return f"{prefix}:{agent_id}:{stream}:{what}"


def times_of(entries: Iterable[bytes | str], first: int, stop: int) -> dict[int, int]:
    """``{line number: receive time in ms}`` for the lines ``[first, stop)`` that ``entries``
    (``times`` members, any order) cover."""
    out: dict[int, int] = {}
    for entry in entries:
        text = entry.decode() if isinstance(entry, bytes) else entry
        start, count, ms = (int(part) for part in text.split(":"))
        for number in range(max(start, first), min(start + count, stop)):
            out[number] = ms
    return out


def line_times(
    client: Any, agent_id: str, stream: str, first: int, stop: int, prefix: str = "kici:console"
) -> dict[int, int]:
    """Receive times (ms) of the lines ``[first, stop)`` of a stream, from its ``times`` key, with
    a synchronous ``redis.Redis`` ``client``. Lines no pump received live, or longer ago than the
    entries the key keeps, are absent."""
    name = console_key_name(agent_id, stream, "times", prefix)
    entries = client.zrevrangebyscore(name, first, "-inf", start=0, num=1)
    entries += client.zrangebyscore(name, f"({first}", f"({stop}")
    return times_of(entries, first, stop)


def end_with_times(fd: int, limit: int, client: Any, agent_id: str, stream: str) -> tuple[bytes, dict[int, int]]:
    """The kept end of the log file ``fd`` of console stream ``stream`` (at most ``limit`` bytes,
    ``consolelog.cap.read_end_numbered``) and the receive times of its lines, by their index in
    it (0: its first line; none when Redis cannot be read: the output matters more than its
    times). Raises ``OSError`` from reading."""
    first, data = read_end_numbered(fd, limit)
    count = count_lines(data) + (1 if data and not data.endswith(b"\n") else 0)
    try:
        times = line_times(client, agent_id, stream, first, first + count)
    except Exception as exc:  # noqa: BLE001 - a Redis error of any kind: keep the output without times
        log.warning("the times of %s %s are not kept: %s", agent_id, stream, exc)
        return data, {}
    return data, {number - first: ms for number, ms in times.items()}
