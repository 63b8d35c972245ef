"""Watching a VM's boot from the rq spawn job.

The Firecracker backend's boot watcher and log tail are threads of the process that ran
``spawn``. In the product that process is an rq work-horse, which exits when its job returns, so
the spawn job keeps running until the boot is over: :func:`await_registration` polls the agent
row while the watcher thread looks at the VM process.

This module holds the per-process registry of spawns being watched (:func:`track`,
:func:`untrack`, :func:`live`), the agent-row check a backend of the product asks before it
abandons a booted VM (:func:`boot_over`) and :func:`await_registration`.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable

from agents.models import Agent

from .backend import FirecrackerBackend
from .jail import open_vm_file

#: Serial-console lines attached to a ``scaler.failed`` detail.
CAPTURED_LINES = 50
#: Seconds between two looks at the agent row (cancellation, registration).
POLL_SECONDS = 0.2
#: Agent-row states in which a booted VM is no longer the spawn's to fail: registered
#: (``running``/``draining``), or ended by another path (``destroying``/``destroyed``/``failed``).
BOOT_OVER_STATES = ("running", "draining", "destroying", "destroyed", "failed")

_LIVE: dict[str, FirecrackerBackend] = {}
_LIVE_LOCK = threading.Lock()


def track(agent_id: str, backend: FirecrackerBackend) -> None:
    """Record that ``backend`` (in this process) watches the boot of ``agent_id``."""
    with _LIVE_LOCK:
        _LIVE[agent_id] = backend


def untrack(agent_id: str, backend: FirecrackerBackend) -> None:
    """Forget ``agent_id`` if ``backend`` is the one watching it."""
    with _LIVE_LOCK:
        if _LIVE.get(agent_id) is backend:
            del _LIVE[agent_id]


def live(agent_id: str) -> FirecrackerBackend | None:
    """The backend instance of this process watching ``agent_id``'s boot, or None."""
    with _LIVE_LOCK:
        return _LIVE.get(agent_id)


def agent_state(agent_id: str) -> str | None:
    """The agent row's state (``agents.choices.AgentState`` value), None when there is no row."""
    return Agent.objects.filter(agent_id=agent_id).values_list("state", flat=True).first()


def boot_over(agent_id: str) -> bool:
    """True when the agent row says the boot of ``agent_id`` is over (:data:`BOOT_OVER_STATES`):
    its VM is then left alone (no ``scaler.failed``, no cleanup) and its watcher stops."""
    return agent_state(agent_id) in BOOT_OVER_STATES


def serial_tail(path: str | os.PathLike, lines: int = CAPTURED_LINES) -> list[str]:
    """The last ``lines`` non-blank lines of a serial log (read from its last 64 KiB, through
    ``jail.open_vm_file``); [] when unreadable or refused (a link in its place)."""
    try:
        fd = open_vm_file(path, os.O_RDONLY)
    except OSError:
        return []
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, min(size, 65536), max(0, size - 65536))
    except OSError:
        return []
    finally:
        os.close(fd)
    return list(deque((ln for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()), maxlen=lines))


def await_registration(
    backend: FirecrackerBackend, agent_id: str, deadline: float | None, on_deadline: Callable[[], str]
) -> str:
    """Poll the agent row every :data:`POLL_SECONDS` until the boot of ``agent_id`` is over.

    ``deadline``: epoch seconds or None. At the deadline ``on_deadline()`` is called and its text
    becomes the abandon reason (``scaler.failed``). Returns ``spawned`` (the row is running or
    draining), ``failed`` (the VM died during boot or the deadline passed; the cleanup has finished
    unless it outlasted ``backend.wait_cleaned``) or ``cancelled`` (the row left ``spawning``
    otherwise; whoever changed it tears the VM down). Stops watching in every case.
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
