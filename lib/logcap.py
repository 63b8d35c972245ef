"""Holding a log file another process keeps writing to a size cap, in place, and reading what is kept.

The writers are processes this console does not control, and not all of them append: firecracker
opens its VMM log read-write without ``O_APPEND``, so truncating or renaming the file under it
would leave its next write at its old offset (a file as long as before) or in a file nobody reads.
:func:`cap_file` instead frees the file's beginning with ``fallocate(FALLOC_FL_PUNCH_HOLE)``: the
writer's offset and every reader's offset stay valid, the file's size still counts every byte ever
written, but only its end (from a line start) keeps disk blocks. The bytes between the last freed
block and that line start read as NUL bytes.

Readers skip what was freed: :func:`data_start` is where the kept output begins at or after an
offset, :func:`leading_cut` the NUL bytes a read that starts there must drop, :func:`read_end` the
kept end of a file. ``lib.tail.FileTail`` follows a capped file with them.
"""

from __future__ import annotations

import ctypes
import errno
import os

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
#: How far past the cut :func:`cap_file` looks for a line start, in bytes (beyond: cut mid-line).
LINE_SEARCH_BYTES = 256 * 1024

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
    while True:
        first = data_start(fd)
        size = os.fstat(fd).st_size
        start = data_start(fd, max(offset, size - limit, 0))
        if start >= size:
            return b""
        data = os.pread(fd, size - start, start)
        if data_start(fd) == first:
            return data[leading_cut(data, first) :]


def cap_file(fd: int, cap: int) -> int:
    """When ``fd`` (open read-write) holds more than ``cap`` bytes of output, free all but its last
    ``cap // 2`` bytes, cut at the first line start in them (within :data:`LINE_SEARCH_BYTES`, else
    mid-line); returns the bytes freed (0 when under the cap). At most ``cap // 2`` bytes plus one
    block keep storage afterwards. Raises ``ValueError`` for a ``cap`` below 2 and the ``OSError``
    of :func:`punch_hole`."""
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
    punch_hole(fd, start, cut - start)
    return cut - start
