"""The boot watcher of a Firecracker VM: the jailer/VM-process exit watcher and the exit reason of
a failed spawn.

:func:`watch_boot` runs in a daemon thread per VM and calls ``abandon(agent_id, reason)`` when the
jailer, or the VM process it forked, exits while ``booting()`` still says the boot is not over.
:func:`boot_exit_reason` tells a spawn step that failed whether the VM's exit is the real cause.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .failure import read_failure_type
from .pidprobe import probe_vm_pid
from .settings import FirecrackerSettings


def release_thread_db() -> None:
    """Close this thread's database connections; for the backend's own threads (watcher, deadline)."""
    if threading.current_thread().name.startswith("fc-"):
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # noqa: BLE001 - no Django, or nothing to close
            pass


def boot_failure_from_disk(chroot: Path) -> tuple[str, str] | None:
    """``(detail, failure type)`` when the VM of ``chroot`` (a VM whose spawn returned, watched by
    no thread) no longer runs, else None. Reads only its pid file and serial log, so any process of
    the host can ask; the detail is the boot watcher's (``exit_text``, code 0: the jailer's parent
    exited once its child ran)."""
    probe = probe_vm_pid(chroot)
    if probe.running:
        return None
    serial = chroot / "serial-console.log"
    return exit_text(serial, 0, probe.pid), read_failure_type(serial)


def watch_boot(
    vm: Any, settings: FirecrackerSettings, booting: Callable[[], bool], abandon: Callable[[str, str], Any]
) -> None:
    """Abandon the spawn of ``vm`` (a ``backend.FirecrackerVm`` with its ``jailer`` launched) when
    the jailer, or the VM process it forked, exits before registration. ``booting()``: whether the
    boot is still watched (not registered, abandoned or being destroyed)."""
    try:
        _watch(vm, settings, booting, abandon)
    finally:
        release_thread_db()


def _watch(vm: Any, s: FirecrackerSettings, booting: Callable[[], bool], abandon: Callable[[str, str], Any]) -> None:
    rc = vm.jailer.wait()
    if rc != 0:
        time.sleep(s.exit_grace_s)
        if booting():
            abandon(vm.agent_id, exit_text(vm.layout.serial_log, rc, None))
        return
    # --new-pid-ns: the jailer's parent exits 0 once its child runs; follow that child instead.
    chroot, pid = vm.layout.chroot, None
    deadline = time.monotonic() + s.socket_wait_s
    while pid is None and time.monotonic() < deadline and booting():
        pid = probe_vm_pid(chroot).pid
        if pid is None:
            time.sleep(0.05)
    fd = None
    if pid is not None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            fd = None
        if fd is not None and not probe_vm_pid(chroot).running:  # pinned, but a zombie or a reused number
            os.close(fd)
            fd = None
    try:
        while fd is not None and booting():
            if select.select([fd], [], [], 0.25)[0]:
                break
    finally:
        if fd is not None:
            os.close(fd)
    if not booting():
        return
    time.sleep(s.exit_grace_s)
    if booting() and not probe_vm_pid(chroot).running:
        abandon(vm.agent_id, exit_text(vm.layout.serial_log, 0, pid))


def exit_text(serial_log: str | os.PathLike, rc: int, pid: int | None) -> str:
    """``jailer exited during boot (code N[, signal S][, firecracker pid P exited], <failureType>)``,
    the failure type read from the VM's ``serial_log``."""
    kind = read_failure_type(serial_log)
    how = f"code {rc}" if rc >= 0 else f"code null, signal {signal.Signals(-rc).name}"
    if rc == 0:
        how += f", firecracker pid {pid} exited" if pid else ", firecracker process not found"
    return f"jailer exited during boot ({how}, {kind})"


def boot_exit_reason(vm: Any, exit_grace_s: float) -> str | None:
    """Why a spawn step failed when the VM itself is the cause: its jailer or VM process exited.

    A guest that panics right after its API socket answered makes the next API call fail with
    ``Connection refused``; that error is only a consequence, so the exit is reported instead,
    as the boot watcher would. Waits up to ``exit_grace_s`` for an exiting process to be gone.
    None when the VM still runs (the error is the failure) or was never launched.
    """
    if vm.jailer is None:
        return None
    deadline = time.monotonic() + exit_grace_s
    while True:
        rc = vm.jailer.poll()
        if rc is not None and rc != 0:
            return exit_text(vm.layout.serial_log, rc, None)
        probe = probe_vm_pid(vm.layout.chroot)
        if rc == 0 and not probe.running:
            return exit_text(vm.layout.serial_log, 0, probe.pid)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
