"""Opening a file below a trusted directory without following a symbolic link on the way.

For a privileged process reading or writing files in directories a less trusted user can write
(a VM's chroot): a link planted there must not make it read or write a file elsewhere, such as
``/etc/shadow``. ``top`` is resolved as usual (it is the operator's directory); every component
below it is opened relative to its parent's descriptor with ``O_NOFOLLOW``, so neither a swapped
directory nor a swapped file redirects the open, whatever is renamed between two steps. The file
opened must be a regular file: a planted FIFO (which would block a reader) or device is refused.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Sequence


class UnsafePathError(OSError):
    """``path`` was refused: one of its components is a symbolic link, or it is not a regular file."""

    def __init__(self, path: str, reason: str):
        super().__init__(errno.ELOOP, reason, path)
        self.path, self.reason = path, reason

    def __str__(self) -> str:
        return f"refusing to open {self.path}: {self.reason}"


def _refusal(dir_fd: int, name: str, shown: str, path: str, err: OSError) -> OSError:
    """The error for a failed step: :class:`UnsafePathError` when ``name`` is a link or not a directory."""
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except OSError:
        return err
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            target = "?"
        return UnsafePathError(path, f"{shown} is a symbolic link (to {target!r}); links here are never followed")
    if err.errno in (errno.ENOTDIR, errno.ELOOP):
        return UnsafePathError(path, f"{shown} is not a directory")
    return err


def open_beneath(top: str | os.PathLike, parts: Sequence[str], flags: int, mode: int = 0o644) -> int:
    """A descriptor of ``top/parts[0]/.../parts[-1]`` opened with ``flags`` (plus ``O_NOFOLLOW``,
    ``O_CLOEXEC``), never following a symbolic link below ``top``.

    ``parts``: single path components (no ``/``, not ``..``). ``mode``: for ``O_CREAT``. Raises
    :class:`UnsafePathError` naming the path when a component is a symbolic link or the file is not
    a regular file, ``ValueError`` for a bad component, and the ``OSError`` of the failed step
    otherwise (``FileNotFoundError``, ``FileExistsError`` with ``O_EXCL``).
    """
    parts = list(parts)
    if not parts or any(not p or "/" in p or p in (".", "..") for p in parts):
        raise ValueError(f"path components {parts!r} must be single names below {os.fspath(top)!r}")
    path = os.path.join(os.fspath(top), *parts)
    dir_fd = os.open(top, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(parts[:-1]):
            shown = os.path.join(os.fspath(top), *parts[: i + 1])
            try:
                next_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except OSError as e:
                raise _refusal(dir_fd, name, shown, path, e) from None
            os.close(dir_fd)
            dir_fd = next_fd
        # O_NONBLOCK: opening a planted FIFO returns at once (and is refused below) instead of hanging.
        all_flags = flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
        try:
            fd = os.open(parts[-1], all_flags, mode, dir_fd=dir_fd)
        except OSError as e:
            raise _refusal(dir_fd, parts[-1], path, path, e) from None
    finally:
        os.close(dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePathError(path, "it is not a regular file")
    if not flags & os.O_NONBLOCK:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def open_last(path: str | os.PathLike, depth: int, flags: int, mode: int = 0o644) -> int:
    """:func:`open_beneath` for ``path`` whose last ``depth`` components are walked without
    following links (the directory above them is trusted). Raises as :func:`open_beneath`, and
    ``ValueError`` when ``path`` has fewer components."""
    parts = os.path.normpath(os.fspath(path)).split(os.sep)
    if depth < 1 or len(parts) <= depth:
        raise ValueError(f"path {os.fspath(path)!r} has no {depth} components below a directory")
    top = os.sep.join(parts[:-depth]) or os.sep
    return open_beneath(top, parts[-depth:], flags, mode)
