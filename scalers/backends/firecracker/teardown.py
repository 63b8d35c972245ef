"""Failure and teardown paths of the Firecracker backend: ``abandon_spawn``, ``destroy``,
``reap_unowned`` (seed firecracker-backend.d.ts; SPEC h). Mixed into ``FirecrackerBackend``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from agents.choices import EventType
from network import netlink

from ..holders import remove_unless_held
from . import jail
from .api import FirecrackerApi
from .failure import read_failure_type
from .logs import forward_remaining
from .pidprobe import is_vm_process_alive, kill_confirmed

log = logging.getLogger(__name__)


class TeardownMixin:
    """Needs from the host class: ``settings``, ``name``, ``nft``, ``ip_allocator``, ``log_sink``,
    ``_lock``, ``_vms``, ``_emit``, ``tracked_ids``, ``chroot_dir``."""

    def abandon_spawn(self, agent_id: str, reason: str) -> bool:
        """Give up on a spawn from outside ``spawn``'s own flow (deadline, jailer exit) or from its catch.

        Idempotent: the first caller wins and returns True; later ones (and calls for an agent that
        is not tracked or is being destroyed) return False. Emits ``scaler.failed`` with ``reason``
        and the failure type read from the serial log, aborts in-flight API calls, and removes
        rules, TAP, IP, directory (now, or when the spawn thread unwinds if it is still running).
        """
        with self._lock:
            vm = self._vms.get(agent_id)
            if vm is None or vm.abandoned or vm.state == "destroying":
                return False
            vm.abandoned = True
            vm.failure_reason = reason
            vm.failure_type = read_failure_type(vm.layout.serial_log)
            cleanup_now = not vm.spawn_active
        log.warning("firecracker spawn of %s abandoned: %s", agent_id, reason)
        self._emit(agent_id, EventType.FAILED, reason, {"reason": reason, "failureType": vm.failure_type})
        vm.cancel.cancel(reason)
        if cleanup_now:
            self._cleanup_failed_spawn(vm)
        return True

    def _cleanup_failed_spawn(self, vm: Any) -> None:
        if vm.cleaned.is_set():
            return
        vm.cleaned.set()
        self._stop_vm_process(vm, graceful=False)
        if vm.logs is not None:
            vm.logs.stop()
        self._teardown(vm.agent_id, vm.ip, vm.tap if vm.tap_created else None, release=vm.ip is not None)
        jail.remove_vm_dir(self.settings.chroot_base_dir, vm.agent_id, self.settings.require_sudo)
        with self._lock:
            if self._vms.get(vm.agent_id) is vm:
                del self._vms[vm.agent_id]

    def _stop_vm_process(self, vm: Any, graceful: bool, chroot=None) -> None:
        chroot = chroot or vm.layout.chroot
        if graceful:
            # One budget of destroy_wait_s covers both the request and the wait for the exit, so a
            # slow API answer on a loaded host is not a failed shutdown.
            budget = self.settings.destroy_wait_s
            deadline = time.monotonic() + budget
            try:
                FirecrackerApi(str(jail.api_socket_path(chroot)), timeout=max(budget, 0.5)).send_ctrl_alt_del()
            except Exception as e:  # noqa: BLE001 - a dead or unresponsive VM is killed below
                level = logging.WARNING if is_vm_process_alive(chroot) else logging.INFO
                log.log(level, "SendCtrlAltDel to %s failed (%s); the VM is killed if it does not stop", chroot, e)
            while is_vm_process_alive(chroot) and time.monotonic() < deadline:
                time.sleep(0.2)
        killed = kill_confirmed(chroot)
        if killed is not None:
            if graceful:
                log.warning(
                    "VM in %s (pid %d) still ran %.1f s after Ctrl-Alt-Del: SIGKILL sent", chroot, killed, budget
                )
            deadline = time.monotonic() + 2
            while is_vm_process_alive(chroot) and time.monotonic() < deadline:
                time.sleep(0.05)
        jailer = vm.jailer if vm is not None else None
        if jailer is not None and jailer.poll() is None:
            jailer.kill()  # our own child: its identity is certain
            jailer.wait(5)

    def _allocation_rows(self) -> list[tuple[str, str, str]]:
        """``(ip, vm_id, scaler_name)`` of every address allocation (any scaler), from this backend's allocator."""
        return [(str(r.ip), r.vm_id, r.scaler_name) for r in self.ip_allocator.allocations()]

    def _remove_rules_unless_held(self, agent_id: str | None, ip: str, why: str) -> bool:
        """Delete ``ip``'s rules unless a sandbox other than VM ``agent_id`` holds it now (another
        allocation row, an active agent row: ``scalers.backends.holders``). True when deleted."""
        _, held = remove_unless_held(
            ip, self.nft.remove_agent, exclude=(agent_id or "",), allocations=self._allocation_rows, why=why
        )
        return not held

    def _teardown(self, agent_id: str, ip: str | None, tap: str | None, release: bool) -> None:
        """Remove a VM's rules (only while no other sandbox holds its address), TAP and (when
        ``release``) its IP row; each step logs and goes on."""
        steps: list[tuple[str, Callable[[], Any]]] = []
        if ip:
            steps.append(("rules", lambda: self._remove_rules_unless_held(agent_id, ip, f"teardown of {agent_id}")))
        if tap:
            steps.append(("tap", lambda: netlink.delete_link(tap, netns=self.settings.netns)))
        if release:
            steps.append(("ip", lambda: self.ip_allocator.release(agent_id)))
        for what, step in steps:
            try:
                step()
            except Exception:  # noqa: BLE001
                log.warning("teardown of %s for %s failed", what, agent_id, exc_info=True)

    def _owned_allocation(self, agent_id: str):
        row = next((r for r in self.ip_allocator.allocations(self.name) if r.vm_id == agent_id), None)
        return row

    def destroy(self, agent_id: str) -> bool:
        """Ctrl-Alt-Del, wait ≤ ``destroy_wait_s`` (200 ms polls), SIGKILL only a confirmed VM process,
        then rules, TAP, IP row and directory (SPEC h). Works for VMs spawned by another process
        (state re-derived from disk and the allocation row). Returns False when there was nothing."""
        with self._lock:
            vm = self._vms.get(agent_id)
            if vm is not None:
                if vm.state == "destroying":
                    return False
                vm.state = "destroying"
        chroot = self.chroot_dir(agent_id)
        row = self._owned_allocation(agent_id)
        if vm is None and row is None and not chroot.parent.exists():
            return False
        self._stop_vm_process(vm, graceful=True, chroot=chroot)
        if vm is not None and vm.logs is not None:
            vm.logs.stop()
        ip = vm.ip if vm is not None else (row.ip if row else None)
        tap = (vm.tap if vm.tap_created else None) if vm is not None else (row.tap_device if row else None)
        self._teardown(agent_id, ip, tap, release=ip is not None)
        jail.remove_vm_dir(self.settings.chroot_base_dir, agent_id, self.settings.require_sudo)
        with self._lock:
            if vm is not None and self._vms.get(agent_id) is vm:
                del self._vms[agent_id]
        return True

    def reap_unowned(self, agent_id: str) -> bool:
        """Force-reclaim a VM this backend does not track (SPEC h ``reapUnowned``; FC-16).

        False (nothing touched) when tracked or when ``<base>/firecracker/<id>`` does not exist.
        Otherwise forwards the remaining logs, SIGKILLs a confirmed VM process, removes rules, TAP
        and IP only when the allocation row names this scaler, always removes the directory: True.
        """
        if agent_id in self.tracked_ids():
            return False
        chroot = self.chroot_dir(agent_id)
        if not chroot.parent.is_dir():
            return False
        forward_remaining(agent_id, chroot / "serial-console.log", chroot / "vmm.log", self.log_sink)
        kill_confirmed(chroot)
        row = self._owned_allocation(agent_id)
        if row is not None:
            self._teardown(agent_id, row.ip, row.tap_device, release=True)
        jail.remove_vm_dir(self.settings.chroot_base_dir, agent_id, self.settings.require_sudo)
        return True
