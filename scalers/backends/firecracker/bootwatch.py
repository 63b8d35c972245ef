"""Watching a VM's boot: the jailer/VM-process exit watcher and the exit reason of a failed spawn
(seed firecracker-backend.d.ts ``abandonSpawn`` triggers; SPEC h). Mixed into ``FirecrackerBackend``."""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from typing import Any

from .failure import read_failure_type
from .pidprobe import probe_vm_pid


def release_thread_db() -> None:
    """Close this thread's database connections; for the backend's own threads (watcher, deadline)."""
    if threading.current_thread().name.startswith("fc-"):
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # noqa: BLE001 - no Django, or nothing to close
            pass


class BootWatchMixin:
    """Needs from the host class: ``settings``, ``_lock``, ``_vms``, ``abandon_spawn``."""

    def _booting(self, vm: Any) -> bool:
        with self._lock:
            return (
                self._vms.get(vm.agent_id) is vm and not vm.abandoned and not vm.registered and vm.state != "destroying"
            )

    def _watch_boot(self, vm: Any) -> None:
        """Abandon the spawn when the jailer, or the VM process it forked, exits before registration."""
        try:
            self._watch_boot_inner(vm)
        finally:
            release_thread_db()

    def _watch_boot_inner(self, vm: Any) -> None:
        s = self.settings
        rc = vm.jailer.wait()
        if rc != 0:
            time.sleep(s.exit_grace_s)
            if self._booting(vm):
                self.abandon_spawn(vm.agent_id, self._exit_text(vm, rc, None))
            return
        # --new-pid-ns: the jailer's parent exits 0 once its child runs; follow that child instead.
        chroot, pid = vm.layout.chroot, None
        deadline = time.monotonic() + s.socket_wait_s
        while pid is None and time.monotonic() < deadline and self._booting(vm):
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
            while fd is not None and self._booting(vm):
                if select.select([fd], [], [], 0.25)[0]:
                    break
        finally:
            if fd is not None:
                os.close(fd)
        if not self._booting(vm):
            return
        time.sleep(s.exit_grace_s)
        if self._booting(vm) and not probe_vm_pid(chroot).running:
            self.abandon_spawn(vm.agent_id, self._exit_text(vm, 0, pid))

    def _exit_text(self, vm: Any, rc: int, pid: int | None) -> str:
        """``jailer exited during boot (code N[, signal S][, firecracker pid P exited], <failureType>)``
        (SPEC h abandonSpawn), the failure type read from the serial log."""
        kind = read_failure_type(vm.layout.serial_log)
        how = f"code {rc}" if rc >= 0 else f"code null, signal {signal.Signals(-rc).name}"
        if rc == 0:
            how += f", firecracker pid {pid} exited" if pid else ", firecracker process not found"
        return f"jailer exited during boot ({how}, {kind})"

    def _boot_exit_reason(self, vm: Any) -> str | None:
        """Why a spawn step failed when the VM itself is the cause: its jailer or VM process exited.

        A guest that panics right after its API socket answered makes the next API call fail with
        ``Connection refused``; that error is only a consequence, so the exit is reported instead,
        as the boot watcher would (SPEC h). Waits up to ``exit_grace_s`` for an exiting process to
        be gone. None when the VM still runs (the error is the failure) or was never launched.
        """
        if vm.jailer is None:
            return None
        deadline = time.monotonic() + self.settings.exit_grace_s
        while True:
            rc = vm.jailer.poll()
            if rc is not None and rc != 0:
                return self._exit_text(vm, rc, None)
            probe = probe_vm_pid(vm.layout.chroot)
            if rc == 0 and not probe.running:
                return self._exit_text(vm, 0, probe.pid)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
