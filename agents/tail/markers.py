"""The in-band markers a bounded tail queues in place of what it left out (SPEC (i))."""

from __future__ import annotations

DROP_MARKER_PREFIX = "[dropped "


class DropMarker(str):
    """The in-band ``[dropped N lines]`` head marker; a ``str`` whose ``count`` is N.

    A distinct type rather than a prefix test, so a guest printing ``[dropped 5 lines]`` itself
    is counted as an ordinary line and cannot reset the count (the reference tests the prefix).
    """

    count: int

    def __new__(cls, count: int) -> DropMarker:
        marker = super().__new__(cls, f"{DROP_MARKER_PREFIX}{count} lines]")
        marker.count = count
        return marker


class SkipMarker(str):
    """``[skipped N bytes]``: a paced tail (``FileTail(pace=True, max_lag_bytes=...)``) jumped
    over ``skipped`` bytes it had fallen behind by. Not part of SPEC (i); see :class:`agents.tail.FileTail`."""

    skipped: int

    def __new__(cls, skipped: int) -> SkipMarker:
        marker = super().__new__(cls, f"[skipped {skipped} bytes]")
        marker.skipped = skipped
        return marker
