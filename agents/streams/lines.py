"""Console lines, their levels and keys, failure flags and batch cutting (SPEC (h)): pure.

A :class:`Line` is one console row; :class:`StreamKey` names a console stream and its Channels
group; :func:`failure_indexes` flags serial-console failure lines; :func:`split_batches` cuts a
run of texts into publishable batches.
"""

from __future__ import annotations

import itertools
import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

BATCH_LINES = 1000
"""Most lines in one published batch."""

BATCH_CHARS = 256 * 1024
"""Most characters of text in one published batch (a 64 KiB line still fits alone)."""

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


_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,80}$")


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


def split_batches(
    texts: Sequence[str], max_lines: int = BATCH_LINES, max_chars: int = BATCH_CHARS
) -> list[Sequence[str]]:
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
