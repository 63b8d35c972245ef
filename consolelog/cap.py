"""Holding a log file another process keeps writing to a size cap, in place, and reading what is kept.

The writers are not ours and not all of them append, so :func:`cap_file` frees the file's
beginning with ``fallocate(FALLOC_FL_PUNCH_HOLE)`` instead of truncating or renaming it: every
offset stays valid. Readers skip what was freed (:func:`data_start`, :func:`leading_cut`,
:func:`read_end`), and a line keeps its number across cuts (:func:`cut_lines`,
:func:`line_number_at`, under ``flock``). Design: docs/live-streams.md ("Agent output on disk",
"Line numbers and times").
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
#: How far past the cut :func:`cap_file` looks for a line start, in bytes (beyond: cut mid-line).
LINE_SEARCH_BYTES = 256 * 1024

#: Extended attribute of a capped file: how many lines its cuts freed, as ASCII digits.
CUT_LINES_XATTR = "user.kici.cut-lines"
#: Bytes read at a time while counting lines.
COUNT_CHUNK_BYTES = 1024 * 1024

_NEWLINE_RUNS = re.compile(rb"\n{2,}")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free ``length`` bytes of ``fd`` (open for writing) from ``offset``, keeping its size: whole
    blocks lose their storage, the rest read as NUL bytes. Raises ``OSError`` (``EOPNOTSUPP`` on a
    filesystem without hole punching, ``EBADF`` for a descriptor not open for writing)."""
    if _libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def data_start(fd: int, offset: int = 0) -> int:
    """The first byte at or after ``offset`` that has storage (``SEEK_DATA``): ``offset`` itself
    unless it lies in a freed range; the file's size when nothing after it has. Leaves the file
    position moved (callers use ``pread``)."""
    try:
        return os.lseek(fd, offset, os.SEEK_DATA)
    except OSError as e:
        if e.errno == errno.ENXIO:
            return max(offset, os.fstat(fd).st_size)
        raise


def leading_cut(data: bytes, first: int) -> int:
    """How many NUL bytes at the start of ``data`` are the zeroed rest of a cut rather than output,
    given ``first``, the file's :func:`data_start` from 0: all of them when the file's beginning
    was freed (``first > 0``), else 0."""
    if first == 0 or not data.startswith(b"\0"):
        return 0
    return len(data) - len(data.lstrip(b"\0"))


def read_end(fd: int, limit: int, offset: int = 0) -> bytes:
    """The kept bytes of ``fd`` from ``offset`` to its end, at most its last ``limit``: a freed
    range and the zeroed bytes of a cut are skipped, so what is returned after a cut starts at a
    line start. A read that a cut raced (the file's first kept byte moved meanwhile) is done again.
    Raises ``OSError`` from reading."""
    return _read_end(fd, limit, offset)[1]


def _read_end(fd: int, limit: int, offset: int = 0) -> tuple[int, bytes]:
    """:func:`read_end` and the offset its bytes start at."""
    while True:
        first = data_start(fd)
        size = os.fstat(fd).st_size
        start = data_start(fd, max(offset, size - limit, 0))
        if start >= size:
            return size, b""
        data = os.pread(fd, size - start, start)
        if data_start(fd) == first:
            skip = leading_cut(data, first)
            return start + skip, data[skip:]


def read_end_numbered(fd: int, limit: int) -> tuple[int, bytes]:
    """:func:`read_end` of ``fd`` and the number of its first line (the line its first byte is
    in: a part of a line when the read starts inside one), as the console numbers the file's
    lines (:func:`line_number_at`). Costs a count of the kept bytes before it."""
    with numbering_lock(fd):
        start, data = _read_end(fd, limit)
        kept = kept_start(fd)
        return cut_lines(fd) + (count_file_lines(fd, kept, start) if start > kept else 0) + 1, data


