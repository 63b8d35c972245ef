"""Watching a VM's boot from the rq spawn job (SPEC h "abandonSpawn"; used by ``adapter``).

The Firecracker backend's boot watcher and log tail are threads of the process that ran
``spawn``. In the product that process is an rq work-horse, which exits when its job returns, so
the spawn job keeps running until the boot is over: :func:`await_registration` polls the agent
row while the watcher thread looks at the VM process.

This module holds the per-process registry of spawns being watched (:func:`track`,
:func:`untrack`, :func:`live`), :class:`WatchedBackend` (the backend with the product's row
checks and the release after cleanup) and :func:`await_registration`.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .backend import FirecrackerBackend

#: Serial-console lines attached to a ``scaler.failed`` detail (SPEC d).
CAPTURED_LINES = 50
#: Seconds between two looks at the agent row (cancellation, registration).
POLL_SECONDS = 0.2
#: Seconds a finished wait lets a running cleanup complete before the job returns.
CLEANUP_WAIT_SECONDS = 20.0

_LIVE: dict[str, WatchedBackend] = {}
_LIVE_LOCK = threading.Lock()


def track(agent_id: str, backend: WatchedBackend) -> None:
    """Record that ``backend`` (in this process) watches the boot of ``agent_id``."""
    with _LIVE_LOCK:
        _LIVE[agent_id] = backend


def untrack(agent_id: str, backend: WatchedBackend) -> None:
    """Forget ``agent_id`` if ``backend`` is the one watching it."""
    with _LIVE_LOCK:
        if _LIVE.get(agent_id) is backend:
            del _LIVE[agent_id]


def live(agent_id: str) -> WatchedBackend | None:
    """The backend instance of this process watching ``agent_id``'s boot, or None."""
    with _LIVE_LOCK:
        return _LIVE.get(agent_id)


def agent_state(agent_id: str) -> str | None:
    """The agent row's state (``agents.choices.AgentState`` value), None when there is no row."""
    from agents.models import Agent

    return Agent.objects.filter(agent_id=agent_id).values_list("state", flat=True).first()


def serial_tail(path: str | os.PathLike, lines: int = CAPTURED_LINES) -> list[str]:
    """The last ``lines`` non-blank lines of a serial log (read from its last 64 KiB); [] when unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            data = f.read()
    except OSError:
        return []
    return list(deque((ln for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()), maxlen=lines))


class WatchedBackend(FirecrackerBackend):
    """``FirecrackerBackend`` with the product's checks around a failed spawn.

    ``abandon_spawn`` after ``spawn`` returned (the boot watcher, the registration deadline) first
    reads the agent row: a registered agent's VM (``running``/``draining``), or one another path
    already ends (``destroying``/``destroyed``/``failed``), is left alone: no ``scaler.failed``, no
    cleanup, the watcher stops. ``_cleanup_failed_spawn`` calls ``on_cleaned(agent_id)`` once the
    failed spawn's rules, TAP, IP row and directory are gone (the adapter releases the reservation).
    """

    on_cleaned: Callable[[str], None] | None = None

    def abandon_spawn(self, agent_id: str, reason: str) -> bool:
        vm = self.get(agent_id)
        if vm is not None and not vm.spawn_active:
            if agent_state(agent_id) in ("running", "draining", "destroying", "destroyed", "failed"):
                self.mark_registered(agent_id)
                return False
        return super().abandon_spawn(agent_id, reason)

    def _cleanup_failed_spawn(self, vm: Any) -> None:
        super()._cleanup_failed_spawn(vm)
        if self.on_cleaned is not None:
            self.on_cleaned(vm.agent_id)

    def detach(self, agent_id: str) -> None:
        """Stop watching a VM whose boot is over (registered, or ended by someone else): the watcher
        goes quiet, the log tail stops, the registry forgets it. The VM itself is untouched."""
        vm = self.get(agent_id)
        self.mark_registered(agent_id)
        if vm is not None and vm.logs is not None:
            vm.logs.stop(2)
        untrack(agent_id, self)

    def wait_cleaned(self, agent_id: str, timeout: float = CLEANUP_WAIT_SECONDS) -> bool:
        """Wait until a failed spawn's cleanup removed it from tracking; False on timeout."""
        deadline = time.monotonic() + timeout
        while self.get(agent_id) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.get(agent_id) is None


def await_registration(
    backend: WatchedBackend, agent_id: str, deadline: float | None, on_deadline: Callable[[], str]
) -> str:
    """Poll the agent row every :data:`POLL_SECONDS` until the boot of ``agent_id`` is over.

    ``deadline``: epoch seconds or None. At the deadline ``on_deadline()`` is called and its text
    becomes the abandon reason (``scaler.failed``). Returns ``spawned`` (the row is running or
    draining), ``failed`` (the VM died during boot or the deadline passed; cleanup has finished)
    or ``cancelled`` (the row left ``spawning`` otherwise; whoever changed it tears the VM down).
    """
    vm = backend.get(agent_id)
    try:
        while True:
            if vm is None or backend.get(agent_id) is not vm or vm.abandoned:
                backend.wait_cleaned(agent_id)
                return "failed"
            state = agent_state(agent_id)
            if state in ("running", "draining"):
                backend.detach(agent_id)
                return "spawned"
            if state != "spawning":
                backend.detach(agent_id)
                return "cancelled"
            if deadline is not None and time.time() >= deadline:
                backend.abandon_spawn(agent_id, on_deadline())
                continue
            vm.cleaned.wait(POLL_SECONDS)
    finally:
        untrack(agent_id, backend)
