"""PID-reuse-safe probing of a VM's ``<chroot>/firecracker.pid``: is the VM running, and is the
process behind the pid really this chroot's firecracker (the only one that may be signalled)?
The checks, in order, and why the jailer's ``pivot_root`` makes the root check compare inodes:
docs/firecracker-adapter.md ("The pid probe").
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from .jail import open_vm_file

PID_FILE_NAME = "firecracker.pid"
VM_COMM = "firecracker"
#: A process that started more than this many seconds after its pid file was written is a recycled PID.
START_AFTER_PIDFILE_SLACK_S = 60.0


@dataclass(frozen=True)
class PidProbe:
    """Result of :func:`probe_vm_pid`.

    ``pid``: the number in the file (None when unreadable/implausible). ``running``: a process
    with that number exists and is not a recycled one. ``identity_confirmed``: it is this VM's
    firecracker process. ``reason``: one of ``no-pid-file``, ``bad-pid``, ``no-process``,
    ``recycled``, ``comm-mismatch``, ``root-mismatch``, ``confirmed``, ``confirmed-root-unreadable``.
    """

    pid: int | None
    running: bool
    identity_confirmed: bool
    reason: str


def _proc_start_epoch(stat_text: str) -> float | None:
    """Start time in epoch seconds from a ``/proc/<pid>/stat`` text (field 22, clock ticks since boot)."""
    try:
        after_comm = stat_text[stat_text.rindex(")") + 1 :].split()
        ticks = int(after_comm[19])  # field 22 is the 20th token after the comm
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (ValueError, IndexError, OSError):
        return None
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def _comm(stat_text: str) -> str:
    return stat_text[stat_text.find("(") + 1 : stat_text.rindex(")")]


def _root_matches(pid: int, chroot: Path) -> bool | None:
    """True/False when the process's root could be read; None when the link is unreadable."""
    link = f"/proc/{pid}/root"
    try:
        target = os.readlink(link)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            return None
        return False
    if os.path.normpath(target) == os.path.normpath(str(chroot)):
        return True
    try:
        a = os.stat(link)
        b = os.stat(chroot)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            return None
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def probe_vm_pid(chroot: str | os.PathLike) -> PidProbe:
    """Probe the process named by ``<chroot>/firecracker.pid`` (the four checks above).

    ``chroot``: the VM's jail root, ``<base>/firecracker/<id>/root``. Never raises for a missing or
    garbled file or a vanished process: those come back as ``running=False``.
    """
    chroot = Path(chroot)
    try:
        fd = open_vm_file(chroot / PID_FILE_NAME, os.O_RDONLY)
    except OSError:
        return PidProbe(None, False, False, "no-pid-file")  # missing, or refused (a link)
    try:
        text = os.read(fd, 64).decode("ascii", "replace").strip()
        mtime = os.fstat(fd).st_mtime
    except OSError:
        return PidProbe(None, False, False, "no-pid-file")
    finally:
        os.close(fd)
    try:
        pid = int(text)
    except ValueError:
        return PidProbe(None, False, False, "bad-pid")
    if pid <= 0:
        return PidProbe(None, False, False, "bad-pid")
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat_text = f.read()
    except OSError:
        return PidProbe(pid, False, False, "no-process")
    state = stat_text[stat_text.rindex(")") + 1 :].split()[:1]
    if state and state[0] in ("Z", "X"):
        return PidProbe(pid, False, False, "no-process")  # a zombie is over; only its parent's wait is pending
    start = _proc_start_epoch(stat_text)
    if start is not None and start > mtime + START_AFTER_PIDFILE_SLACK_S:
        return PidProbe(pid, False, False, "recycled")
    if _comm(stat_text) != VM_COMM:
        return PidProbe(pid, True, False, "comm-mismatch")
    root = _root_matches(pid, chroot)
    if root is None:
        return PidProbe(pid, True, True, "confirmed-root-unreadable")
    if not root:
        return PidProbe(pid, True, False, "root-mismatch")
    return PidProbe(pid, True, True, "confirmed")


def read_vm_pid(chroot: str | os.PathLike) -> int | None:
    """The PID only when it is provably this VM's firecracker process, else None (fails closed).

    The guard for signalling: ``destroy`` and ``reap_unowned`` SIGKILL only through it.
    """
    probe = probe_vm_pid(chroot)
    return probe.pid if probe.running and probe.identity_confirmed else None


def is_chroot_pid_running(chroot: str | os.PathLike) -> bool:
    """Whether the pid file names a running, non-recycled process, confirmed or not.

    The guard for the orphan reaper: it must never delete a chroot out from under a live process,
    even one whose identity it cannot claim.
    """
    return probe_vm_pid(chroot).running


def is_vm_process_alive(chroot: str | os.PathLike) -> bool:
    """Whether this VM's own firecracker process is up: :func:`read_vm_pid` plus signal 0."""
    pid = read_vm_pid(chroot)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_confirmed(chroot: str | os.PathLike, sig: int = signal.SIGKILL) -> int | None:
    """Send ``sig`` to the VM process only when its identity is confirmed; returns the PID signalled or None.

    The PID is pinned with a pidfd and re-probed before signalling, so a number recycled between the
    probe and the signal can never be hit.
    """
    pid = read_vm_pid(chroot)
    if pid is None:
        return None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    try:
        if read_vm_pid(chroot) != pid:
            return None
        signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        return None
    finally:
        os.close(fd)
    return pid
