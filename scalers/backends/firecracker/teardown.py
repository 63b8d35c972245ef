"""The teardown of a Firecracker VM: stop its process, remove its rules, TAP, IP row and directory.

Every step works from disk (the chroot and its pid file) and the allocation rows, so a process
other than the one that spawned the VM can tear it down. The order (process first, then the
network, then the directory) is the caller's: ``FirecrackerBackend`` runs it for a failed spawn,
a destroy and a reap.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from django.conf import settings as django_settings

from agents.archive import ARCHIVE_BYTES, archive_parts
from consolelog.times import end_with_times
from network import netlink

from . import jail
from .api import FirecrackerApi
from .pidprobe import is_vm_process_alive, kill_confirmed
from .rules import RuleWriter
from .settings import FirecrackerSettings

log = logging.getLogger(__name__)


class Teardown:
    """Tears down the VMs of one scaler (``settings``) through ``rules`` and ``ip_allocator``
    (``network.ipalloc_db.DbIpAllocator``)."""

    def __init__(self, settings: FirecrackerSettings, rules: RuleWriter, ip_allocator: Any):
        self.settings = settings
        self.rules = rules
        self.ip_allocator = ip_allocator

    def stop_vm_process(self, chroot: Path, jailer: subprocess.Popen | None, graceful: bool) -> None:
        """Stop the VM process of ``chroot``: with ``graceful``, Ctrl-Alt-Del and wait up to
        ``destroy_wait_s`` (200 ms polls); then SIGKILL a still running, confirmed VM process, and
        kill ``jailer`` (this process's own child) if it still runs."""
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
        if jailer is not None and jailer.poll() is None:
            jailer.kill()  # our own child: its identity is certain
            jailer.wait(5)

    def remove_network(self, agent_id: str, ip: str | None, tap: str | None, release: bool) -> None:
        """Remove a VM's rules (only while no other sandbox holds its address), TAP and (when
        ``release``) its IP row; each step logs and goes on."""
        steps: list[tuple[str, Callable[[], Any]]] = []
        if ip:
            steps.append(("rules", lambda: self.rules.remove_unless_held(agent_id, ip, f"teardown of {agent_id}")))
        if tap:
            steps.append(("tap", lambda: netlink.delete_link(tap, netns=self.settings.netns)))
        if release:
            steps.append(("ip", lambda: self.ip_allocator.release(agent_id)))
        for what, step in steps:
            try:
                step()
            except Exception:
                log.warning("teardown of %s for %s failed", what, agent_id, exc_info=True)

    def owned_allocation(self, agent_id: str):
        """The allocation row of ``agent_id`` when it names this scaler, else None."""
        return next((r for r in self.ip_allocator.allocations(self.settings.name) if r.vm_id == agent_id), None)

    def remove_vm_dir(self, agent_id: str) -> bool:
        """Keep the VM's output (:meth:`archive_output`), then ``rm -rf <chrootBaseDir>/firecracker/<id>``
        (``jail.remove_vm_dir``)."""
        self.archive_output(agent_id)
        return jail.remove_vm_dir(self.settings.chroot_base_dir, agent_id, self.settings.require_sudo)

    def archive_output(self, agent_id: str) -> None:
        """The ends of the VM's serial console and VMM log, as its archive (``agents.archive``),
        with the times their lines were received (``consolelog.times.end_with_times``). Each file
        is opened without following a link (``jail.open_vm_file``); a refused or missing one is
        left out, a failure is logged, never a reason to keep the VM dir."""
        layout = jail.ChrootLayout.for_agent(self.settings.chroot_base_dir, agent_id)
        parts = []
        times = []
        client = redis.Redis.from_url(django_settings.REDIS_URL)
        try:
            for title, path, stream in (
                ("serial console", layout.serial_log, "serial"),
                ("VMM log", layout.vmm_log, "vmm"),
            ):
                try:
                    fd = jail.open_vm_file(path, os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        data, stamps = end_with_times(fd, ARCHIVE_BYTES, client, agent_id, stream)
                    finally:
                        os.close(fd)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    log.warning("output of %s not kept from %s: %s", agent_id, path, exc)
                    continue
                parts.append((title, data))
                times.append(stamps)
        finally:
            client.close()
        try:
            archive_parts(agent_id, parts, times)
        except (OSError, ValueError) as exc:
            log.warning("could not keep the output of %s: %s", agent_id, exc)