def cap_file(fd: int, cap: int) -> int:
    """When ``fd`` (open read-write) holds more than ``cap`` bytes of output, free all but its last
    ``cap // 2`` bytes, cut at the first line start in them (within :data:`LINE_SEARCH_BYTES`, else
    mid-line); returns the bytes freed (0 when under the cap). At most ``cap // 2`` bytes plus one
    block keep storage afterwards. The lines freed are added to :data:`CUT_LINES_XATTR` first, so
    the kept lines keep their numbers. Raises ``ValueError`` for a ``cap`` below 2 and the
    ``OSError`` of :func:`punch_hole` or of writing the attribute (a filesystem without user
    extended attributes)."""
    if cap < 2:
        raise ValueError(f"cap {cap!r} must be at least 2 bytes")
    size = os.fstat(fd).st_size
    start = data_start(fd, 0)
    if size - start <= cap:
        return 0
    keep_from = size - cap // 2
    window = os.pread(fd, min(LINE_SEARCH_BYTES, size - keep_from), keep_from)
    newline = window.find(b"\n")
    cut = keep_from + newline + 1 if 0 <= newline < len(window) - 1 else keep_from
    with numbering_lock(fd, exclusive=True):
        # A line the cut splits is not counted: its kept rest is read as a line of its own.
        freed = count_file_lines(fd, kept_start(fd), cut)
        before = cut_lines(fd)
        os.setxattr(fd, CUT_LINES_XATTR, str(before + freed).encode())
        try:
            punch_hole(fd, start, cut - start)
        except OSError:
            os.setxattr(fd, CUT_LINES_XATTR, str(before).encode())  # nothing was freed
            raise
    return cut - start


def count_lines(data: bytes, at_line_start: bool = True) -> int:
    """How many non-empty lines end (with ``\\n``) in ``data``; ``at_line_start``: the byte before
    ``data`` was a newline (or there was none), so a leading newline ends an empty line. The rule
    of ``consolelog.tail.LineSplitter``, which skips empty lines."""
    total = data.count(b"\n")
    if not total:
        return 0
    empty = sum(m.end() - m.start() - 1 for m in _NEWLINE_RUNS.finditer(data))
    if at_line_start and data[:1] == b"\n":
        empty += 1
    return total - empty


def cut_lines(fd: int) -> int:
    """The lines the cuts of ``fd`` freed (:data:`CUT_LINES_XATTR`; 0 when it was never cut)."""
    try:
        return int(os.getxattr(fd, CUT_LINES_XATTR))
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP):
            return 0
        raise


@contextlib.contextmanager
def numbering_lock(fd: int, *, exclusive: bool = False):
    """Hold ``flock`` on ``fd`` while a cut frees lines (exclusive) or a reader numbers them."""
    fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def count_file_lines(fd: int, start: int, end: int, at_line_start: bool = True) -> int:
    """Non-empty lines ending in ``fd``'s bytes ``[start, end)``, read :data:`COUNT_CHUNK_BYTES`
    at a time (``start`` at or after :func:`kept_start`)."""
    count = 0
    offset = start
    while offset < end:
        data = os.pread(fd, min(COUNT_CHUNK_BYTES, end - offset), offset)
        if not data:
            break
        count += count_lines(data, at_line_start)
        at_line_start = data[-1:] == b"\n"
        offset += len(data)
    return count


def kept_start(fd: int) -> int:
    """Where the kept output of ``fd`` begins: past a freed range and the NUL bytes of a cut."""
    first = data_start(fd)
    if first == 0:
        return 0
    head = os.pread(fd, 4096, first)
    return first + leading_cut(head, first)


def line_number_at(fd: int, offset: int) -> int:
    """The number of the first line that starts at or after ``offset`` in ``fd``: the lines cuts
    freed, plus the non-empty lines that end before ``offset``, plus one; plus one more when
    ``offset`` lies inside a non-empty line (a tail starting there skips that line's rest). Call
    under :func:`numbering_lock`."""
    start = kept_start(fd)
    if offset <= start:
        return cut_lines(fd) + 1
    number = cut_lines(fd) + count_file_lines(fd, start, offset) + 1
    before = os.pread(fd, 1, offset - 1)
    if before not in (b"\n", b"") and offset > start:
        number += 1
    return number
