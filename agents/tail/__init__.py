"""Bounded tail of an append-only log file (seed ``file-tail.d.ts``, SPEC (i)).

The guest of a microVM writes to its serial console unprivileged, so every byte this module
buffers is tenant-controlled. Every buffer is bounded and an overflow is reported in-band:

* a logical line longer than :data:`MAX_LINE_BYTES` is emitted as its first ``MAX_LINE_BYTES``
  characters followed by ``" [truncated]"``; when the overflow is seen before the newline (a
  guest running ``yes | tr -d '\\n' > /dev/console``) the truncated line is emitted at once and
  the rest of that logical line is discarded, without decoding it, up to the next newline;
* the file is read at most :data:`MAX_READ_BYTES` per slice, and a waiting burst is drained slice
  after slice without waiting for the next poll;
* at most :data:`MAX_QUEUED_LINES` complete lines wait for the consumer; on overflow the oldest
  are dropped and a single head marker ``[dropped N lines]`` carries the cumulative count.

Choice (SPEC (i) says "measured on the decoded string, despite the name"): the line cap counts
**decoded characters**, like the reference, so a line of 65,536 four-byte characters is kept whole
(at most 256 KiB of text). The partial-line buffer therefore never holds more than 65,536
characters, whatever the byte stream.

Lines are split on ``"\\n"`` only (a ``"\\r"`` before it is kept, as in the reference); empty
lines are skipped.

Modules: :mod:`~agents.tail.lines` (bytes to capped lines), :mod:`~agents.tail.markers` (the in-band
markers), :mod:`~agents.tail.queue` (the bounded queue), :mod:`~agents.tail.file` (following a file
on disk). Every public name is importable from ``agents.tail``.
"""

from .file import MAX_READ_BYTES, POLL_INTERVAL, FileTail, tail_file
from .lines import MAX_LINE_BYTES, TRUNCATED_SUFFIX, LineSplitter, lines_of, split_lines
from .markers import DROP_MARKER_PREFIX, DropMarker, SkipMarker
from .queue import MAX_QUEUED_LINES, LineQueue, take_oldest

__all__ = [
    "DROP_MARKER_PREFIX",
    "MAX_LINE_BYTES",
    "MAX_QUEUED_LINES",
    "MAX_READ_BYTES",
    "POLL_INTERVAL",
    "TRUNCATED_SUFFIX",
    "DropMarker",
    "FileTail",
    "LineQueue",
    "LineSplitter",
    "SkipMarker",
    "lines_of",
    "split_lines",
    "tail_file",
    "take_oldest",
]
