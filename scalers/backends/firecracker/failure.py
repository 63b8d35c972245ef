"""Serial-console failure detection: which lines are errors, and why a VM failed to boot.

Pure functions: classify a line or a whole log; wrap non-JSON serial lines as ``{level, message}``;
and :func:`read_failure_type`, which reads the serial log through ``jail.open_vm_file``.
"""

from __future__ import annotations

import json
import logging
import os

from consolelog.cap import read_end

from .jail import open_vm_file

log = logging.getLogger(__name__)

#: Fragments that make a guest's output line an error (any case). The live console highlights
#: the same lines (``live.streams`` reads this list), so the two cannot drift apart.
FAILURE_PATTERNS = (
    "Kernel panic",
    "Failed to execute /init",
    "failed to start",
    "systemd[1]: Failed",
    "VFS: Unable to mount root fs",
    "not syncing",
)
_FAILURE_PATTERNS_LOWER = tuple(p.lower() for p in FAILURE_PATTERNS)

KERNEL_PANIC = "kernel-panic"
INIT_FAILURE = "init-failure"
ROOTFS_MOUNT_FAILURE = "rootfs-mount-failure"
UNKNOWN = "unknown"

#: Most specific first: a real rootfs failure also prints "Kernel panic - not syncing: VFS: ...",
#: and a missing /init ends in "Kernel panic - not syncing: No working init found".
_TYPE_ORDER = (
    ("vfs: unable to mount root fs", ROOTFS_MOUNT_FAILURE),
    ("failed to execute /init", INIT_FAILURE),
    ("kernel panic", KERNEL_PANIC),
)

#: How much of the end of the serial log :func:`read_failure_type` inspects (bytes).
TAIL_BYTES = 1024 * 1024


def is_failure_line(line: str) -> bool:
    """True when ``line`` matches one of :data:`FAILURE_PATTERNS` (case-insensitive)."""
    low = line.lower()
    return any(p in low for p in _FAILURE_PATTERNS_LOWER)


def classify_failure(text: str) -> str:
    """Failure type of a serial log text: ``rootfs-mount-failure``, ``init-failure``, ``kernel-panic``
    or ``unknown``, checked most specific first."""
    low = text.lower()
    for fragment, kind in _TYPE_ORDER:
        if fragment in low:
            return kind
    return UNKNOWN


def read_failure_type(serial_log: str | os.PathLike) -> str:
    """Classify the last :data:`TAIL_BYTES` of a serial log file; ``unknown`` if it cannot be read
    (a link in its place is refused, with a warning naming it)."""
    try:
        fd = open_vm_file(serial_log, os.O_RDONLY)
    except FileNotFoundError:
        return UNKNOWN
    except OSError as e:
        log.warning("cannot read the failure type: %s", e)
        return UNKNOWN
    try:
        data = read_end(fd, TAIL_BYTES)
    except OSError:
        return UNKNOWN
    finally:
        os.close(fd)
    return classify_failure(data.decode("utf-8", errors="replace"))


def wrap_serial_line(line: str) -> dict:
    """A JSON-object line is passed through as parsed; any other line becomes
    ``{"level": "error"|"debug", "message": line}`` with ``error`` on a failure pattern."""
    stripped = line.strip()
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            return obj
    return {"level": "error" if is_failure_line(line) else "debug", "message": line}
