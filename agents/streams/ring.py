"""The ``console.lines`` message and the packed ring entries that keep a stream's recent lines.

Pure: message dicts and msgpack blobs in, :class:`~agents.streams.lines.Line` lists out.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgpack

from .lines import Line

RING_LINES = 500
"""Lines kept per stream for viewers that join late (issue 7)."""


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
