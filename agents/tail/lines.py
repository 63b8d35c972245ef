"""Bytes to capped, non-empty lines (SPEC (i)): pure, no file or loop.

:class:`LineSplitter` holds the partial line across chunks; :func:`split_lines` runs it over a
finite sequence of chunks; :func:`lines_of` flattens an async iterator of line batches.
"""

from __future__ import annotations

import codecs
from collections.abc import AsyncIterator, Iterable, Sequence

MAX_LINE_BYTES = 65536
"""Longest logical line kept intact, in decoded characters (SPEC (i))."""

TRUNCATED_SUFFIX = " [truncated]"


class LineSplitter:
    """Turns a byte stream into capped, non-empty lines; the partial line never exceeds the cap.

    ``feed(data)`` takes bytes (any size, any split point, invalid UTF-8 allowed: replaced with
    U+FFFD) and returns the complete lines they finish, as a list of ``str``. ``flush()`` returns
    the pending partial line (and any undecodable tail bytes as U+FFFD), if any, and resets.
    ``peak_partial`` records the largest partial line ever held, in characters, for tests and
    benches. Used by :class:`FileTail` and by the docker log stream (``agents.streams``).
    """

    __slots__ = ("max_line", "_decoder", "_partial", "_skipping", "peak_partial")

    def __init__(self, max_line: int = MAX_LINE_BYTES):
        if max_line < 1:
            raise ValueError(f"max_line must be >= 1, got {max_line!r}")
        self.max_line = max_line
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""
        self._skipping = False
        self.peak_partial = 0

    @property
    def skipping(self) -> bool:
        """True while discarding the rest of an over-long logical line."""
        return self._skipping

    @property
    def partial(self) -> str:
        return self._partial

    def feed(self, data: bytes | bytearray) -> list[str]:
        if self._skipping:
            newline = data.find(b"\n")
            if newline < 0:
                return []
            data = data[newline + 1 :]
            self._skipping = False
            self._decoder.reset()
        text = self._decoder.decode(data)
        if not text:
            return []
        parts = text.split("\n")
        if self._partial:
            parts[0] = self._partial + parts[0]
            self._partial = ""
        rest = parts.pop()
        cap = self.max_line
        if parts:
            lines = list(filter(None, parts))
            if lines and max(map(len, lines)) > cap:
                lines = [line if len(line) <= cap else line[:cap] + TRUNCATED_SUFFIX for line in lines]
        else:
            lines = []
        if len(rest) > cap:
            # Over-long partial: emit now, discard the remainder of this logical line.
            lines.append(rest[:cap] + TRUNCATED_SUFFIX)
            self._skipping = True
            self._decoder.reset()
        else:
            self._partial = rest
            if len(rest) > self.peak_partial:
                self.peak_partial = len(rest)
        return lines

    def flush(self) -> list[str]:
        tail = self._decoder.decode(b"", final=True)
        text = "" if self._skipping else self._partial + tail
        self._partial = ""
        self._skipping = False
        self._decoder.reset()
        if not text:
            return []
        if len(text) > self.max_line:
            text = text[: self.max_line] + TRUNCATED_SUFFIX
        return [text]


def split_lines(chunks: Iterable[bytes], max_line: int = MAX_LINE_BYTES) -> list[str]:
    """Split a finite sequence of byte chunks with the tail's rules (cap, skip empties, flush).

    Convenience for tests and for callers holding a whole log in memory.
    """
    splitter = LineSplitter(max_line)
    out: list[str] = []
    for chunk in chunks:
        out.extend(splitter.feed(chunk))
    out.extend(splitter.flush())
    return out


async def lines_of(batches: AsyncIterator[Sequence[str]]) -> AsyncIterator[str]:
    """Yield each line of each batch of ``batches`` in order; closing this iterator (or ending
    it) closes ``batches`` too (:func:`agents.tail.tail_file`, ``agents.streams.docker_log_lines``)."""
    try:
        async for batch in batches:
            for line in batch:
                yield line
    finally:
        await batches.aclose()
